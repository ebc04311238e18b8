"""Calibration (`specdec calibrate DIR --out presets.toml`): find the thresholds that mean "quality" and "fluent"
for any edge/cloud pair, on the user's own clips, in one process.

What it runs, on every clip: cloud-only, edge-only, and a threshold × k sweep of the speculative
mode. The thresholds are read off the edge itself: for each k, the percentiles of the block
uncertainties the edge produces on the calibration clips (a never-escalating run, threshold = inf,
which is also the sweep's cheapest point). That makes the grid fit any pair's scale: a 152k-token
Qwen vocabulary sums to several nats per block, the demo pair's 443-token vocabulary to about one.

Clips are split into alternating halves (1st, 3rd, … calibrate; 2nd, 4th, … check). quality and
fluent are the cheapest settings (fewest cloud calls per output token) shown within
`quality_points` / `fluent_points` of cloud-only (calibration_objective.select, `margin` its z,
`--margin`): on the calibration half, each k's thresholds tested from 0 up by a lower confidence
bound on the per-clip quality gap, whose margin grows as the half shrinks and with the number of
k's (the cheapest of many settings is the luckiest); then the proposal's k, from threshold 0 up to
it, tested the same way on the check half, clips that proposed nothing. None holds: a threshold-0
setting (every block verified: cloud-only's answers), flagged in the file and in a warning. A preset with a
wider budget is never dearer than one with a narrower (a setting shown within 1 point is within 3).

The meaning gate (decoding/gate.py; skipped with gate=False, `--no-gate`): fitted on the
calibration half from the edge-only run's answers by self-labelled swaps (gate_fit.fit_gate: edge
work only, at most MAX_SWAPS per clip), for the task these settings describe (the gate records its
instruction and system turn; any other task decodes with the entropy gate). Per k a
never-escalating meaning run sets the gate_upload x gate_verify grid (gate_fit.sweep_named), and
`frugal` is the cheapest meaning setting by the cloud's work per clip (a clip that goes up at all
pays its prefill) shown within `frugal_points` (1 point by default, as quality: frugal is the
preset that keeps clips on the device at quality's budget, not fluent's) by the same rule, each
(k, gate_upload) tested from gate_verify 0 up; written with the `[gate]` table only when one is.

Quality, in points (0–100):
* with labels: mean attribute accuracy by the canonical phrases (`evaluate.score`, as `eval` scores),
  each attribute over the clips labelled for it where the labels leave some out (as demo.measure
  does for an ambiguous one; calibration_objective.attribute_weights);
* without labels: agreement with cloud-only's sentence for the same clip. Where cloud-only's
  sentence states attributes by canonical phrases, the share of those attributes the setting
  states the same way; otherwise difflib's character-level similarity ratio to it. Speculative
  decoding exists to reproduce the cloud's output at a fraction of its calls (with every block
  verified it is exactly cloud-only's output), so distance from cloud-only is precisely what a
  threshold trades away. Cloud-only scores 100 on it by construction.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import __version__
from .calibration_objective import (
    ONE_ATTRIBUTE,
    ClipCost,
    GapBound,
    Selection,
    SettingScore,
    attribute_unit,
    attribute_weights,
    call_rate_key,
    clip_cost,
    clips_to_show,
    cost_key,
    score_clips,
    select,
    weighted_quality,
)
from .decoding.config import DecodingConfig
from .errors import InputError, SpecdecError, one_line
from .inputs import Skipped, check_clips, clips_for_resolution, read_all, resolution_points
from .inputs import clips as count_clips
from .phrases import agreement

if TYPE_CHECKING:
    from .decoding.gate import MeaningGate
    from .describe import Description
    from .pair import Pair

PERCENTILES = (10, 25, 40, 50, 60, 75, 90)  # the default grid; --percentiles refines it
# The meaning gate's sweep: gate_upload at these percentiles of the never-escalating run's block
# scores, gate_verify at these (and 0, and gate_upload): at most 20 settings per k, a
# coarser grid than bench/gate.py's (gate_fit.UPLOAD/VERIFY_PERCENTILES, ~30) to keep calibrate's
# decodes near the entropy sweep's. A clip stays home only when every one of its blocks is under
# gate_upload, so the 95th and 98th percentiles are where most of them do (with v4's 60/80/90 the
# frugal preset kept 2-4 % of clips home: bench/demo_goals.py, issue 51).
GATE_UPLOAD_PERCENTILES = (60, 80, 90, 95, 98)
GATE_VERIFY_PERCENTILES = (25, 50)
MAX_SWAPS = 48  # self-labelled swaps per calibration clip (each: one edge continuation)


# -- scoring ---------------------------------------------------------------------------------------

def label_accuracy(text: str, labels: dict[str, str]) -> float:
    """The share of one description's labelled attributes it states right, in [0, 1] (eval's
    scoring; an attribute the labels leave out is not judged)."""
    from .evaluate import score

    judged = [v for v in score(text, labels)["correct"].values() if v is not None]
    return sum(judged) / len(judged) if judged else 0.0


# -- the settings and their results ----------------------------------------------------------------

@dataclass
class Run:
    """One setting over every clip: per-clip text, tokens and cloud calls, in clip order."""

    name: str
    cfg: DecodingConfig
    texts: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    uncertainties: list[list[float]] = field(default_factory=list)  # per clip, each block's
    ids: list[list[int]] = field(default_factory=list)               # per clip, the answer's token ids
    scores: list[list[float]] = field(default_factory=list)          # per clip, each block's gate score
    stats: list[Any] = field(default_factory=list)                   # per clip, its DecodeStats


@dataclass(frozen=True)
class Score:
    quality: float      # points, 0–100
    call_rate: float    # cloud calls per output token, pooled over the clips


def score_run(run: Run, idx: Sequence[int], quality_of: Callable[[int, str], float]) -> Score:
    tokens = sum(run.tokens[i] for i in idx)
    calls = sum(run.calls[i] for i in idx)
    quality = 100.0 * sum(quality_of(i, run.texts[i]) for i in idx) / max(len(idx), 1)
    return Score(quality, calls / tokens if tokens else 0.0)


def thresholds_for(uncertainties: Sequence[float], percentiles: Sequence[float] = PERCENTILES) -> list[float]:
    """The sweep's thresholds for one k: 0 (nearly every block to the cloud), the percentiles of
    the edge's own block uncertainties, rounded to 3 significant digits, and inf (never)."""
    import numpy as np

    values = {0.0, math.inf}
    if uncertainties:
        for p in np.percentile(np.asarray(uncertainties, dtype=float), list(percentiles)):
            values.add(float(f"{float(p):.3g}"))
    return sorted(values)


def sweep_chains(configs: Mapping[str, DecodingConfig]) -> list[list[str]]:
    """The sweep's settings (name -> config) as calibrate tests them (calibration_objective.select):
    chains, each from its safest setting: the entropy gate per k by threshold (0 first: every block
    verified, cloud-only's answers; inf last), the meaning gate per (k, gate_upload) by gate_verify
    (0 first: every block of a clip that went up verified). Along a chain each setting sends fewer
    blocks to the cloud than the one before, so its quality is expected to fall: the order
    fixed-sequence testing needs, fixed before any clip is scored."""
    groups: dict[tuple, list[tuple[float, str]]] = {}
    for name, cfg in configs.items():
        if cfg.verify == "meaning":
            groups.setdefault(("meaning", cfg.k, cfg.gate_upload), []).append((cfg.gate_verify, name))
        else:
            groups.setdefault(("entropy", cfg.k), []).append((cfg.threshold, name))
    return [[name for _, name in sorted(members)] for members in groups.values()]


# -- the presets file ------------------------------------------------------------------------------

def toml_float(x: float) -> str:
    return "inf" if math.isinf(x) else repr(float(x))


@dataclass(frozen=True)
class Choice:
    """quality or fluent: the setting, its scores on both halves, whether it was shown within
    `points` (`met`; False: the fallback), and the numbers it was judged by (`selection`)."""

    name: str
    points: float
    run: Run
    calib: Score
    check: Score
    met: bool
    selection: Selection | None = None
    taken_from: str | None = None  # a narrower budget's preset, when that one was cheaper


def _bound_line(calib: GapBound, check: GapBound | None) -> str:
    """The presets file's comment on how sure a preset is within its budget."""
    line = (f"gap to cloud-only {calib.mean:+.2f} points, lower bound {calib.lower:+.2f} at z "
            f"{calib.z:.2f} (calibration half)")
    if check is not None:
        line += f"; {check.mean:+.2f}, {check.lower:+.2f} at z {check.z:.2f} (check half)"
    return line


def _by(margin: float) -> str:
    return f"specdec calibrate --margin {margin:g}" if margin != 1.0 else "specdec calibrate"


@dataclass(frozen=True)
class GateChoice:
    """The meaning-gate preset (`frugal`): the cheapest meaning setting by the cloud's work per clip
    shown within `points` of cloud-only (calibration_objective.select, z = `margin`: --margin, 1 by
    default); `met` False: none was, and the file gets neither the preset nor the gate. `swaps` /
    `changed`: what the gate was fitted on; `selection`: the numbers it was judged by."""

    name: str
    points: float
    run: Run
    calib: SettingScore
    check: SettingScore
    met: bool
    gate: MeaningGate
    swaps: int
    changed: int
    fallback_threshold: float  # the entropy threshold it keeps for another task (fluent's)
    margin: float = 1.0        # the standard errors of margin it was chosen with (--margin)
    selection: Selection | None = None


def _gate_comment(half: str, s: SettingScore) -> str:
    return (f"{half} half: quality {s.quality:.1f}, cloud calls per token {s.call_rate:.3f}, zero-cloud "
            f"{100 * s.zero_cloud_share:.1f}%, cloud work per clip {s.work_per_clip:.1f} tokens")


def gate_presets_toml(g: GateChoice, n_calib: int) -> str:
    """The meaning preset and the `[gate]` table (empty when no meaning setting met the target)."""
    from .gate_presets import gate_toml, meaning_preset_lines

    if not g.met:
        return ""
    cfg = g.run.cfg
    sel = g.selection
    sure = [] if sel is None else [_bound_line(sel.calibration[g.run.name], sel.check.get(g.run.name))]
    lines = meaning_preset_lines(
        g.name, f"cheapest within {g.points:g} point(s) of cloud-only on the meaning gate, counting clips that go up "
        f"({_by(g.margin)})", cfg.k, cfg.uncertainty, g.fallback_threshold, cfg.gate_upload, cfg.gate_verify,
        [_gate_comment("calibration", g.calib), _gate_comment("check", g.check), *sure])
    about = (f"fitted by specdec calibrate on {count_clips(n_calib)} ({g.swaps} self-labelled swaps, {g.changed} changed "
             "what the sentence says)")
    return "\n" + "\n".join(lines) + "\n\n" + gate_toml(g.gate, about)


def presets_toml(choices: Sequence[Choice], header: Sequence[str], baselines: dict[str, tuple[Score, Score]]) -> str:
    """The presets file: a header saying what was measured on what, then one table per preset
    with its calibration-half and check-half scores as comments."""
    lines = [f"# {h}" if h else "#" for h in header]
    for name, (cal, chk) in baselines.items():
        lines.append(f"# {name}: quality {cal.quality:.1f} calibration / {chk.quality:.1f} check, "
                     f"cloud calls per token {cal.call_rate:.3f} / {chk.call_rate:.3f}")
    for c in choices:
        cfg = c.run.cfg
        by = "specdec calibrate" if c.selection is None else _by(c.selection.margin)
        if c.met:
            description = f"cheapest within {c.points:g} point(s) of cloud-only ({by})"
        else:
            description = (f"none shown within {c.points:g} point(s) of cloud-only on these clips: the safest, "
                           f"every block verified ({by})")
        lines += ["", f"[{c.name}]", f'description = "{description}"',
                  f"threshold = {toml_float(cfg.threshold)}", f"k = {cfg.k}", f'uncertainty = "{cfg.uncertainty}"',
                  f'verify = "{cfg.verify}"',
                  f"# calibration half: quality {c.calib.quality:.1f}, cloud calls per token {c.calib.call_rate:.3f}",
                  f"# check half:       quality {c.check.quality:.1f}, cloud calls per token {c.check.call_rate:.3f}"]
        if c.selection is not None:
            sel = c.selection
            lines.append(f"# {_bound_line(sel.calibration[c.run.name], sel.check.get(c.run.name))}")
            if c.taken_from is not None:
                lines.append(f"# {c.taken_from}'s setting: shown within {c.points:g} point(s) as within its own "
                             "budget, and cheaper than this budget's own choice")
    return "\n".join(lines) + "\n"


# -- the inputs ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Clips:
    """The clips to calibrate on: names relative to the folder, paths, their labels (None without a
    labels file), the files skipped with the reasons, and the files the labels file labels no
    attribute of (left out: nothing to score them by)."""

    names: list[str]
    paths: list[Path]
    labels: list[dict[str, str]] | None
    skipped: list[Skipped]
    unlabelled: list[str] = field(default_factory=list)


def clips_for(directory: Path, labels: Path | None, limit: int | None = None) -> Clips:
    """The clips to calibrate on (without a labels file: every audio file of `directory`), the first
    `limit` of them, each checked before any model loads (inputs.check_clips)."""
    from .evaluate import labels_file, unlabelled_clips

    unlabelled: list[str] = []
    if labels is not None:
        read = labels_file(labels, directory)
        clips, skipped, unlabelled = read.clips, [], read.unlabelled
    else:
        clips, skipped = unlabelled_clips(directory)
    checked = check_clips(clips[:limit], lambda c: c.path)
    kept = checked.clips
    return Clips([c.file for c in kept], [c.path for c in kept],
                 None if labels is None else [c.labels for c in kept], skipped + checked.skipped, unlabelled)


def _comma_list(text: str, option: str, convert: Callable[[str], float], what: str, example: str) -> list:
    """Sorted distinct values of a comma-list option, or a one-line error naming it."""
    try:
        return sorted({convert(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise InputError(f"bad {option} {text!r}; give {what} as a comma list, e.g. {example}") from None


def parse_ks(text: str) -> list[int]:
    ks = _comma_list(text, "--ks", int, "block lengths", "4,6")
    if not ks or ks[0] < 1:
        raise InputError(f"bad --ks {text!r}; block lengths are integers >= 1")
    return ks


def parse_percentiles(text: str) -> list[float]:
    ps = _comma_list(text, "--percentiles", float, "numbers between 0 and 100", "10,25,50,75,90")
    if not ps or ps[0] <= 0 or ps[-1] >= 100:
        raise InputError(f"bad --percentiles {text!r}; each must lie strictly between 0 and 100 "
                         "(0 and inf are always in the sweep)")
    return ps


# -- the calibration -------------------------------------------------------------------------------

class Progress(Protocol):
    """What calibrate reports while it runs (the command draws it)."""

    def total(self, clips: int) -> None: ...    # decodes planned so far (it shrinks once thresholds are known)

    def running(self, name: str) -> None: ...   # a setting starts over every clip

    def advance(self) -> None: ...              # one clip of it is done


@dataclass
class Calibration:
    """What `calibrate` found: every setting run, its scores on both halves, the two choices, and
    the presets file's text."""

    runs: list[Run]
    scored: dict[str, tuple[Score, Score]]
    choices: list[Choice]
    measure: str
    toml: str
    n_calib: int
    n_check: int
    gate: GateChoice | None = None  # None: --no-gate
    # With labels: per attribute, the clips it was scored on and the clips whose labels left it out
    attributes: dict[str, dict[str, int]] | None = None
    unit: float = ONE_ATTRIBUTE  # one attribute of one clip, in points (calibration_objective.attribute_unit)
    # Labels that leave attributes out: the most one attribute of one calibration clip moves that
    # half's quality, in points, 100 / (m x the least-labelled attribute's clips); None otherwise
    step: float | None = None

    def report(self) -> dict[str, Any]:
        """Every setting's scores on both halves and what was chosen, as JSON (`calibrate --report`):
        what docs tables about a calibration are drawn from (bench/doc_tables.py), so none is
        copied by hand. With them, what the rule computed (calibration_objective.select): each swept
        setting's gap to cloud-only on each half (`gap`: plain mean, adjusted mean, standard
        error, z, lower bound; the entropy settings' as quality and fluent were judged, the
        meaning settings' as frugal was), and per preset the margin, the z on the calibration
        half, the chains, the settings accepted there, the proposal and what the check half
        confirmed."""
        gaps: dict[str, dict[str, Any]] = {}
        for sel in [c.selection for c in self.choices[:1]] + [None if self.gate is None else self.gate.selection]:
            if sel is None:
                continue
            for name, b in sel.calibration.items():
                gaps[name] = {"calibration": _bound(b), "check": _bound(sel.check[name]) if name in sel.check else None}
        chosen: dict[str, list[str]] = {}
        for c in self.choices:
            chosen.setdefault(c.run.name, []).append(c.name)
        if self.gate is not None and self.gate.met:
            chosen.setdefault(self.gate.run.name, []).append(self.gate.name)

        def setting(r: Run) -> dict[str, Any]:
            cfg = r.cfg
            out: dict[str, Any] = {"name": r.name, "mode": cfg.mode, "k": cfg.k, "verify": cfg.verify}
            if cfg.mode == "spec":
                if cfg.verify == "meaning":
                    out.update(gate_upload=cfg.gate_upload, gate_verify=cfg.gate_verify)
                else:
                    out["threshold"] = None if math.isinf(cfg.threshold) else cfg.threshold
            cal, chk = self.scored[r.name]
            out["calibration"] = {"quality": cal.quality, "call_rate": cal.call_rate}
            out["check"] = {"quality": chk.quality, "call_rate": chk.call_rate}
            out["chosen"] = chosen.get(r.name, [])
            out["gap"] = gaps.get(r.name)
            return out

        gate = None
        if self.gate is not None:
            g = self.gate

            def half(s: SettingScore) -> dict[str, float]:
                return {"quality": s.quality, "call_rate": s.call_rate, "zero_cloud_share": s.zero_cloud_share,
                        "work_per_clip": s.work_per_clip}
            gate = {"name": g.name, "points": g.points, "met": g.met, "margin": g.margin, "setting": g.run.name,
                    "calibration": half(g.calib), "check": half(g.check), "swaps": g.swaps,
                    "weights": len(g.gate.weights), **_rule(g.selection)}
        return {"measure": self.measure, "n_calib": self.n_calib, "n_check": self.n_check,
                "attributes": self.attributes,
                "settings": [setting(r) for r in self.runs],
                "choices": [{"name": c.name, "points": c.points, "met": c.met, "setting": c.run.name,
                             **_rule(c.selection), "taken_from": c.taken_from}
                            for c in self.choices],
                "gate": gate}

    def warnings(self) -> list[str]:
        """What makes the choice weaker than it looks, one line each: too few clips for the targets to
        be told apart, a preset that no setting was shown within (the fallback), and a preset whose
        check half misses its target (on clips it was not chosen on). Empty when none."""
        lines = []
        tightest = min(c.points for c in self.choices)
        if self.step is None and self.n_calib < clips_for_resolution(tightest):
            lines.append(f"the choice rests on {count_clips(self.n_calib, 'calibration clip')} (checked on {self.n_check}): one "
                         f"attribute changed on one clip moves quality by {resolution_points(self.n_calib):.1f} "
                         f"points, more than the {tightest:g}-point target; calibrate on at least "
                         f"{count_clips(self.clips_needed(tightest))}")
        elif self.step is not None and self.step > tightest + 1e-9:
            lines.append(f"the choice rests on {count_clips(self.n_calib, 'calibration clip')} (checked on {self.n_check}): one "
                         f"attribute changed on one clip moves quality by up to {self.step:.1f} points (the "
                         f"least-labelled attribute's clips), more than the {tightest:g}-point target; calibrate on "
                         f"at least {count_clips(self.clips_needed(tightest))}")
        for c in self.choices:
            if not c.met and c.selection is not None:
                lines.append(f"{c.name}: no setting was shown within {c.points:g} point(s) of cloud-only on "
                             f"{self.n_calib} + {count_clips(self.n_check)} (--margin {c.selection.margin:g}), so it "
                             f"verifies every block ({c.run.name}: cloud-only's answers); calibrate on more clips: "
                             f"even a setting that matches cloud-only on every clip needs "
                             f"{self.clips_needed(c.points)}")
        cloud_check = self.scored["cloud-only"][1].quality
        for c in self.choices:
            gap = cloud_check - c.check.quality
            if not c.met and c.selection is not None:
                continue  # said above
            if gap > c.points:
                lines.append(f"{c.name} misses its target on the check half: {c.check.quality:.1f} against "
                             f"cloud-only's {cloud_check:.1f} ({gap:.1f} points below; target within {c.points:g}): "
                             "the choice does not hold on clips it was not chosen on; calibrate on more clips")
        return lines

    def clips_needed(self, points: float) -> int:
        """The fewest clips (both halves) on which a setting that matches cloud-only on every clip
        is shown within `points` by quality's rule (calibration_objective.clips_to_show, at the z of
        each half), and on which one attribute of one clip moves quality by at most `points` (with
        labels that leave attributes out: as many more as the least-labelled attribute lacks)."""
        need = clips_for_resolution(points) if self.step is None else math.ceil(self.step * self.n_calib / points - 1e-9)
        sel = self.choices[0].selection
        if sel is not None and sel.margin > 0:
            need = max(need, clips_to_show(points, sel.z, self.unit), clips_to_show(points, sel.margin, self.unit))
        return 2 * need


def _bound(b: GapBound) -> dict[str, float]:
    return {"mean": b.mean, "adjusted": b.adjusted, "se": b.se, "z": b.z, "lower": b.lower}


def _rule(sel: Selection | None) -> dict[str, Any]:
    """A preset's rule in the report: the margin (--margin), the z on the calibration half, the
    chains tested (safest first), the settings accepted there, the proposal, and what the check
    half confirmed of its chain."""
    if sel is None:
        return {}
    return {"margin": sel.margin, "z": sel.z, "chains": sel.chains, "accepted": sel.accepted,
            "proposed": sel.proposed, "confirmed": sel.confirmed}


def _record(out: Description, run: Run) -> None:
    run.texts.append(out.text)
    run.tokens.append(out.result.stats.tokens)
    run.calls.append(out.result.stats.cloud_calls)
    run.uncertainties.append([e.uncertainty for e in out.result.events])
    run.ids.append(list(out.result.tokens))
    run.scores.append([e.score for e in out.result.events])
    run.stats.append(out.result.stats)


def calibrate(pair: Pair, names: Sequence[str], paths: Sequence[Path], labels: Sequence[dict[str, str]] | None, *,
              directory: Path, ks: Sequence[int], percentiles: Sequence[float], uncertainty: str = "sum",
              max_new_tokens: int = 64, batch_size: int = 8, settings: dict[str, Any] | None = None,
              quality_points: float = 1.0,
              fluent_points: float = 3.0, frugal_points: float = 1.0, progress: Progress | None = None,
              gate: bool = True,
              max_swaps: int = MAX_SWAPS, margin: float = 1.0,
              on_skip: Callable[[Skipped], None] | None = None) -> Calibration:
    """Run cloud-only, edge-only and the threshold x k sweep over the clips, propose the presets on
    the calibration half and confirm them on the check half (see the module doc). `settings`: explicit
    decoding settings every run shares (sampling, the prompt). A clip that fails stops the
    calibration (its presets would be chosen on holes), naming the clip.

    `gate`: also fit the meaning gate on the calibration half (gate_fit.fit_gate on the edge-only
    answers, at most `max_swaps` swaps per clip: edge-only work) for the task these settings
    describe, sweep k x gate_upload x gate_verify (gate_fit.sweep) and choose `frugal`, the cheapest
    meaning setting by cloud work per clip shown within `frugal_points`. Every preset is chosen by
    calibration_objective.select with z = `margin` (0: the plain rule, the mean gap on the
    calibration half alone). A clip that cannot be read (what only decoding finds) is left out
    before the halves are drawn, told to `on_skip` (inputs.read_all)."""
    from .describe import describe_many
    from .evaluate import warm_up

    kept, audios, _ = read_all(list(range(len(paths))), lambda i: pair.read(paths[i])[1], lambda i: paths[i],
                               on_skip)
    names, paths = [names[i] for i in kept], [paths[i] for i in kept]
    labels = None if labels is None else [labels[i] for i in kept]
    if len(paths) < 2:
        raise InputError(f"calibration needs at least 2 clips (one per half); {directory} has "
                         f"{len(paths)} readable")
    calib = list(range(0, len(paths), 2))
    check = list(range(1, len(paths), 2))
    warm_up(pair.describer, audios[0])

    base = DecodingConfig(max_new_tokens=max_new_tokens, uncertainty=uncertainty).with_(**(settings or {}))  # type: ignore[arg-type]
    start = time.perf_counter()
    runs: list[Run] = []
    per_k = len(percentiles) + 2 + (1 + _gate_settings_max() if gate else 0)
    total = len(paths) * (2 + len(ks) * per_k)  # shrinks to exact once the thresholds are known
    if progress is not None:
        progress.total(total)

    def run_all(run: Run) -> Run:
        if progress is not None:
            progress.running(run.name)
        # Speculative runs decode `batch_size` clips at a time; the outcomes come back in any order.
        outs: dict[int, Description] = {}
        for outcome in describe_many(pair.describer, ((i, (lambda a=a: a)) for i, a in enumerate(audios)),
                                     run.cfg, batch_size):
            if outcome.description is None:
                raise SpecdecError(f"{run.name} failed on {names[outcome.key]}: "
                                   f"{one_line(outcome.error or RuntimeError('no result'))}")
            outs[outcome.key] = outcome.description
            if progress is not None:
                progress.advance()
        for i in range(len(audios)):
            _record(outs[i], run)
        runs.append(run)
        return run

    cloud_run = run_all(Run("cloud-only", base.with_(mode="cloud")))
    edge_run = run_all(Run("edge-only", base.with_(mode="edge")))
    sweep: list[Run] = []
    for k in ks:
        never = run_all(Run(f"k={k} t=inf", base.with_(k=k, threshold=math.inf)))
        sweep.append(never)
        grid = thresholds_for([u for i in calib for u in never.uncertainties[i]], percentiles)
        total -= (len(percentiles) + 2 - len(grid)) * len(paths)
        if progress is not None:
            progress.total(total)
        for t in grid:
            if not math.isinf(t):
                sweep.append(run_all(Run(f"k={k} t={t:g}", base.with_(k=k, threshold=t))))
    meaning: list[Run] = []
    fitted = None
    if gate:
        from .gate_fit import sweep_named

        fitted, swaps = _fit(pair, [audios[i] for i in calib], [edge_run.ids[i] for i in calib], base, max_swaps,
                             progress)
        # Decoded with the fitted gate as the pair's (its own, from the presets files, is put back after).
        previous, pair.models.gate = pair.models.gate, fitted
        try:
            for k in ks:
                # A never-escalating meaning run: its blocks' scores set the grid (as t=inf does above).
                never = run_all(Run(f"k={k} up=inf ver=inf", base.with_(k=k, verify="meaning", gate_upload=math.inf,
                                                                        gate_verify=math.inf)))
                named = sweep_named(base, k, [x for i in calib for x in never.scores[i] if x is not None],
                                    upload_percentiles=GATE_UPLOAD_PERCENTILES,
                                    verify_percentiles=GATE_VERIFY_PERCENTILES)
                total -= (_gate_settings_max() - sum(not math.isinf(c.gate_upload) for c in named.values())) * len(paths)
                if progress is not None:
                    progress.total(total)
                # gate_upload = inf: only a loop would ever send such a clip up, so those settings decode as
                # the never-escalating run above (the same answers, bar loops): not worth their decodes.
                meaning += [run_all(Run(name, cfg)) for name, cfg in named.items() if not math.isinf(cfg.gate_upload)]
        finally:
            pair.models.gate = previous
    seconds = time.perf_counter() - start

    # Scoring: labels if given, else agreement with cloud-only's sentence for the same clip.
    used: set[str] = set()
    unit = ONE_ATTRIBUTE
    left_out = None
    step = None
    if labels is not None:
        from .evaluate import attribute_counts, left_out_line, score

        # Each half's quality is eval's mean accuracy on it: per attribute over the clips labelled
        # for it (calibration_objective.attribute_weights; the plain share right with complete labels).
        weights: dict[int, dict[str, Any]] = {}
        for half in (calib, check):
            weights.update(zip(half, attribute_weights([labels[i] for i in half]), strict=True))
        unit = max(attribute_unit([labels[i] for i in half]) for half in (calib, check))
        left_out = attribute_counts(labels)
        if any(c["left_out"] for c in left_out.values()):
            on_calib = [c["scored"] for c in attribute_counts([labels[i] for i in calib]).values() if c["scored"]]
            step = 100.0 / (len(on_calib) * min(on_calib))

        def quality_of(i: int, text: str) -> float:
            return weighted_quality(score(text, labels[i])["correct"], weights[i])
        measure = "mean attribute accuracy against the labels (canonical phrases)"
        if any(c["left_out"] for c in left_out.values()):
            measure += ", each attribute over the clips labelled for it"
    else:
        def quality_of(i: int, text: str) -> float:
            value, how = agreement(text, cloud_run.texts[i])
            used.add(how)
            return value
        measure = ""  # filled in below, once we know which agreement the clips needed

    scored = {r.name: (score_run(r, calib, quality_of), score_run(r, check, quality_of)) for r in runs}
    if labels is None:
        kinds = {"phrases": "per-attribute agreement with cloud-only's canonical phrases",
                 "chars": "character similarity (difflib) to cloud-only's sentence"}
        measure = "; ".join(kinds[u] for u in sorted(used, reverse=True)) or kinds["chars"]
    # The choices (calibration_objective.select): on the calibration half, each chain of settings
    # (sweep_chains) tested from its safest by the per-clip gap to cloud-only; the proposal's chain
    # then tested on the check half.
    per_clip: dict[str, tuple[list[ClipCost], list[ClipCost]]] = {}

    def costs(r: Run) -> tuple[list[ClipCost], list[ClipCost]]:
        if r.name not in per_clip:
            def half(idx: Sequence[int]) -> list[ClipCost]:
                return [clip_cost(r.stats[i], quality_of(i, r.texts[i])) for i in idx]
            per_clip[r.name] = (half(calib), half(check))
        return per_clip[r.name]

    def selection(settings_: Sequence[Run], points: float, key: Callable[[SettingScore], tuple]) -> Selection:
        cal_ref, chk_ref = costs(cloud_run)
        return select([(r.name, costs(r)[0]) for r in settings_], cal_ref, points, z=margin,
                      chains=sweep_chains({r.name: r.cfg for r in settings_}),
                      check=([(r.name, costs(r)[1]) for r in settings_], chk_ref), key=key, unit=unit)

    by_name = {r.name: r for r in runs}
    choices = []
    for name, points in (("quality", quality_points), ("fluent", fluent_points)):
        sel = selection(sweep, points, call_rate_key)
        r = by_name[sel.name]
        choices.append(Choice(name, points, r, *scored[r.name], sel.met, sel))
    choices = no_dearer_than_narrower(choices)
    gate_choice = None
    if fitted is not None:
        sel = selection(meaning, frugal_points, cost_key)
        r = by_name[sel.name]
        cal_costs, chk_costs = costs(r)
        gate_choice = GateChoice("frugal", frugal_points, r, score_clips(cal_costs), score_clips(chk_costs),
                                 sel.met, fitted, len(swaps), sum(w.changed for w in swaps), choices[1].run.cfg.threshold,
                                 margin, sel)

    header = [f"Presets written by `specdec calibrate` (specdec {__version__}, {time.strftime('%Y-%m-%d')}).",
              f"edge: {_shown(pair.models.edge_id)}", f"cloud: {_shown(pair.models.cloud_id)}",
              f"clips: {len(paths)} from {directory} ({len(calib)} calibration: 1st, 3rd, ...; "
              f"{len(check)} check: 2nd, 4th, ...)",
              f"quality measure: {measure}",
              *([f"labels left out: {left}"] if left_out and (left := left_out_line(left_out)) else []),
              f"sweep: k in {list(ks)}, thresholds = 0, the edge's block-uncertainty percentiles "
              f"[{', '.join(f'{p:g}' for p in percentiles)}] ({uncertainty}, nats), inf; max_new_tokens {max_new_tokens}",
              *([] if fitted is None else [
                  f"meaning gate: fitted on the calibration half ({_task(base)}); sweep: k in {list(ks)},",
                  f"  gate_upload at the blocks' meaning-score percentiles {list(GATE_UPLOAD_PERCENTILES)},",
                  f"  gate_verify at 0, {list(GATE_VERIFY_PERCENTILES)} and gate_upload"]),
              ("chosen on the calibration half, confirmed on the check half (calibration_objective.select, "
               f"--margin {margin:g})" if margin > 0 else "chosen on the calibration half (--margin 0: the plain rule)"),
              f"{len(runs) * len(paths)} decodes in {seconds:.0f} s", ""]
    text = presets_toml(choices, header, {"cloud-only": scored[cloud_run.name], "edge-only": scored[edge_run.name]})
    if gate_choice is not None:
        text += gate_presets_toml(gate_choice, len(calib))
    return Calibration(runs, scored, choices, measure, text, len(calib), len(check), gate_choice, left_out, unit, step)


def no_dearer_than_narrower(choices: list[Choice]) -> list[Choice]:
    """A setting shown within 1 point is within 3: a preset whose own choice costs more calls per
    token than one a narrower budget met (each budget's check can stop a different k's chain) takes
    that one, and says so."""
    out: list[Choice] = []
    for c in choices:
        narrower = [o for o in out if o.met and o.points <= c.points
                    and (not c.met or o.calib.call_rate < c.calib.call_rate)]
        if narrower:
            o = min(narrower, key=lambda o: (o.calib.call_rate, -o.calib.quality))
            c = Choice(c.name, c.points, o.run, o.calib, o.check, True, c.selection, o.name)
        out.append(c)
    return out


def _gate_settings_max() -> int:
    """An upper bound on gate_fit.sweep's settings per k at calibrate's percentiles (for progress)."""
    return len(GATE_UPLOAD_PERCENTILES) * (len(GATE_VERIFY_PERCENTILES) + 2)


def _task(cfg: DecodingConfig) -> str:
    from .decoding.gate import DEFAULT_INSTRUCTION

    return "the default task" if (cfg.instruction or DEFAULT_INSTRUCTION) == DEFAULT_INSTRUCTION else \
        f"the task {cfg.instruction!r}"


def _fit(pair: Pair, audios: Sequence[Any], answers: Sequence[list[int]], base: DecodingConfig, max_swaps: int,
         progress: Progress | None) -> tuple[MeaningGate, list[Any]]:
    """The meaning gate from the edge's own answers (gate_fit.fit_gate: edge work only), for the
    task `base` describes (its instruction and system turn: the gate records them, and applies only
    to them)."""
    from .gate_fit import fit_gate
    from .remote.wire import tokenizer_fingerprint

    if progress is not None:
        progress.running("gate fit")
    m = pair.models
    inputs = [pair.describer.inputs(a, base) for a in audios]
    return fit_gate(m.edge, inputs, answers, base, m.masks, m.eos_ids,
                    lambda ids: m.tokenizer.decode(ids, skip_special_tokens=True).strip(),
                    tokenizer_fingerprint(m.tokenizer), max_swaps=max_swaps)


def _shown(model: str) -> str:
    """A model folder relative to the working directory (as a user types it); a Hub id as is."""
    from .presets import shown as shown_path

    return shown_path(Path(model)) if Path(model).is_dir() else model
