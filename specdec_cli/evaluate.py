"""Evaluation: score descriptions by the canonical phrases, run several modes over labelled clips,
aggregate accuracy and cost per mode, and write the report (JSON + Markdown).

Layers: `score` and `sentence_valid` judge one text; `summarize` turns per-clip records into one
row per mode; `run_eval` drives the models (through `Describer`, so every mode is measured the way
`describe` and `batch` measure it); `build_report` / `write_report` produce the files. Nothing here
prints: the command (commands/eval.py) owns the terminal.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .decoding.config import DecodingConfig
from .describe import Describer, describe_many
from .errors import InputError, SpecdecError, one_line
from .inputs import Skipped, read_all
from .inputs import clips as count_clips
from .metrics import immediate_repeats
from .phrases import ATTRIBUTES, agreement, predict
from .presets import PresetFiles, load_presets, resolve
from .records import build_record, modelled_latency
from .strict_json import json_safe

if TYPE_CHECKING:
    import numpy as np

    from .describe import Description, Outcome
    from .pair import Pair

SENTENCE_ENDS = "。！？"
MODE_NAMES = ("edge", "cloud", "fluent", "quality", "always")
BASELINE = "cloud"  # speedups are against cloud-only: the system we are trying to undercut


# -- scoring one description ---------------------------------------------------------------------

def sentence_valid(text: str | None) -> bool:
    """Exactly one sentence: ends with one of 。！？ and holds no other sentence end."""
    if not text:
        return False
    text = text.strip()
    return text[-1] in SENTENCE_ENDS and not any(c in SENTENCE_ENDS for c in text[:-1])


def score(description: str | None, labels: dict[str, str] | None) -> dict[str, Any]:
    """Judge one description against its labels. An attribute is correct when exactly one of its
    phrases occurs and it is the labelled one: two phrases (ambiguous) or none (missing) are wrong.
    An attribute the labels leave out (the labeller found it ambiguous, or it was not known) is not
    judged: its `correct` is None, and `all_correct` asks only of the labelled ones. Without labels
    (None) there is nothing to be correct against: `correct` and `all_correct` are None."""
    predicted = predict(description or "")
    correct = None if labels is None else \
        {attr: (predicted[attr] is not None and predicted[attr] == labels[attr]) if attr in labels else None
         for attr in ATTRIBUTES}
    return {
        "predicted": predicted,
        "correct": correct,
        "all_correct": all(v for v in correct.values() if v is not None) if correct is not None else None,
        "valid": sentence_valid(description),
        "immediate_repeats": immediate_repeats(description or ""),
    }


# -- labels and clips ----------------------------------------------------------------------------

@dataclass(frozen=True)
class LabelledClip:
    file: str               # as written in the labels file (relative to the clips folder)
    path: Path
    # attribute -> canonical phrase, for the attributes labelled (at least one; the labeller,
    # demo.measure, leaves an ambiguous one out); None: not labelled at all (eval without labels)
    labels: dict[str, str] | None


@dataclass(frozen=True)
class Labels:
    """A labels file read: the clips with at least one attribute labelled, and the files whose line
    labels none (every attribute ambiguous): left out of the scoring, and said in a note."""

    clips: list[LabelledClip]
    unlabelled: list[str]


def unlabelled_clips(directory: Path) -> tuple[list[LabelledClip], list[Skipped]]:
    """Every audio file of `directory` (as `batch` finds them), without labels: eval then scores
    agreement with cloud-only instead of accuracy; and the entries the walk skipped (a FIFO, a
    dangling link, ...) with the reason."""
    from .results import find_audio

    found = find_audio(directory)
    return ([LabelledClip(str(p.relative_to(directory)), p, None) for p in found.files],
            [Skipped(p, why) for p, why in found.skipped])


def labels_file(labels_path: Path, directory: Path) -> Labels:
    """Parse labels.jsonl (`{"file": ..., "labels": {attr: phrase}}` per line). Every line must name
    a clip and give each attribute it labels a canonical phrase. An attribute may be left out, as
    `python -m specdec_cli.demo.measure` leaves out the ones it finds ambiguous: each attribute is
    then scored over the clips labelled for it (`summarize`, calibrate's quality), and the counts
    say how many were left out. A line that labels no attribute has nothing to score: that clip is
    left out (`Labels.unlabelled`). A bad line is refused up front, before models load. A clip
    that is missing or unreadable is not the labels' fault: it is kept here and skipped, with the
    others of its kind, by the input policy (inputs.check_clips)."""
    if not labels_path.is_file():
        raise InputError(f"labels file not found: {labels_path}")
    if not directory.is_dir():
        raise InputError(f"clips folder not found: {directory}")
    clips: list[LabelledClip] = []
    unlabelled: list[str] = []
    for n, line in enumerate(labels_path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{labels_path}:{n}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not isinstance(entry.get("labels"), dict):
            raise InputError(f'{where}: expected {{"file": "x.wav", "labels": {{...}}}}')
        labels = entry["labels"]
        for attr, phrases in ATTRIBUTES.items():
            if attr in labels and labels[attr] not in phrases:
                leave = "; leave the attribute out to not score it" if labels[attr] is None else ""
                raise InputError(f"{where}: {attr} label {labels[attr]!r} is not one of {' · '.join(phrases)}{leave}")
        given = {a: labels[a] for a in ATTRIBUTES if a in labels}
        if given:
            clips.append(LabelledClip(entry["file"], directory / entry["file"], given))
        else:
            unlabelled.append(entry["file"])
    if not clips:
        raise InputError(f"{labels_path} lists no clip with a label" if unlabelled else f"{labels_path} lists no clips")
    return Labels(clips, unlabelled)


def read_labels(labels_path: Path, directory: Path) -> list[LabelledClip]:
    """The clips of a labels file with at least one attribute labelled (`labels_file`)."""
    return labels_file(labels_path, directory).clips


def attribute_counts(labels: Sequence[dict[str, str] | None]) -> dict[str, dict[str, int]]:
    """Per attribute, how many of the clips (their labels) it is scored on and how many leave it out."""
    n = len(labels)
    scored = {a: sum(1 for lab in labels if lab is not None and a in lab) for a in ATTRIBUTES}
    return {a: {"scored": k, "left_out": n - k} for a, k in scored.items()}


def left_out_line(counts: dict[str, dict[str, int]]) -> str | None:
    """'rate 2, volume 3 of 9 clips': the attributes left out of some clips, or None when none is."""
    out = [f"{a} {c['left_out']}" for a, c in counts.items() if c["left_out"]]
    if not out:
        return None
    n = next(iter(counts.values()))
    return f"{', '.join(out)} of {count_clips(n['scored'] + n['left_out'])}"


# -- modes ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EvalMode:
    name: str                 # "edge", "fluent", "t=3.25" (a sweep point; unique per threshold)
    cfg: DecodingConfig
    preset: str | None = None
    sweep: bool = False


def parse_modes(text: str, presets: Container[str] = ()) -> list[str]:
    """The mode names of --modes: MODE_NAMES, or any other preset by name (`presets`: the presets
    in effect), run as a speculative mode."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODE_NAMES and m not in presets]
    if unknown or not names:
        others = [p for p in sorted(presets) if p not in MODE_NAMES] if isinstance(presets, dict) else []
        raise InputError(f"unknown mode(s) {', '.join(unknown) or '(none)'}; choose from "
                         f"{','.join([*MODE_NAMES, *others])}")
    return list(dict.fromkeys(names))


def parse_sweep(text: str) -> list[float]:
    """`threshold=a:b:n` -> n evenly spaced thresholds from a to b (inclusive)."""
    name, _, spec = text.partition("=")
    parts = spec.split(":")
    if name.strip() != "threshold" or len(parts) != 3:
        raise InputError(f"bad --sweep {text!r}; use threshold=START:STOP:COUNT, e.g. threshold=1:8:8")
    try:
        start, stop, count = float(parts[0]), float(parts[1]), int(parts[2])
    except ValueError:
        raise InputError(f"bad --sweep {text!r}: START and STOP are numbers, COUNT an integer") from None
    if count < 1 or not (math.isfinite(start) and math.isfinite(stop)) or min(start, stop) < 0:
        raise InputError(f"bad --sweep {text!r}: thresholds are finite and >= 0, COUNT >= 1")
    import numpy as np  # lazy, like every import the CLI's start-up does not need

    return list(dict.fromkeys(round(float(t), 6) for t in np.linspace(start, stop, count)))


def _preset_cfg(name: str, presets_file: PresetFiles, base: DecodingConfig, k: int | None,
                settings: dict[str, Any]) -> DecodingConfig:
    """The preset over `base`, then the explicit settings over the preset (as `describe` layers them)."""
    values = dict(resolve(name, presets_file).values)
    if k is not None:
        values["k"] = k
    return base.with_(mode="spec", **values).with_(**settings)


def mode_configs(names: Sequence[str], presets_file: PresetFiles, max_new_tokens: int,
                 k: int | None = None, thresholds: Sequence[float] = (),
                 settings: dict[str, Any] | None = None) -> list[EvalMode]:
    """The configs behind each mode name, plus one spec mode per sweep threshold. `always` and the
    sweep take the quality preset's k and uncertainty (the sweep varies only the threshold); `k`
    overrides the block length of every spec mode."""
    settings = settings or {}
    base = DecodingConfig(max_new_tokens=max_new_tokens).with_(**settings)
    if k is not None and k < 1:
        raise InputError(f"--k must be at least 1, got {k}")
    modes: list[EvalMode] = []
    for name in names:
        if name in ("edge", "cloud"):
            modes.append(EvalMode(name, base.with_(mode=name)))
        elif name in ("fluent", "quality"):
            modes.append(EvalMode(name, _preset_cfg(name, presets_file, base, k, settings), name))
        elif name == "always":
            modes.append(EvalMode(name, _preset_cfg("quality", presets_file, base, k, settings).with_(verify="always"), "quality"))
        elif name in load_presets(presets_file):  # another preset (frugal, one of --presets)
            modes.append(EvalMode(name, _preset_cfg(name, presets_file, base, k, settings), name))
        else:
            raise InputError(f"unknown mode {name!r}; choose from {','.join(MODE_NAMES)}")
    if thresholds:
        quality = _preset_cfg("quality", presets_file, base, k, settings).with_(verify="entropy")
        modes += [EvalMode(f"t={t}", quality.with_(threshold=t), "quality", sweep=True) for t in thresholds]
    return modes


# -- running -------------------------------------------------------------------------------------

def evaluate_clip(describer: Describer, clip: LabelledClip, audio: np.ndarray, mode: EvalMode,
                  rtt_ms: float = 0.0) -> dict[str, Any]:
    """Describe one clip in one mode and score it (see `run_eval`, which does this for many)."""
    [outcome] = describe_many(describer, [(0, lambda: audio)], mode.cfg)
    return outcome_record(clip, outcome, mode, rtt_ms)


def outcome_record(clip: LabelledClip, outcome: Outcome, mode: EvalMode, rtt_ms: float = 0.0) -> dict[str, Any]:
    """A clip's scored record, or its failed record (scored as all wrong) when it failed."""
    if outcome.description is None:
        return failed_record(clip, mode, one_line(outcome.error or RuntimeError("no result")))
    return scored_record(clip, outcome.description, mode, rtt_ms)


def failed_record(clip: LabelledClip, mode: EvalMode, error: str) -> dict[str, Any]:
    record = build_record(clip.file, None, None, mode.cfg, mode.preset, None, error)
    return {**record, "eval_mode": mode.name, "labels": clip.labels, **score(None, clip.labels),
            "modelled_latency_s": None}


def scored_record(clip: LabelledClip, out: Description, mode: EvalMode, rtt_ms: float = 0.0) -> dict[str, Any]:
    """A description's result record with its scores and modelled latency."""
    s = out.result.stats
    record = build_record(clip.file, out.text, out.result, mode.cfg, mode.preset, out.latency_s)
    return {
        **record,
        "eval_mode": mode.name,
        "labels": clip.labels,
        **score(out.text, clip.labels),
        "modelled_latency_s": modelled_latency(out.latency_s, mode.cfg.mode, s.cloud_calls, rtt_ms),
        # Pooled acceptance needs the counts, not per-clip rates (a 1-block clip would weigh as
        # much as a 20-block one).
        "verified_drafted": s.verified_drafted,
        "verified_accepted": s.verified_accepted,
        # With a remote cloud: what crossed the link, measured at the client.
        **(out.link.as_record() if out.link is not None else {}),
    }


def warm_up(describer: Describer, audio: np.ndarray) -> None:
    """One short untimed run per model, so one-off costs (lazy kernels, allocator growth) land on
    no mode's latency, in particular not on whichever mode happens to run first."""
    for mode in ("edge", "cloud"):
        describer.run(audio, DecodingConfig(mode=mode, max_new_tokens=2, stop_min_chars=0))


def run_eval(pair: Pair, clips: Sequence[LabelledClip], modes: Sequence[EvalMode],
             rtt_ms: float = 0.0, on_record: Callable[[dict[str, Any]], None] | None = None,
             batch_size: int = 1, on_skip: Callable[[Skipped], None] | None = None) -> list[dict[str, Any]]:
    """Every mode on every clip, one record each, in clip order per mode. Clips are read (and
    validated, as `describe` does) once, before any decoding; modes run one after another over all
    clips so each mode's latencies are taken under the same conditions. `batch_size` > 1: the
    speculative modes decode that many clips at a time (describe.describe_many: the same tokens; a
    clip's latency then includes its batch-mates' share of each forward, so speedups are not
    per-clip latencies). A clip that fails in one mode gets a failed record (scored as all wrong)
    rather than aborting an evaluation that may have run for an hour. `on_record` as each ends. A
    clip that cannot be read (what only decoding finds: a damaged body, silence, over the window) is
    left out of every mode, told to `on_skip` (inputs.read_all); none left: SpecdecError."""
    clips, audios, skipped = read_all(clips, lambda c: pair.read(c.path)[1], lambda c: c.path, on_skip)
    if not clips:
        raise SpecdecError(f"none of the {count_clips(len(skipped))} could be read (each said why above)"
                           if len(skipped) != 1 else "the one clip could not be read (it said why above)")
    warm_up(pair.describer, audios[0])
    records: list[dict[str, Any]] = []
    for mode in modes:
        rows = batch_size if mode.cfg.mode == "spec" else 1
        done: dict[int, dict[str, Any]] = {}
        inputs = ((i, (lambda a=audio: a)) for i, audio in enumerate(audios))
        for outcome in describe_many(pair.describer, inputs, mode.cfg, rows):
            record = done[outcome.key] = outcome_record(clips[outcome.key], outcome, mode, rtt_ms)
            if on_record is not None:
                on_record(record)
        records += [done[i] for i in range(len(clips))]
    if any(c.labels is None for c in clips):
        add_agreement(records)
    return records


def add_agreement(records: Sequence[dict[str, Any]]) -> None:
    """Without labels, each record's quality is its agreement with cloud-only's sentence for the
    same clip (phrases.agreement, as `specdec calibrate` scores without labels): `agreement` in [0,
    1], 0 for a failed clip, None when cloud-only did not run or failed on that clip."""
    reference = {r["file"]: r["description"] for r in records if r["eval_mode"] == BASELINE and r["error"] is None}
    for r in records:
        cloud = reference.get(r["file"])
        r["agreement"] = None if cloud is None else agreement(r["description"], cloud)[0] if r["error"] is None else 0.0


# -- aggregation ---------------------------------------------------------------------------------

def latency_stats(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, median and 95th percentile (linear interpolation, numpy's default)."""
    if not values:
        return {"mean": None, "p50": None, "p95": None}
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95))}


def _mean(values: Sequence[float]) -> float | None:
    import numpy as np

    return float(np.mean(values)) if len(values) else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _mean_field(records: Sequence[dict[str, Any]], key: str) -> float | None:
    """Mean of a field every record carries (None when some record lacks it: an older report)."""
    values = [r.get(key) for r in records]
    return _mean(values) if values and None not in values else None


def summarize(records: Sequence[dict[str, Any]], mode: EvalMode) -> dict[str, Any]:
    """One row for one mode. Quality rates count every clip (a failed clip is wrong and invalid),
    each attribute's accuracy the clips labelled for it (`scored`: how many; a clip whose labels
    leave the attribute out is not judged on it); cost and latency average the clips that produced
    a result. Counts are per clip (means); cloud_call_rate and acceptance_rate are pooled over all
    tokens / all verified drafts."""
    n = len(records)
    ok = [r for r in records if r["error"] is None]
    tokens = sum(r["tokens"] for r in ok)
    calls = sum(r["cloud_calls"] for r in ok)
    drafted = sum(r.get("verified_drafted", 0) for r in ok)
    accepted = sum(r.get("verified_accepted", 0) for r in ok)
    labelled = all(r["correct"] is not None for r in records)
    judged = {a: [r["correct"][a] for r in records if r["correct"][a] is not None] if labelled else []
              for a in ATTRIBUTES}
    accuracy = {a: (sum(v) / len(v) if v else None) for a, v in judged.items()}
    spec = mode.cfg.mode == "spec"
    threshold = mode.cfg.threshold if spec else None
    agreements = [r["agreement"] for r in records if r.get("agreement") is not None]
    row = {
        "mode": mode.name,
        "sweep": mode.sweep,
        "decoding": mode.cfg.mode,
        "preset": mode.preset,
        "threshold": ("inf" if threshold == float("inf") else threshold),
        "k": mode.cfg.k if spec else None,
        "verify": mode.cfg.verify if spec else None,
        "clips": n,
        "errors": n - len(ok),
        "accuracy": accuracy,
        "scored": {a: len(v) for a, v in judged.items()} if labelled else None,
        "mean_accuracy": _mean([v for v in accuracy.values() if v is not None]),
        "all_correct_rate": (sum(r["all_correct"] for r in records) / n) if n and labelled else None,
        "valid_rate": (sum(r["valid"] for r in records) / n) if n else None,
        "immediate_repeats": sum(r["immediate_repeats"] for r in records),
        "punct_density": _mean([r["punct_density"] for r in ok]),
        "repeat_rate": _mean([r["repeat_rate"] for r in ok]),
        "tokens": _mean([r["tokens"] for r in ok]),
        "cloud_calls": _mean([r["cloud_calls"] for r in ok]),
        "cloud_call_rate": calls / tokens if tokens else (0.0 if ok else None),
        "cloud_tokens": _mean([r["cloud_tokens"] for r in ok]),
        "acceptance_rate": accepted / drafted if drafted else None,
        "escalations": _mean([r["escalations"] for r in ok]) if spec else None,
        # Forward passes after prefill, per clip; for cloud and spec modes cloud_forwards is
        # cloud_calls under the name a reader of a cost table looks for.
        "edge_forwards": _mean([r["edge_forwards"] for r in ok]),
        "cloud_forwards": _mean([r["cloud_calls"] for r in ok]),
        # All the cloud's work, prefill included (a lazy spec clip the edge handled alone has 0),
        # and the share of clips where the cloud did nothing at all (the clip never left the edge).
        "cloud_prefill_tokens": _mean_field(ok, "cloud_prefill_tokens"),
        "cloud_work_tokens": _mean_field(ok, "cloud_work_tokens"),
        "cloud_work_forwards": _mean_field(ok, "cloud_work_forwards"),
        "no_cloud_share": (sum(r["cloud_work_forwards"] == 0 for r in ok) / len(ok)
                           if ok and all(r.get("cloud_work_forwards") is not None for r in ok) else None),
        # A remote cloud (--cloud URL): the link, measured; the share of clips that sent nothing.
        "uplink_bytes": _mean_field(ok, "uplink_bytes"),
        "downlink_bytes": _mean_field(ok, "downlink_bytes"),
        "round_trips": _mean_field(ok, "round_trips"),
        "cloud_wait_s": _mean_field(ok, "cloud_wait_s"),
        "sent_nothing_share": (sum(r["uplink_bytes"] == 0 for r in ok) / len(ok)
                               if ok and all("uplink_bytes" in r for r in ok) else None),
        "cloud_work_tokens_vs_cloud": None,
        "cloud_work_forwards_vs_cloud": None,
        "latency_s": latency_stats([r["latency_s"] for r in ok]),
        "modelled_latency_s": latency_stats([r["modelled_latency_s"] for r in ok]),
        "speedup": None,
        "modelled_speedup": None,
    }
    if not labelled:  # what stands for accuracy (None when cloud-only did not run)
        row["agreement"] = _mean(agreements) if agreements else None
    return row


def add_speedups(summaries: list[dict[str, Any]], baseline: str = BASELINE) -> None:
    """speedup = baseline mean latency / this mode's mean latency (>1 is faster), raw and modelled.
    Left None when the baseline mode was not run."""
    base = next((s for s in summaries if s["mode"] == baseline), None)
    if base is None:
        return
    for s in summaries:
        s["speedup"] = _ratio(base["latency_s"]["mean"], s["latency_s"]["mean"])
        s["modelled_speedup"] = _ratio(base["modelled_latency_s"]["mean"], s["modelled_latency_s"]["mean"])
        # Cloud work as a share of cloud-only's on the same clips (<1: the cloud did less).
        for key in ("cloud_work_tokens", "cloud_work_forwards"):
            s[f"{key}_vs_cloud"] = _ratio(s.get(key), base.get(key))


def summarize_all(records: Sequence[dict[str, Any]], modes: Sequence[EvalMode]) -> list[dict[str, Any]]:
    rows = [summarize([r for r in records if r["eval_mode"] == m.name], m) for m in modes]
    add_speedups(rows)
    return rows


def _point(s: dict[str, Any]) -> dict[str, Any]:
    point = {"mode": s["mode"], "threshold": s["threshold"], "k": s["k"], "cloud_call_rate": s["cloud_call_rate"],
             "mean_accuracy": s["mean_accuracy"], "all_correct_rate": s["all_correct_rate"],
             "valid_rate": s["valid_rate"], "latency_mean_s": s["latency_s"]["mean"],
             "modelled_latency_mean_s": s["modelled_latency_s"]["mean"], "speedup": s["speedup"]}
    if "agreement" in s:
        point["agreement"] = s["agreement"]
    return point


def frontier(summaries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The cost-quality frontier: sweep points (cloud calls per token vs mean accuracy) and the
    named modes as reference points. None when no sweep ran."""
    sweep = [s for s in summaries if s.get("sweep")]
    if not sweep:
        return None
    named = [s for s in summaries if not s.get("sweep")]
    return {
        "parameter": "threshold",
        "k": sweep[0]["k"],
        "points": [_point(s) for s in sorted(sweep, key=lambda s: s["threshold"])],
        "references": {s["mode"]: _point(s) for s in named},
    }


# -- the report ----------------------------------------------------------------------------------

def build_report(records: Sequence[dict[str, Any]], modes: Sequence[EvalMode], *, edge: str, cloud: str,
                 samples: str, labels: str | None, settings: dict[str, Any]) -> dict[str, Any]:
    """The report; `labels` None: the clips had none (quality is agreement with cloud-only). With
    labels, `attributes` says per attribute on how many clips it was scored and how many left it out."""
    summaries = summarize_all(records, modes)
    by_file = {r["file"]: r["labels"] for r in records}
    return {
        "specdec_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "edge": edge,
        "cloud": cloud,
        "samples": samples,
        "labels": labels,
        "clips": len(by_file),
        "attributes": attribute_counts(list(by_file.values())) if labels is not None else None,
        "settings": settings,
        "modes": [s for s in summaries if not s["sweep"]],
        "frontier": frontier(summaries),
        "records": list(records),
    }


def fmt(value: Any, digits: int = 3, pct: bool = False) -> str:
    """A table cell: – for missing, fixed digits for floats, a percentage when `pct`."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value * 100:.1f}%" if pct else f"{value:.{digits}f}"
    return str(value)


Column = tuple[str, Callable[[dict[str, Any]], str]]


def labelled(report: dict[str, Any]) -> bool:
    """Whether the report's clips were labelled (else its quality is agreement with cloud-only)."""
    return report.get("labels") is not None


def partly_labelled(report: dict[str, Any]) -> bool:
    """Whether the labels leave some attribute out of some clip (each attribute is then scored over
    the clips labelled for it)."""
    return any(c["left_out"] for c in (report.get("attributes") or {}).values())


def partial_resolution(report: dict[str, Any]) -> tuple[float, int]:
    """With labels that leave attributes out: how far one changed attribute on one clip moves a
    mode's mean accuracy at most, in points, and the fewest clips per attribute at which that is 1
    point. Each attribute's accuracy is over its own n_a clips and the mean is over the m attributes
    labelled at all, so the step is 100 / (m * n_a), largest for the least-labelled attribute (with
    all six on every clip: 100 / (6 n), inputs.resolution_points)."""
    scored = [c["scored"] for c in report["attributes"].values() if c["scored"]]
    m = len(scored)
    return 100.0 / (m * min(scored)), math.ceil(100.0 / m)


def attribute_table(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Accuracy per attribute, one row per mode, then the clips each attribute was scored on and
    the clips that left it out when some did (shared by the terminal table and the Markdown report)."""
    rows = [[s["mode"], *(fmt(s["accuracy"][a], pct=True) for a in ATTRIBUTES)] for s in report["modes"]]
    if partly_labelled(report):
        counts = report["attributes"]
        rows += [["clips scored", *(str(counts[a]["scored"]) for a in ATTRIBUTES)],
                 ["left out", *(str(counts[a]["left_out"]) for a in ATTRIBUTES)]]
    return ["mode", *ATTRIBUTES], rows


def has_link(report: dict[str, Any]) -> bool:
    """Whether the report's modes ran against a remote cloud (their link was measured)."""
    return any(s.get("sent_nothing_share") is not None for s in report["modes"])


def summary_tables(rtt: bool, link: bool = False, labels: bool = True,
                   partly: bool = False) -> list[tuple[str, list[Column]]]:
    """(title, [(header, cell)]) for the mode summary, in narrow tables (quality, cost, cloud work,
    latency, and with a remote cloud the link) that fit a terminal; shared by the Rich tables and
    the Markdown report. Without `labels` the quality table has agreement with cloud-only where
    accuracy would be; `partly` (labels that leave attributes out): the share of clips with every
    labelled attribute right is "all right", not "all six"."""
    def lat(key: str, q: str) -> Callable[[dict[str, Any]], str]:
        return lambda s: fmt(s[key][q])

    judged: list[Column] = [
        ("accuracy", lambda s: fmt(s["mean_accuracy"], pct=True)),
        ("all right" if partly else "all six", lambda s: fmt(s["all_correct_rate"], pct=True)),
    ] if labels else [("agreement", lambda s: fmt(s.get("agreement"), pct=True))]
    quality: list[Column] = [
        ("mode", lambda s: s["mode"]),
        *judged,
        ("one sentence", lambda s: fmt(s["valid_rate"], pct=True)),
        ("repeats", lambda s: fmt(s["immediate_repeats"])),
        ("punct", lambda s: fmt(s["punct_density"], 2)),
        ("rep. rate", lambda s: fmt(s["repeat_rate"], 2)),
        ("errors", lambda s: fmt(s["errors"])),
    ]
    cost: list[Column] = [
        ("mode", lambda s: s["mode"]),
        ("tokens", lambda s: fmt(s["tokens"], 1)),
        ("cloud calls", lambda s: fmt(s["cloud_calls"], 1)),
        ("calls/tok", lambda s: fmt(s["cloud_call_rate"])),
        ("cloud tok", lambda s: fmt(s["cloud_tokens"], 1)),
        ("accept", lambda s: fmt(s["acceptance_rate"], pct=True)),
        ("edge fwd", lambda s: fmt(s["edge_forwards"], 1)),
    ]
    latency: list[Column] = [
        ("mode", lambda s: s["mode"]),
        ("mean", lat("latency_s", "mean")),
        ("p50", lat("latency_s", "p50")),
        ("p95", lat("latency_s", "p95")),
        ("speedup", lambda s: fmt(s["speedup"], 2)),
    ]
    if rtt:
        # With the modelled link: p50 left out to keep the table within 80 columns.
        latency += [
            ("link mean", lat("modelled_latency_s", "mean")),
            ("link p95", lat("modelled_latency_s", "p95")),
            ("link speedup", lambda s: fmt(s["modelled_speedup"], 2)),
        ]
    work: list[Column] = [
        ("mode", lambda s: s["mode"]),
        ("prefill tok", lambda s: fmt(s.get("cloud_prefill_tokens"), 1)),
        ("work tok", lambda s: fmt(s.get("cloud_work_tokens"), 1)),
        ("work fwd", lambda s: fmt(s.get("cloud_work_forwards"), 1)),
        ("tok vs cloud", lambda s: fmt(s.get("cloud_work_tokens_vs_cloud"), 2)),
        ("fwd vs cloud", lambda s: fmt(s.get("cloud_work_forwards_vs_cloud"), 2)),
        ("no cloud", lambda s: fmt(s.get("no_cloud_share"), pct=True)),
    ]
    tables = [("quality", quality), ("cost per clip (after prefill)", cost),
              ("cloud work per clip (prefill included)", work), ("latency (s)", latency)]
    if link:
        tables.append(("remote cloud link per clip (measured at the client)", [
            ("mode", lambda s: s["mode"]),
            ("up kB", lambda s: fmt(s["uplink_bytes"] / 1000 if s.get("uplink_bytes") is not None else None, 1)),
            ("down kB", lambda s: fmt(s["downlink_bytes"] / 1000 if s.get("downlink_bytes") is not None else None, 2)),
            ("round trips", lambda s: fmt(s.get("round_trips"), 1)),
            ("wait s", lambda s: fmt(s.get("cloud_wait_s"))),
            ("sent nothing", lambda s: fmt(s.get("sent_nothing_share"), pct=True)),
        ]))
    return tables


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in rows]
    return out


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: settings, the mode table, accuracy per attribute, the frontier."""
    st = report["settings"]
    rtt = bool(st.get("cloud_rtt_ms"))
    has_labels = labelled(report)
    partly = partly_labelled(report)
    lines = [
        "# specdec eval",
        "",
        f"- edge: `{report['edge']}`",
        f"- cloud: `{report['cloud']}`",
        f"- clips: {report['clips']} from `{report['samples']}` " + (f"(labels `{report['labels']}`)" if has_labels
                                                                     else "(no labels: accuracy needs --labels)"),
        f"- max new tokens: {st.get('max_new_tokens')}; modelled link: {st.get('cloud_rtt_ms', 0):g} ms per cloud call",
        f"- specdec {report['specdec_version']}, {report['created']}",
        "",
        "## Modes",
        "",
    ]
    for title, cols in summary_tables(rtt, has_link(report), has_labels, partly):
        lines += [f"### {title.capitalize()}", ""]
        lines += _md_table([h for h, _ in cols], [[cell(s) for _, cell in cols] for s in report["modes"]])
        lines += [""]
    judged = ("Accuracy is the mean of the per-attribute accuracies, each over the clips labelled for that "
              "attribute (the labels leave some out: *Accuracy per attribute* counts them); *all right* is the share "
              "of clips with every labelled attribute right" if partly else
              "Accuracy is the mean of the six per-attribute accuracies; *all six* is the share of clips with "
              "every attribute right" if has_labels else
              "*Agreement* (without labels) is the mean agreement with cloud-only's sentence for the same clip: the "
              "share of the attributes cloud-only states by canonical phrases that the mode states alike (else "
              "character similarity), 0 for a failed clip")
    lines += [judged + "; *one sentence* the share ending in one 。！？ with no other; *repeats* "
              "counts immediate CJK character repeats, *punct* is the mean punctuation density and *rep. rate* "
              "the mean share of repeated 2-/3-grams. Cloud calls are the cloud's forward passes after "
              "prefill (*calls/tok* per output token, *cloud tok* the tokens fed to it); *edge fwd* likewise "
              "for the edge; *accept* is accepted / drafted over verified blocks. *Cloud work* counts everything the "
              "cloud ran, its prefill included: *prefill tok* the prompt tokens (audio placeholders included; 0 "
              "when the cloud never ran: spec modes prefill the cloud only at the first escalation), *work tok* "
              "those plus the tokens fed after, *work fwd* every cloud forward; *vs cloud* divides by "
              "cloud-only's on the same clips; *no cloud* is the share of clips on which the cloud did no work at "
              "all. Latency is wall time per "
              "clip in seconds (features + decoding, models loaded once); *link* adds the modelled round trip "
              "per cloud call (once per clip for cloud-only). Speedup is cloud-only mean latency / the "
              "mode's.", ""]
    if has_labels:
        lines += ["## Accuracy per attribute", ""]
        lines += _md_table(*attribute_table(report))
    fr = report.get("frontier")
    if fr:
        lines += ["", f"## Cost–quality frontier (threshold sweep, k = {fr['k']})", ""]
        headers, cells = frontier_columns(has_labels)
        lines += _md_table(headers, [cells(p) for p in fr["points"]])
    return "\n".join(lines) + "\n"


def frontier_columns(labels: bool = True) -> tuple[list[str], Callable[[dict[str, Any]], list[str]]]:
    """The frontier table's headers and a point's cells (agreement where accuracy is, without labels)."""
    if labels:
        return (["threshold", "calls/token", "accuracy", "all six", "valid", "speedup"],
                lambda p: [fmt(p["threshold"], 2), fmt(p["cloud_call_rate"]), fmt(p["mean_accuracy"], pct=True),
                           fmt(p["all_correct_rate"], pct=True), fmt(p["valid_rate"], pct=True), fmt(p["speedup"], 2)])
    return (["threshold", "calls/token", "agreement", "valid", "speedup"],
            lambda p: [fmt(p["threshold"], 2), fmt(p["cloud_call_rate"]), fmt(p.get("agreement"), pct=True),
                       fmt(p["valid_rate"], pct=True), fmt(p["speedup"], 2)])


def report_json(report: dict[str, Any], indent: int | None = 2) -> str:
    return json.dumps(json_safe(report), ensure_ascii=False, indent=indent, allow_nan=False)


def write_report(report: dict[str, Any], path: Path) -> tuple[Path, Path]:
    """Write `path` (JSON) and the Markdown version beside it (same stem, .md)."""
    md_path = path.with_suffix(".md")
    if md_path == path:
        raise InputError(f"--report {path} must not end in .md: the Markdown version is written beside it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report_json(report) + "\n", encoding="utf-8")
        md_path.write_text(markdown(report), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write the report {path}: {exc.strerror or exc}") from exc
    return path, md_path
