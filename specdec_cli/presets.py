"""Presets: configs/*.toml, overridden by a model folder's own `specdec_presets.toml` (the demo
pair ships thresholds calibrated for its vocabulary), overridden by a `--presets FILE` (what
`specdec calibrate` writes), overridden by explicit flags."""

from __future__ import annotations

import difflib
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

PRESET_KEYS = ("threshold", "k", "uncertainty", "verify")
# The meaning gate's two thresholds (verify = "meaning"; DecodingConfig fields). The gate itself is
# the file's `[gate]` table (GATE_TABLE), read by gate_presets.py in the service layer: this module
# sits below the engine and only checks its keys.
GATE_KEYS = ("gate_upload", "gate_verify")
GATE_TABLE = "gate"
# What a `[gate]` table may hold (gate_presets.gate_toml writes them); anything else is a typo.
GATE_TABLE_KEYS = ("kind", "description", "instruction", "system", "tokenizer", "default", "ids", "weights")
# Other settings a presets file may hold (sampling and the prompt); `specdec presets` lists them
# after the description. Any DecodingConfig knob flags also set could go here.
EXTRA_KEYS = ("sample", "temperature", "top_p", "top_k", "seed", "instruction", "system")
_KEYS = PRESET_KEYS + GATE_KEYS + EXTRA_KEYS
# What a preset's table (or a configs/*.toml file) may hold: a key outside it is a typo, refused
# (a misspelled `treshold` silently ignored decodes with another threshold than the user wrote).
ALLOWED_KEYS = ("description",) + _KEYS
# A [gate] table lists at most one weight per vocabulary entry; the widest released vocabularies
# are ~262k entries (Qwen2.5-Omni's: 152,064). A longer table is refused before anything else
# (issue 33: one of 10 M ids, a 119 MB file, took > 300 s and 1.65 GB to parse).
MAX_GATE_IDS = 1 << 18
# A presets file is read whole by tomllib (pure Python, ~1.5 MB/s): its size is checked first. A
# [gate] table of MAX_GATE_IDS ids as `specdec calibrate` writes it takes 7.4 MB.
MAX_PRESETS_BYTES = 8 << 20


def configs_dir() -> Path:
    """configs/ beside the package (source checkout / editable install), else the copy a wheel
    installs under <prefix>/share/specdec/configs."""
    for candidate in (Path(__file__).resolve().parents[1] / "configs", Path(sys.prefix) / "share" / "specdec" / "configs"):
        if candidate.is_dir():
            return candidate
    raise InputError("cannot find the presets folder configs/; reinstall specdec")


@dataclass(frozen=True)
class Preset:
    name: str
    values: dict            # subset of PRESET_KEYS + EXTRA_KEYS
    source: str             # where the values came from
    description: str = ""


def read_toml(path: Path) -> dict:
    """A presets file parsed, after its size is checked (MAX_PRESETS_BYTES): InputError, one line."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PRESETS_BYTES + 1)
        if len(raw) > MAX_PRESETS_BYTES:
            raise InputError(f"presets file {path} is over {MAX_PRESETS_BYTES >> 20} MB: a presets file holds a few "
                             f"presets and at most one [{GATE_TABLE}] table of {MAX_GATE_IDS:,} ids (one per "
                             "vocabulary entry); rewrite it with `specdec calibrate`")
        return tomllib.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"cannot read presets file {path}: {exc}") from exc


def _read(path: Path, layered: bool = True) -> dict:
    """The file's presets, every key checked. `layered`: a model folder's or --presets file (one
    [name] table per preset); else a configs/*.toml file (one preset, its keys at the top)."""
    data = read_toml(path)
    if not layered:
        _check_keys(data, path, "")
        return data
    for name, table in data.items():
        if not isinstance(table, dict):
            raise InputError(f"presets file {path}: {name!r} is outside any preset; put it under the table of "
                             f"the preset it sets, e.g. [quality]")
        if name == GATE_TABLE:
            _check_keys(table, path, f" in [{name}]", GATE_TABLE_KEYS, "a [gate] table takes")
        else:
            _check_keys(table, path, f" in [{name}]")
    return data


def presets_of(data: dict) -> dict:
    """A layered file's presets: its tables but the `[gate]` table (not a preset)."""
    return {name: table for name, table in data.items() if name != GATE_TABLE}


def _check_keys(table: dict, path: Path, where: str, allowed: Sequence[str] = ALLOWED_KEYS,
                takes: str = "a preset takes") -> None:
    for key in table:
        if key not in allowed:
            near = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"{takes} {', '.join(allowed)}"
            raise InputError(f"presets file {path}: unknown key {key!r}{where}; {hint}")


def shown(path: Path) -> str:
    """A path as a user would type it: relative to the working directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# One presets file, or several layered in order (None entries skipped): the model folder's, then --presets.
PresetFiles = Path | Sequence[Path | None] | None


def layered_files(files: PresetFiles) -> list[Path]:
    if files is None:
        return []
    if isinstance(files, Path):
        return [files]
    return [f for f in files if f is not None]


def check_presets_file(path: Path | None) -> Path | None:
    """A --presets FILE: it must exist and parse (InputError otherwise), before any model loads."""
    if path is None:
        return None
    if not path.is_file():
        raise InputError(f"presets file not found: {path} (write one with `specdec calibrate`)")
    _read(path)
    return path


def load_presets(model_presets: PresetFiles = None) -> dict[str, Preset]:
    """All presets by name. Each file given (a model folder's, then a --presets file) replaces the
    values it names."""
    presets: dict[str, Preset] = {}
    for path in sorted(configs_dir().glob("*.toml")):
        data = _read(path, layered=False)
        presets[path.stem] = Preset(path.stem, {k: data[k] for k in _KEYS if k in data},
                                    f"configs/{path.name}", data.get("description", ""))
    for path in layered_files(model_presets):
        for name, table in presets_of(_read(path)).items():
            base = presets.get(name, Preset(name, {}, "", ""))
            values = {**base.values, **{k: table[k] for k in _KEYS if k in table}}
            presets[name] = Preset(name, values, shown(path), table.get("description", base.description))
    return presets


def resolve(name: str, model_presets: PresetFiles = None) -> Preset:
    presets = load_presets(model_presets)
    if name not in presets:
        raise InputError(f"unknown preset {name!r}; choose one of: {', '.join(sorted(presets))}")
    return presets[name]
