"""The meaning gate (issue 26) on held-out demo clips: calibrate on one set, measure on another.

Run by hand from a checkout (needs espeak-ng for the clips):

    python bench/gate.py [--json out.json] [--work DIR] [--clips 48] [--cal-start 200] [--meas-start 300]
                         [--ks 6,8,10,12] [--batch-size 8] [--frontier]

1. Two sets of held-out demo clips (`python -m specdec_cli.demo.heldout`: clips the trainer never
   saw, labelled): `--clips` from `--cal-start` to calibrate on, as many from `--meas-start` to
   measure on. The set calibrate ships the demo presets from is clips 0-95; the defaults stay clear
   of it, so today's presets are measured on clips they were not chosen on either.
2. Calibration set: cloud-only, edge-only, today's quality and fluent presets (the bundled
   presets file); the meaning gate fitted by self-labelled swaps on the edge-only answers
   (specdec_cli/gate_fit.py); a sweep of k x gate_upload x gate_verify (thresholds from the
   percentiles of the edge-only blocks' meaning scores, gate_verify <= gate_upload); the settings
   chosen by specdec_cli/calibration_objective.choose within 1 point ("meaning-1") and 3 points
   ("meaning-3") of cloud-only by calibrate's rule at its default margin (z = 1: a lower bound on
   the per-clip gap for the set's size, each (k, gate_upload) tested from gate_verify 0 up, z
   raised for the number of such chains; calibrate.sweep_chains; no check set here: the
   measurement set is the check), cost = cloud work per clip (a clip that goes up pays its
   prefill), then calls per token; and, for comparison, the plain rule (z = 0: "meaning-1 z0",
   "meaning-3 z0"). The control: today's entropy gate swept the same way (k x threshold,
   thresholds at percentiles of the edge's block uncertainties up to the 98th) and chosen by the
   same objective and rule ("entropy-1", "entropy-3"), so what the meaning gate adds is told apart
   from what the sweep and the objective add.
3. Measurement set (never seen by step 2): every baseline and chosen setting. Per setting:
   zero-cloud share (clips the cloud never ran for), mean attribute accuracy and its distance to
   cloud-only, cloud calls per output token, bytes up per clip (the clip's FLAC, as
   remote/wire.encode_audio sends it, when the clip went up at all), cloud work per clip (prefill +
   tokens fed: the record's cloud_work_tokens).
   `--frontier`: the same sweep on the measurement set too, to show the best any threshold could
   do there (an oracle: chosen on the clips it is scored on): per number of zero-cloud clips, the
   best accuracy any setting reached.
   `--per-clip FILE`: every setting's per-clip numbers on both sets (to try other objectives
   without decoding again).
   `--presets-out FILE`: the presets this measurement supports, as TOML for the demo pair's
   presets files (docs/meaning-gate.md, section 7): `frugal`, fluent's budget on the meaning gate
   ("meaning-3"; its entropy threshold, the fallback for another task, is fluent's), and the
   fitted `[gate]` table.
   `--trace N,M`: the blocks of measurement clips N, M under the "meaning-1" choice (or the sweep
   setting `--trace-setting` names, e.g. "k=6 up=0.485 ver=0.246") and under "entropy-1": each draft
   token with its entropy and meaning score, the block's score against the threshold it was judged
   by (gate_upload before the clip went up, gate_verify after), the decision and the verdict.

Decoding goes through the batched engine (decoding/batch_loop.py, `--batch-size` rows), as
calibrate does; cloud-only and edge-only through `generate_batch` (HF generate's tokens). Greedy
throughout. The JSON holds every setting's numbers on both sets, the fitted gate's size and the
swaps it was fitted on; the table goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/gate.py` from a checkout that is not installed
    sys.path.insert(0, str(REPO))

from specdec_cli.audio import load_audio  # noqa: E402
from specdec_cli.calibrate import label_accuracy, sweep_chains, thresholds_for  # noqa: E402
from specdec_cli.calibration_objective import ClipCost, SettingScore, choose, clip_cost, score_clips  # noqa: E402
from specdec_cli.decoding import DecodingConfig  # noqa: E402
from specdec_cli.decoding.batch_loop import generate_batch, speculative_decode_batch  # noqa: E402
from specdec_cli.decoding.gate import MeaningGate  # noqa: E402
from specdec_cli.demo.heldout import write_heldout  # noqa: E402
from specdec_cli.evaluate import read_labels  # noqa: E402
from specdec_cli.gate_fit import fit_gate, sweep_named  # noqa: E402
from specdec_cli.gate_presets import gate_toml, meaning_preset_lines  # noqa: E402
from specdec_cli.models import ModelPair, demo_pair, load_pair  # noqa: E402
from specdec_cli.presets import resolve  # noqa: E402
from specdec_cli.prompt import render_prompt  # noqa: E402
from specdec_cli.remote.wire import encode_audio, tokenizer_fingerprint  # noqa: E402


class ClipSet:
    """One set of labelled clips, ready to decode."""

    def __init__(self, pair: ModelPair, directory: Path) -> None:
        clips = read_labels(directory / "labels.jsonl", directory)
        rate = pair.processor.sampling_rate
        audios = [load_audio(c.path, rate, pair.processor.max_seconds) for c in clips]
        self.audios = audios
        self.names = [c.file for c in clips]
        self.labels = [c.labels for c in clips]
        # The thinker inputs for the default task, as `specdec describe` builds them.
        self.inputs = [pair.processor(a, render_prompt()).to(pair.edge.device) for a in audios]
        self.upload = [len(encode_audio(a, rate)[0]) for a in audios]


def decode(pair: ModelPair, clips: ClipSet, cfg: DecodingConfig, gate: MeaningGate | None, batch: int) -> list:
    """DecodeResults per clip, in clip order."""
    keyed = list(enumerate(clips.inputs))
    if cfg.mode == "spec":
        got = speculative_decode_batch(pair.edge, pair.cloud, keyed, cfg, pair.masks, pair.eos_ids, batch, gate=gate)
    else:
        got = generate_batch(pair.cloud if cfg.mode == "cloud" else pair.edge, keyed, cfg, pair.masks, pair.eos_ids,
                             batch)
    out: list = [None] * len(keyed)
    for i, result in got:
        out[i] = result
    return out


def clip_dirs(work: Path, clips: int, cal_start: int, meas_start: int) -> dict[str, Path]:
    """The calibration and measurement folders under `work` (`cal`, `meas`), each holding `clips`
    held-out clips from its start (synthesised unless a labels.jsonl is already there)."""
    dirs = {"calibration": work / "cal", "measurement": work / "meas"}
    for directory, start in zip(dirs.values(), (cal_start, meas_start), strict=True):
        if not (directory / "labels.jsonl").is_file():
            write_heldout(directory, clips, start)
    return dirs


def bench_pair(edge: Path | None, noised: float | None, tmp: Path, cloud: Path | None = None) -> ModelPair:
    """The pair a bench measures: the bundled demo pair, with `edge` (a checkpoint folder) or the
    noised pair's edge (bench/link.py: the bundled cloud plus `noised` x each tensor's std of noise,
    written under `tmp`) in place of the demo edge, and `cloud` (a checkpoint folder) in place of
    the demo cloud (a pair not yet bundled, e.g. demo pair v4 before it ships)."""
    if noised is not None:
        from link import noised_copy  # bench/link.py, beside this file

        edge = noised_copy(Path(demo_pair()[1]), tmp / "noised-edge", noised)
    return load_pair(str(edge) if edge else None, str(cloud) if cloud else None)


def text_of(pair: ModelPair, ids: list[int]) -> str:
    return pair.tokenizer.decode(ids, skip_special_tokens=True).strip()


def costs(pair: ModelPair, clips: ClipSet, results: Sequence) -> list[ClipCost]:
    return [clip_cost(r.stats, label_accuracy(text_of(pair, r.tokens), labels), upload)
            for labels, upload, r in zip(clips.labels, clips.upload, results, strict=True)]


def as_dict(s: SettingScore) -> dict[str, float]:
    return {"zero_cloud_share": s.zero_cloud_share, "accuracy": s.quality, "calls_per_token": s.call_rate,
            "bytes_up_per_clip": s.bytes_per_clip, "cloud_work_tokens_per_clip": s.work_per_clip}


def cfg_dict(cfg: DecodingConfig) -> dict[str, Any]:
    keys = ("mode", "k", "threshold", "verify", "gate_upload", "gate_verify")
    return {k: (v if not (isinstance(v, float) and math.isinf(v)) else "inf") for k, v in cfg.as_dict().items()
            if k in keys}


def sweep_configs(pair: ModelPair, clips: ClipSet, gate: MeaningGate, ks: Sequence[int], batch: int,
                  base: DecodingConfig) -> dict[str, DecodingConfig]:
    """k x gate_upload x gate_verify (gate_fit.sweep), the thresholds from the blocks' meaning
    scores in a run that never escalates (its events carry each block's score)."""
    configs: dict[str, DecodingConfig] = {}
    for k in ks:
        never = base.with_(k=k, verify="meaning", gate_upload=math.inf, gate_verify=math.inf)
        configs.update(sweep_named(base, k, [e.score for r in decode(pair, clips, never, gate, batch) for e in r.events]))
    return configs


ENTROPY_PERCENTILES = (10, 25, 40, 50, 60, 70, 80, 90, 95, 98)


def entropy_configs(pair: ModelPair, clips: ClipSet, ks: Sequence[int], batch: int,
                    base: DecodingConfig) -> dict[str, DecodingConfig]:
    """Today's gate swept as calibrate sweeps it (thresholds at percentiles of the block
    uncertainties a never-escalating run drafts), up to the 98th percentile so that clips can stay
    on the device; not inf (edge-only)."""
    configs: dict[str, DecodingConfig] = {}
    for k in ks:
        never = base.with_(k=k, threshold=math.inf)
        uncertainties = [e.uncertainty for r in decode(pair, clips, never, None, batch) for e in r.events]
        for t in thresholds_for(uncertainties, ENTROPY_PERCENTILES):
            if not math.isinf(t):
                configs[f"entropy k={k} t={t:g}"] = base.with_(k=k, threshold=t)
    return configs


def table(rows: dict[str, dict[str, float]], cloud_accuracy: float) -> str:
    head = f"{'setting':<42} {'zero-cloud':>10} {'accuracy':>9} {'vs cloud':>9} {'calls/tok':>9} {'bytes up':>9} {'work tok':>9}"
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        lines.append(f"{name:<42} {100 * r['zero_cloud_share']:>9.1f}% {r['accuracy']:>8.1f}% "
                     f"{r['accuracy'] - cloud_accuracy:>+9.1f} {r['calls_per_token']:>9.3f} "
                     f"{r['bytes_up_per_clip']:>9.0f} {r['cloud_work_tokens_per_clip']:>9.1f}")
    return "\n".join(lines)


def trace(pair: ModelPair, clips: ClipSet, i: int, cfg: DecodingConfig, gate: MeaningGate) -> list[str]:
    """One clip's blocks as text lines: tokens with entropy / meaning score, the gate's reading and
    the decision, the cloud's verdict."""
    from specdec_cli.decoding import speculative_decode

    events = []
    result = speculative_decode(pair.edge, pair.cloud, clips.inputs[i], cfg, pair.masks, pair.eos_ids,
                                on_block=events.append, gate=gate)
    tok = pair.tokenizer
    lines = []
    for e in events:
        cells = " ".join(f"{tok.decode([t])}({h:.2f}/{m:.2f})" for t, h, m in
                         zip(e.draft, e.entropies, e.meaning or [0.0] * len(e.draft), strict=True))
        decision = (f"UP ({e.reason}: {e.score:.3f} > {e.limit:g})" if e.escalated
                    else f"stays ({e.gate} {e.score:.3f} <= {e.limit:g}; entropy sum {e.uncertainty:.2f})")
        verdict = (f" -> kept {e.accepted}/{len(e.draft)}, cloud {e.correction_kind} "
                   f"{tok.decode([e.correction])!r}" if e.escalated else "")
        lines.append(f"block {e.index + 1}: {cells} | {decision}{verdict}")
    lines.append(f"answer: {text_of(pair, result.tokens)} (labels: {''.join(clips.labels[i].values())}; "
                 f"cloud forwards {result.stats.cloud_work_forwards})")
    return lines


def staged_presets(cfg: DecodingConfig, gate: MeaningGate, fluent: dict[str, Any], result: dict[str, Any]) -> str:
    """frugal (fluent's budget on the meaning gate) + the [gate] table, with what was measured as
    comments: the text the demo pair's presets files carry (docs/meaning-gate.md, section 7)."""
    cal = result["calibration"]
    meas = result["measurement"]
    row = next(v for n, v in meas.items() if n.startswith("meaning-3 ("))
    cal_row = next(v for n, v in cal.items() if n.startswith("meaning-3 ("))
    lines = ["# Staged by bench/gate.py: frugal, fluent's budget on the meaning gate, chosen within 3 points of",
             f"# cloud-only on {result['clips']['calibration']} (specdec_cli/calibration_objective.choose, "
             "calibrate's rule, z = 1),",
             f"# measured on {result['clips']['measurement']}. The demo pair's presets files",
             "# (specdec_cli/demo/models/{edge,cloud}/specdec_presets.toml) carry this text after their presets.",
             ""]
    comments = [f"{name}: zero-cloud {100 * r['zero_cloud_share']:.1f}%, accuracy {r['accuracy']:.1f}%, "
                f"cloud calls per token {r['calls_per_token']:.3f}, bytes up per clip {r['bytes_up_per_clip']:.0f}, "
                f"cloud work per clip {r['cloud_work_tokens_per_clip']:.1f} tokens"
                for name, r in (("calibration", cal_row), ("measurement", row))]
    lines += meaning_preset_lines("frugal", "cheapest within 3 point(s) of cloud-only on the meaning gate (bench/gate.py)",
                                  cfg.k, cfg.uncertainty, float(fluent["threshold"]), cfg.gate_upload, cfg.gate_verify,
                                  comments)
    return "\n".join(lines) + "\n\n" + gate_toml(gate, f"fitted by bench/gate.py on {result['clips']['calibration']}")


def frontier(sweep: dict[str, SettingScore], n: int) -> list[dict[str, Any]]:
    """Per number of zero-cloud clips, the setting with the best accuracy (the frontier's points)."""
    best: dict[int, tuple[str, SettingScore]] = {}
    for name, s in sweep.items():
        zero = round(s.zero_cloud_share * n)
        if zero not in best or s.quality > best[zero][1].quality:
            best[zero] = (name, s)
    return [{"zero_cloud_clips": z, "setting": best[z][0], **as_dict(best[z][1])} for z in sorted(best)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here (JSON)")
    ap.add_argument("--work", type=Path, help="folder for the clips (default: a temporary one)")
    ap.add_argument("--clips", type=int, default=48)
    ap.add_argument("--cal-start", type=int, default=200)
    ap.add_argument("--meas-start", type=int, default=300)
    ap.add_argument("--ks", default="6,8,10,12")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--frontier", action="store_true", help="also sweep on the measurement set (oracle)")
    ap.add_argument("--per-clip", type=Path, help="write every setting's per-clip numbers here (JSON)")
    ap.add_argument("--presets-out", type=Path, help="write the supported presets + [gate] table here (TOML)")
    ap.add_argument("--trace", default="", help="measurement clips to trace under meaning-1 (comma list)")
    ap.add_argument("--trace-setting", default="", help="trace under this sweep setting instead of meaning-1")
    ap.add_argument("--edge", type=Path, help="an edge checkpoint folder instead of the bundled demo edge")
    ap.add_argument("--noised-edge", type=float, metavar="SCALE",
                    help="the edge: the bundled cloud plus Gaussian noise of SCALE x each tensor's std "
                         "(bench/link.py's noised pair)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    ks = [int(x) for x in args.ks.split(",")]
    started = time.perf_counter()

    with tempfile.TemporaryDirectory() as tmp:
        dirs = clip_dirs(args.work or Path(tmp), args.clips, args.cal_start, args.meas_start)
        pair = bench_pair(args.edge, args.noised_edge, Path(tmp))
        sets = {name: ClipSet(pair, d) for name, d in dirs.items()}

    base = DecodingConfig()
    presets = {name: resolve(name, pair.presets_file).values for name in ("quality", "fluent")}
    fixed = {"cloud-only": base.with_(mode="cloud"), "edge-only": base.with_(mode="edge"),
             **{f"{n} (today)": base.with_(**{k: v for k, v in p.items() if k in ("k", "threshold", "uncertainty",
                                                                                     "verify")})
                for n, p in presets.items()}}
    cal, meas = sets["calibration"], sets["measurement"]

    def run_all(clips: ClipSet, configs: dict[str, DecodingConfig], gate: MeaningGate | None) -> dict[str, list[ClipCost]]:
        return {name: costs(pair, clips, decode(pair, clips, cfg, gate, args.batch_size))
                for name, cfg in configs.items()}

    def scores(per_clip: dict[str, list[ClipCost]]) -> dict[str, SettingScore]:
        return {name: score_clips(c) for name, c in per_clip.items()}

    # -- calibration ---------------------------------------------------------------------------------
    cal_fixed = run_all(cal, fixed, None)
    edge_answers = [r.tokens for r in decode(pair, cal, fixed["edge-only"], None, args.batch_size)]
    t = time.perf_counter()
    gate, swaps = fit_gate(pair.edge, cal.inputs, edge_answers, base, pair.masks, pair.eos_ids,
                           lambda ids: text_of(pair, ids), tokenizer_fingerprint(pair.tokenizer))
    fit_s = time.perf_counter() - t
    configs = sweep_configs(pair, cal, gate, ks, args.batch_size, base)
    entropy = entropy_configs(pair, cal, ks, args.batch_size, base)
    cal_sweep = run_all(cal, configs, gate)
    cal_entropy = run_all(cal, entropy, None)
    configs.update(entropy)
    chosen: dict[str, tuple[str, bool]] = {}
    for points in (1.0, 3.0):
        for z in (1.0, 0.0):
            label = f"meaning-{points:g}" + ("" if z else " z0")
            name, _, met = choose(list(cal_sweep.items()), cal_fixed["cloud-only"], points, z,
                                  chains=sweep_chains({n: configs[n] for n in cal_sweep}))
            chosen[label] = (name, met)
        name, _, met = choose(list(cal_entropy.items()), cal_fixed["cloud-only"], points, 1.0,
                              chains=sweep_chains(entropy))
        chosen[f"entropy-{points:g}"] = (name, met)
    cal_sweep.update(cal_entropy)

    # -- measurement ----------------------------------------------------------------------------------
    meas_fixed = run_all(meas, fixed, None)
    picked = sorted({name for name, _ in chosen.values()})
    meas_picked = run_all(meas, {name: configs[name] for name in picked}, gate)

    def rows_for(fixed_scores: dict[str, SettingScore], sweep_scores: dict[str, SettingScore]) -> dict[str, dict]:
        return {**{n: as_dict(s) for n, s in fixed_scores.items()},
                **{f"{label} ({name})": as_dict(sweep_scores[name]) for label, (name, _) in chosen.items()}}

    cal_rows = rows_for(scores(cal_fixed), scores(cal_sweep))
    meas_rows = rows_for(scores(meas_fixed), scores(meas_picked))
    result: dict[str, Any] = {
        "edge": (f"the bundled cloud plus noise x{args.noised_edge} of each tensor's std"
                 if args.noised_edge is not None else str(args.edge or "the bundled demo edge")),
        "clips": {"calibration": f"held-out {args.cal_start}..{args.cal_start + args.clips - 1}",
                  "measurement": f"held-out {args.meas_start}..{args.meas_start + args.clips - 1}"},
        "gate": {"weights": len(gate.weights), "swaps": len(swaps), "swaps_changed": sum(s.changed for s in swaps),
                 "fit_seconds": round(fit_s, 1)},
        "chosen": {label: {"setting": name, "met": met, **cfg_dict(configs[name])} for label, (name, met) in chosen.items()},
        "calibration": cal_rows,
        "measurement": meas_rows,
    }
    per_clip = {"calibration": {**cal_fixed, **cal_sweep}, "measurement": {**meas_fixed, **meas_picked}}
    meaning_names = [n for n in configs if not n.startswith("entropy")]
    entropy_names = [n for n in configs if n.startswith("entropy")]
    cal_scores = scores(cal_sweep)
    result["calibration_frontier"] = frontier({n: cal_scores[n] for n in meaning_names}, args.clips)
    result["calibration_frontier_entropy"] = frontier({n: cal_scores[n] for n in entropy_names}, args.clips)
    if args.frontier:
        meas_sweep = run_all(meas, configs, gate)
        per_clip["measurement"].update(meas_sweep)
        meas_scores = scores(meas_sweep)
        result["measurement_frontier"] = frontier({n: meas_scores[n] for n in meaning_names}, args.clips)
        result["measurement_frontier_entropy"] = frontier({n: meas_scores[n] for n in entropy_names}, args.clips)
        result["measurement_sweep"] = {n: as_dict(s) for n, s in meas_scores.items()}
    result["calibration_sweep"] = {n: as_dict(s) for n, s in cal_scores.items()}
    result["seconds"] = round(time.perf_counter() - started, 1)

    print(f"calibration set ({result['clips']['calibration']}):", file=sys.stderr)
    print(table(cal_rows, cal_rows["cloud-only"]["accuracy"]), file=sys.stderr)
    print(f"\nmeasurement set ({result['clips']['measurement']}), never seen by the calibration:", file=sys.stderr)
    print(table(meas_rows, meas_rows["cloud-only"]["accuracy"]), file=sys.stderr)
    for name in ("calibration_frontier", "calibration_frontier_entropy", "measurement_frontier",
                 "measurement_frontier_entropy"):
        if name in result:
            print(f"\n{name.replace('_', ' ')} (best accuracy per number of zero-cloud clips, any setting):",
                  file=sys.stderr)
            print(table({f"{p['zero_cloud_clips']:>2} clips: {p['setting']}": p for p in result[name]},
                        (cal_rows if name.startswith("cal") else meas_rows)["cloud-only"]["accuracy"]), file=sys.stderr)
    traces = [int(x) for x in args.trace.split(",") if x.strip()]
    if traces:
        traced = {"traces": args.trace_setting or chosen["meaning-1"][0], "traces_entropy": chosen["entropy-1"][0]}
        for key, setting in traced.items():
            result[key] = {meas.names[i]: trace(pair, meas, i, configs[setting], gate) for i in traces}
            result[key + "_setting"] = setting
            for name, lines in result[key].items():
                print(f"\n{name} ({setting}):\n" + "\n".join(lines), file=sys.stderr)
    result["gate_toml"] = gate_toml(gate, f"fitted by bench/gate.py on {result['clips']['calibration']}")
    if args.presets_out:
        args.presets_out.write_text(staged_presets(configs[chosen["meaning-3"][0]], gate, presets["fluent"], result),
                                    encoding="utf-8")
    if args.per_clip:
        args.per_clip.write_text(json.dumps({s: {n: [list(vars(c).values()) for c in cs] for n, cs in d.items()}
                                             for s, d in per_clip.items()}), encoding="utf-8")
    text = json.dumps(result, indent=2, ensure_ascii=False)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
