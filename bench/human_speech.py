"""What the demo pair says about real people: recordings of human speakers shipped in Debian and npm
packages (bench/fetch_human_speech.sh), measured like every demo clip (demo contract v3: the
speaker's documented gender, the rest measured from the audio), described in each mode, and
scored per attribute where the measure is clear of the gaps. Evaluation only: nothing here is
trained or tuned on these recordings.

    bench/fetch_human_speech.sh .demo-work/human
    python bench/human_speech.py --clips .demo-work/human [--edge DIR --cloud DIR] [--modes cloud,edge,quality] \
        [--json docs/results/bench-human-v4.json]

`--channels clean,telephone,codec,room,far_field` (demo contract v4) also hears every recording through
a channel of each family (specdec_cli/demo/channel.py, drawn per file from a fixed seed): gender stays
the speaker's, rate, pitch and pauses the recording's own measures (a line does not change them), and
volume is measured again on the clip as heard. Results are summarised per channel, per mode and per
speaker group (the package, and for the telephone prompts the voice).

Clips shorter than --min-seconds (default 1.0: single words say little about rate or pauses), longer
than the demo pair's 30 s window, and without a documented gender are left out. Gender is scored against the documented one; every
other attribute against its measured band (an ambiguous measure is not scored).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specdec_cli.demo.measure import labels_of, measure_file, values  # noqa: E402
from specdec_cli.phrases import ATTRIBUTES, predict  # noqa: E402


def source_of(entry: dict) -> str:
    """A speaker group: the package and, for the Asterisk prompts, the voice's folder."""
    path = entry.get("path", "")
    for part in path.split("/"):
        if "_f_" in part or "_m_" in part:
            return f"{entry['package']} ({part})"
    return entry["package"]


def load_clips(folder: Path, min_seconds: float) -> list[dict]:
    manifest = [json.loads(x) for x in (folder / "manifest.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    genders = {json.loads(x)["file"]: json.loads(x)["gender"]
               for x in (folder / "genders.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()}
    out = []
    for e in manifest:
        if e["file"] not in genders or not min_seconds <= e.get("duration_s", 0) <= MAX_SECONDS:
            continue
        m = measure_file(folder / e["file"])
        labels, ambiguous = labels_of(m, genders[e["file"]])
        out.append({"file": e["file"], "source": source_of(e), "language": e.get("language"),
                    "seconds": e.get("duration_s"), "labels": labels, "ambiguous": ambiguous,
                    "measures": {"f0_hz": m.f0_hz, "rate": m.rate, "level_dbfs": m.level_dbfs,
                                 "pause_share": m.pause_share, "semitones": values(m, genders[e["file"]])["pitch"]}})
    return out


MAX_SECONDS = 29.5  # the demo pair's window (30 s): longer recordings would need segmenting

MODES = {"cloud": {"mode": "cloud"}, "edge": {"mode": "edge"}, "quality": {"preset": "quality"},
         "fluent": {"preset": "fluent"}, "frugal": {"preset": "frugal"}}


def heard(clips: list[dict], family: str) -> list[tuple[object, dict]]:
    """Per clip: (what the pair is given, its labels) through a channel of `family` ("clean": the
    file itself). The channel is drawn from a seed made of the family and the file name."""
    import random

    import numpy as np

    from specdec_cli.audio import load_audio
    from specdec_cli.demo import channel
    from specdec_cli.demo.measure import MEASURE_RATE, band, emotion_of, measure_level

    out = []
    for c in clips:
        if family == "clean":
            out.append((str(c["clip_path"]), c["labels"]))
            continue
        x = load_audio(c["clip_path"], MEASURE_RATE, MAX_SECONDS + 1)
        steps = channel.draw(random.Random(f"human/{family}/{c['file']}"), family)
        power = float(np.mean(np.asarray(x, dtype=np.float64) ** 2)) or 1e-8
        y = channel.apply(x, steps, power)
        peak = float(np.max(np.abs(y))) or 1.0
        if peak > 0.98:  # a room or noise may push the peak over full scale: lower the whole clip
            y = (y * 0.98 / peak).astype(np.float32)
        labels = {a: v for a, v in c["labels"].items() if a not in ("volume", "emotion")}
        vol = band("volume", measure_level(y, MEASURE_RATE))
        if vol is not None:
            labels["volume"] = vol
        emo = emotion_of(labels.get("rate"), labels.get("pitch"))
        if emo is not None:
            labels["emotion"] = emo
        out.append((y, labels))
    return out


def run(clips: list[dict], edge: str | None, cloud: str | None, modes: list[str],
        channels: tuple[str, ...] = ("clean",)) -> dict:
    from specdec import Pair
    from specdec_cli.demo.measure import MEASURE_RATE
    from specdec_cli.errors import InputError

    pair = Pair(edge=edge, cloud=cloud)
    res: dict = {"modes": {}, "channels": {}}
    for family in channels:
        given = heard(clips, family)
        by_mode: dict = {}
        for mode in modes:
            t0 = time.time()
            rows = []
            for c, (audio, labels) in zip(clips, given, strict=True):
                rate = None if isinstance(audio, str) else MEASURE_RATE
                try:
                    r = pair.describe(audio, rate, **MODES[mode])
                except InputError as exc:  # e.g. a spelled letter the speech check finds no speech in
                    rows.append({"file": c["file"], "skipped": str(exc), "labels": labels, "correct": {}})
                    continue
                pred = predict(r.description or "")
                rows.append({"file": c["file"], "description": r.description, "predicted": pred, "labels": labels,
                             "correct": {a: pred[a] == v for a, v in labels.items()},
                             "cloud_calls": r.cloud_calls, "tokens": r.tokens})
            by_mode[mode] = {"rows": rows, "seconds": round(time.time() - t0, 1)}
        res["channels"][family] = by_mode
    # `modes` stays the clean run's (the JSON before channels were measured had it alone)
    res["modes"] = res["channels"].get("clean", {})
    return res


def summarise(clips: list[dict], res: dict, modes: dict | None = None) -> dict:
    by_file = {c["file"]: c for c in clips}
    out = {}
    for mode, m in (res["modes"] if modes is None else modes).items():
        tot: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for r in m["rows"]:
            src = by_file[r["file"]]["source"]
            for a, ok in r["correct"].items():
                tot[a][0] += ok
                tot[a][1] += 1
                groups[src][a][0] += ok
                groups[src][a][1] += 1
        out[mode] = {"skipped": sum(1 for r in m["rows"] if "skipped" in r),  # refused inputs, unscored
                     "attributes": {a: {"correct": c, "scored": n, "accuracy": c / n if n else None}
                                    for a, (c, n) in tot.items()},
                     "mean_accuracy": (sum(c / n for c, n in tot.values() if n) / sum(1 for _, n in tot.values() if n))
                     if tot else None,
                     "groups": {g: {a: {"correct": c, "scored": n} for a, (c, n) in v.items()} for g, v in groups.items()}}
    return out


def table(summary: dict, clips: list[dict]) -> str:
    cols = list(ATTRIBUTES)
    lines = ["| mode | " + " | ".join(cols) + " | mean |", "|---|" + "---|" * (len(cols) + 1)]
    for mode, s in summary.items():
        cells = []
        for a in cols:
            x = s["attributes"].get(a)
            cells.append(f"{100 * x['accuracy']:.0f} % ({x['scored']})" if x and x["scored"] else "–")
        lines.append(f"| {mode} | " + " | ".join(cells) + f" | {100 * s['mean_accuracy']:.1f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=Path, required=True, help="bench/fetch_human_speech.sh's output folder")
    ap.add_argument("--edge", default=None)
    ap.add_argument("--cloud", default=None)
    ap.add_argument("--modes", default="cloud,edge,quality")
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--limit", type=int, default=None, help="every n-th clip, up to N (a quick look)")
    ap.add_argument("--channels", default="clean",
                    help="channel families to hear every clip through (clean,telephone,codec,room,far_field)")
    ap.add_argument("--label", default=None, help="a name for the pair in the JSON (e.g. v3, v4)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    clips = load_clips(args.clips, args.min_seconds)
    if args.limit:
        clips = clips[::max(1, len(clips) // args.limit)][:args.limit]
    for c in clips:
        c["clip_path"] = args.clips / c["file"]
    channels = tuple(args.channels.split(","))
    res = run(clips, args.edge, args.cloud, args.modes.split(","), channels)
    summary = summarise(clips, res)
    doc = {"label": args.label, "clips": [{k: v for k, v in c.items() if k != "clip_path"} for c in clips],
           "sources": sorted({c["source"] for c in clips}), "results": res, "summary": summary,
           "channels": {f: summarise(clips, res, res["channels"][f]) for f in channels},
           "command": "python bench/human_speech.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(f"{len(clips)} clips from {len(doc['sources'])} speaker groups")
    for f in channels:
        print(f"channel: {f}")
        print(table(doc["channels"][f], clips))
        for mode, sm in doc["channels"][f].items():
            print(f"  {mode}, gender per speaker group: " + "; ".join(
                f"{g} {v['gender']['correct']}/{v['gender']['scored']}" for g, v in sorted(sm["groups"].items())))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
