"""Calibration (`specdec calibrate DIR --out presets.toml`): find the thresholds that mean "quality" and "fluent"
for any edge/cloud pair, on the user's own clips, in one process.

What it runs, on every clip: cloud-only, edge-only, and a threshold × k sweep of the speculative
mode. The thresholds are read off the edge itself: for each k, the percentiles of the block
uncertainties the edge produces on the calibration clips (a never-escalating run, threshold = inf,
which is also the sweep's cheapest point). That makes the grid fit any pair's scale: a 152k-token
Qwen vocabulary sums to several nats per block, the demo pair's 443-token vocabulary to about one.

Clips are split into alternating halves (1st, 3rd, … calibrate; 2nd, 4th, … check). The presets are
chosen on the calibration half only, as the cheapest setting (fewest cloud calls per output token)
whose quality is within `quality_points` / `fluent_points` of cloud-only's; the check half then says
how each choice holds up on clips it was not chosen on.

Quality, in points (0–100):
* with labels: mean attribute accuracy by the canonical phrases (`evaluate.score`, as `eval` scores);
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import __version__
from .decoding.config import DecodingConfig
from .errors import InputError, SpecdecError, one_line
from .phrases import ATTRIBUTES, agreement

if TYPE_CHECKING:
    from .describe import Description
    from .pair import Pair

PERCENTILES = (10, 25, 40, 50, 60, 75, 90)  # the default grid; --percentiles refines it


# -- scoring ---------------------------------------------------------------------------------------

def label_accuracy(text: str, labels: dict[str, str]) -> float:
    """Mean attribute accuracy of one description against its labels, in [0, 1] (eval's scoring)."""
    from .evaluate import score

    correct = score(text, labels)["correct"]
    return sum(correct.values()) / len(ATTRIBUTES)


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


def pick(candidates: Sequence[tuple[Run, Score]], target: float) -> tuple[Run, Score, bool]:
    """The cheapest candidate scoring at least `target`; ties go to the better quality, then the
    higher threshold. When none reaches it: the best quality (flagged False)."""
    fits = [(r, s) for r, s in candidates if s.quality >= target - 1e-9]
    if fits:
        r, s = min(fits, key=lambda rs: (rs[1].call_rate, -rs[1].quality, -rs[0].cfg.threshold))
        return r, s, True
    r, s = max(candidates, key=lambda rs: (rs[1].quality, -rs[1].call_rate))
    return r, s, False


# -- the presets file ------------------------------------------------------------------------------

def toml_float(x: float) -> str:
    return "inf" if math.isinf(x) else repr(float(x))


@dataclass(frozen=True)
class Choice:
    name: str
    points: float
    run: Run
    calib: Score
    check: Score
    met: bool


def presets_toml(choices: Sequence[Choice], header: Sequence[str], baselines: dict[str, tuple[Score, Score]]) -> str:
    """The presets file: a header saying what was measured on what, then one table per preset
    with its calibration-half and check-half scores as comments."""
    lines = [f"# {h}" if h else "#" for h in header]
    for name, (cal, chk) in baselines.items():
        lines.append(f"# {name}: quality {cal.quality:.1f} calibration / {chk.quality:.1f} check, "
                     f"cloud calls per token {cal.call_rate:.3f} / {chk.call_rate:.3f}")
    for c in choices:
        cfg = c.run.cfg
        how = "cheapest" if c.met else "none reached the target: best quality"
        lines += ["", f"[{c.name}]",
                  f'description = "{how} within {c.points:g} point(s) of cloud-only (specdec calibrate)"',
                  f"threshold = {toml_float(cfg.threshold)}", f"k = {cfg.k}", f'uncertainty = "{cfg.uncertainty}"',
                  f'verify = "{cfg.verify}"',
                  f"# calibration half: quality {c.calib.quality:.1f}, cloud calls per token {c.calib.call_rate:.3f}",
                  f"# check half:       quality {c.check.quality:.1f}, cloud calls per token {c.check.call_rate:.3f}"]
    return "\n".join(lines) + "\n"


# -- the inputs ------------------------------------------------------------------------------------

def clips_for(directory: Path, labels: Path | None) -> tuple[list[str], list[Path], list[dict[str, str]] | None]:
    """The clips to calibrate on (names relative to `directory`, paths) and their labels (None
    without a labels file: then every audio file of `directory`)."""
    if labels is not None:
        from .evaluate import read_labels

        clips = read_labels(labels, directory)
        return [c.file for c in clips], [c.path for c in clips], [c.labels for c in clips]
    from .results import find_audio

    paths = find_audio(directory).files
    return [str(p.relative_to(directory)) for p in paths], paths, None


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


def _record(out: Description, run: Run) -> None:
    run.texts.append(out.text)
    run.tokens.append(out.result.stats.tokens)
    run.calls.append(out.result.stats.cloud_calls)
    run.uncertainties.append([e.uncertainty for e in out.result.events])


def calibrate(pair: Pair, names: Sequence[str], paths: Sequence[Path], labels: Sequence[dict[str, str]] | None, *,
              directory: Path, ks: Sequence[int], percentiles: Sequence[float], uncertainty: str = "sum",
              max_new_tokens: int = 64, batch_size: int = 8, settings: dict[str, Any] | None = None,
              quality_points: float = 1.0,
              fluent_points: float = 3.0, progress: Progress | None = None) -> Calibration:
    """Run cloud-only, edge-only and the threshold x k sweep over the clips, pick the presets on the
    calibration half and score them on the check half (see the module doc). `settings`: explicit
    decoding settings every run shares (sampling, the prompt). A clip that fails stops the
    calibration (its presets would be chosen on holes), naming the clip."""
    from .describe import describe_many
    from .evaluate import warm_up

    if len(paths) < 2:
        raise InputError(f"calibration needs at least 2 clips (one per half); {directory} has {len(paths)}")
    calib = list(range(0, len(paths), 2))
    check = list(range(1, len(paths), 2))
    audios = [pair.read(p)[1] for p in paths]
    warm_up(pair.describer, audios[0])

    base = DecodingConfig(max_new_tokens=max_new_tokens, uncertainty=uncertainty).with_(**(settings or {}))  # type: ignore[arg-type]
    start = time.perf_counter()
    runs: list[Run] = []
    total = len(paths) * (2 + len(ks) * (len(percentiles) + 2))  # grows exact once the thresholds are known
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
    seconds = time.perf_counter() - start

    # Scoring: labels if given, else agreement with cloud-only's sentence for the same clip.
    used: set[str] = set()
    if labels is not None:
        def quality_of(i: int, text: str) -> float:
            return label_accuracy(text, labels[i])
        measure = "mean attribute accuracy against the labels (canonical phrases)"
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
    cloud_cal = scored[cloud_run.name][0].quality
    candidates = [(r, scored[r.name][0]) for r in sweep]
    choices = []
    for name, points in (("quality", quality_points), ("fluent", fluent_points)):
        r, s, met = pick(candidates, cloud_cal - points)
        choices.append(Choice(name, points, r, s, scored[r.name][1], met))

    header = [f"Presets written by `specdec calibrate` (specdec {__version__}, {time.strftime('%Y-%m-%d')}).",
              f"edge: {_shown(pair.models.edge_id)}", f"cloud: {_shown(pair.models.cloud_id)}",
              f"clips: {len(paths)} from {directory} ({len(calib)} calibration: 1st, 3rd, ...; "
              f"{len(check)} check: 2nd, 4th, ...)",
              f"quality measure: {measure}",
              f"sweep: k in {list(ks)}, thresholds = 0, the edge's block-uncertainty percentiles "
              f"[{', '.join(f'{p:g}' for p in percentiles)}] ({uncertainty}, nats), inf; max_new_tokens {max_new_tokens}",
              f"chosen on the calibration half; {len(runs) * len(paths)} decodes in {seconds:.0f} s", ""]
    text = presets_toml(choices, header, {"cloud-only": scored[cloud_run.name], "edge-only": scored[edge_run.name]})
    return Calibration(runs, scored, choices, measure, text, len(calib), len(check))


def _shown(model: str) -> str:
    """A model folder relative to the working directory (as a user types it); a Hub id as is."""
    from .presets import shown as shown_path

    return shown_path(Path(model)) if Path(model).is_dir() else model
