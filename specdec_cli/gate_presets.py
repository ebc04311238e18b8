"""The meaning gate in a presets file: a `[gate]` table beside the presets, as plain TOML.

    [gate]
    kind = "meaning"
    description = "..."
    instruction = "请用一句中文描述说话人的…"     # the task it was fitted on
    system = "You are a helpful assistant."
    tokenizer = "0123456789abcdef"              # remote.wire.tokenizer_fingerprint of its tokenizer
    default = 1.0                               # the weight of every id not listed
    ids = [104, 105, ...]                       # token ids ...
    weights = [0.1035, 0.2378, ...]             # ... and their meaning weights, in [0, 1]

A preset uses it with `verify = "meaning"` and its two thresholds, `gate_upload` and `gate_verify`
(DecodingConfig fields). A presets file without a `[gate]` table, or a gate fitted on another task
or tokenizer, leaves verify="meaning" presets on the entropy gate (their `threshold`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .decoding.gate import MeaningGate
from .errors import InputError
from .presets import GATE_KEYS as PRESET_GATE_KEYS  # the keys a preset may hold for the gate (besides verify)
from .presets import GATE_TABLE as TABLE
from .presets import GATE_TABLE_KEYS, MAX_GATE_IDS, PresetFiles, layered_files, read_toml

__all__ = ["PRESET_GATE_KEYS", "TABLE", "gate_file", "gate_id", "gate_toml", "load_gate", "load_gates", "parse_gate",
           "meaning_preset_lines", "preset_gate_lines"]


def _string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's: \\", \\\\, \\n, \\uXXXX)."""
    return json.dumps(text, ensure_ascii=False)


def gate_toml(gate: MeaningGate, description: str = "", width: int = 16) -> str:
    """The `[gate]` table for `gate` (ids in order, `width` per line)."""
    ids = sorted(gate.weights)

    def rows(values: Sequence[str]) -> str:
        lines = [", ".join(values[i:i + width]) for i in range(0, len(values), width)]
        return "[\n    " + ",\n    ".join(lines) + ",\n]" if lines else "[]"

    out = [f"[{TABLE}]", 'kind = "meaning"']
    if description:
        out.append(f"description = {_string(description)}")
    out += [f"instruction = {_string(gate.instruction)}", f"system = {_string(gate.system)}",
            f"tokenizer = {_string(gate.tokenizer)}", f"default = {float(gate.default)!r}",
            f"ids = {rows([str(t) for t in ids])}",
            f"weights = {rows([repr(float(gate.weights[t])) for t in ids])}"]
    return "\n".join(out) + "\n"


def parse_gate(table: Mapping[str, Any], source: str = "presets file") -> MeaningGate:
    """The gate a `[gate]` table describes; InputError (one line, naming `source`) when malformed."""
    def bad(what: str) -> InputError:
        return InputError(f"bad [{TABLE}] table in {source}: {what}; rewrite it with `specdec calibrate`")

    unknown = [key for key in table if key not in GATE_TABLE_KEYS]
    if unknown:
        raise bad(f"unknown key {unknown[0]!r} (it takes {', '.join(GATE_TABLE_KEYS)})")
    if table.get("kind", "meaning") != "meaning":
        raise bad(f"kind must be \"meaning\", got {table.get('kind')!r}")
    ids, weights = table.get("ids", []), table.get("weights", [])
    if not isinstance(ids, list) or not isinstance(weights, list) or len(ids) != len(weights):
        raise bad("ids and weights must be two lists of the same length")
    if len(ids) > MAX_GATE_IDS:  # before any per-id check: at most one weight per vocabulary entry
        raise bad(f"{len(ids):,} ids, more than any vocabulary has (at most {MAX_GATE_IDS:,})")
    if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in ids) or len(set(ids)) != len(ids):
        raise bad("ids must be distinct non-negative integers")
    if any(not isinstance(w, int | float) or isinstance(w, bool) or not (0.0 <= w <= 1.0) for w in weights):
        raise bad("weights must be numbers between 0 and 1")
    default = table.get("default", 1.0)
    if not isinstance(default, int | float) or isinstance(default, bool) or not (0.0 <= default <= 1.0):
        raise bad(f"default must be a number between 0 and 1, got {default!r}")
    instruction, system, tokenizer = table.get("instruction"), table.get("system"), table.get("tokenizer", "")
    for key, text in (("instruction", instruction), ("system", system)):
        if not isinstance(text, str) or not text.strip():
            raise bad(f"{key} must be the text of the task the gate was fitted on")
    if not isinstance(tokenizer, str):
        raise bad("tokenizer must be a fingerprint string")
    return MeaningGate({int(t): float(w) for t, w in zip(ids, weights, strict=True)}, float(default),
                       instruction, system, tokenizer)


def load_gate(path: Path | None, tokenizer: str | None = None) -> MeaningGate | None:
    """The `[gate]` table of a presets file, as a gate; None when the file has none or the gate was
    fitted with another tokenizer than `tokenizer` (a fingerprint; None: not checked), so the
    presets fall back to the entropy gate. InputError when the file or the table is malformed."""
    if path is None:
        return None
    data = read_toml(path)
    table = data.get(TABLE)
    if table is None:
        return None
    if not isinstance(table, dict):
        raise InputError(f"bad [{TABLE}] in {path}: it must be a table")
    gate = parse_gate(table, str(path))
    if tokenizer and gate.tokenizer and gate.tokenizer != tokenizer:
        return None
    return gate


def load_gates(files: PresetFiles, tokenizer: str | None = None) -> MeaningGate | None:
    """The gate of layered presets files (the model folder's, then --presets): the last file
    holding a `[gate]` table wins, as a later file's presets replace an earlier one's; None when
    none holds one, or that gate was fitted with another tokenizer (the entropy gate then)."""
    return load_gate(gate_file(files), tokenizer)


def gate_file(files: PresetFiles) -> Path | None:
    """The last of the layered presets files that holds a `[gate]` table (None: none does)."""
    chosen: Path | None = None
    for path in layered_files(files):
        data = read_toml(path)
        if TABLE in data:
            chosen = path
    return chosen


def gate_id(gate: MeaningGate) -> str:
    """A short fingerprint of the gate's weights and task (records' settings carry it, so a batch
    resumes a clip only when the same gate described it)."""
    import hashlib

    return hashlib.sha256(gate_toml(gate).encode("utf-8")).hexdigest()[:16]


def preset_gate_lines(upload: float, verify: float) -> list[str]:
    """A preset's lines for the meaning gate (calibrate writes them under the preset's table)."""
    def num(x: float) -> str:
        return "inf" if math.isinf(x) else repr(float(x))

    return ['verify = "meaning"', f"gate_upload = {num(upload)}", f"gate_verify = {num(verify)}"]


def meaning_preset_lines(name: str, description: str, k: int, uncertainty: str, threshold: float, upload: float,
                         verify: float, comments: Sequence[str] = ()) -> list[str]:
    """A meaning-gate preset's table (`frugal`, as calibrate and bench/gate.py write it): its
    `threshold` is the entropy gate's, used where the `[gate]` does not apply (another task or
    tokenizer); `comments` follow as `# ...` lines."""
    thr = "inf" if math.isinf(threshold) else repr(float(threshold))
    return [f"[{name}]", f"description = {_string(description)}", f"k = {k}", f'uncertainty = "{uncertainty}"',
            f"threshold = {thr}  # the entropy gate's, for another task or tokenizer",
            *preset_gate_lines(upload, verify), *(f"# {c}" for c in comments)]
