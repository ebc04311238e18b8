"""The picture of the demo labels (demo contract v3): each measure's distribution per voice group,
with the bands of cut_points.json shaded (the gaps between them left white), over corpus v4's clips (and, with --human, the real
recordings of bench/fetch_human_speech.sh, measured the same way).

    python bench/measure_distributions.py [--corpus .demo-work/corpus-v4] [--human .demo-work/human] \
        --png docs/demo-measures.png --json docs/results/demo-measures.json

The corpus keeps only clips whose every measure is clear of the gaps between bands, so its
distributions have holes at the gaps; the human recordings are shown as measured (gaps included).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specdec_cli.demo.measure import cut_points  # noqa: E402

PANELS = (("pitch", "semitones", "pitch: median F0, semitones from the gender's reference"),
          ("rate", "rate", "rate: syllable nuclei / s of phonation"),
          ("volume", "level_dbfs", "volume: speech level, dBFS"),
          ("pauses", "pause_share", "pauses: share of the speech span in pauses >= 250 ms"))
GENDER_EN = {"男声": "male", "女声": "female"}  # the picture's font has no CJK glyphs
BAND_EN = {"偏低": "low", "适中": "middle", "偏高": "high", "较慢": "slow", "较快": "fast", "较小": "quiet",
           "较大": "loud", "较少": "few", "较多": "many"}
SPLIT_NAMES = {"train": "training", "val": "training voices, held-out sentences", "val_voices": "held-out voices",
               "val_synth": "held-out synthesizer"}


def corpus_rows(root: Path) -> list[dict]:
    rows = []
    for path in sorted(root.glob("*.json")):
        if path.name == "meta.json" or "_noisy-" in path.name:
            continue
        for m in json.loads(path.read_text(encoding="utf-8")):
            ms = m["measures"]
            ref = cut_points()["references_hz"][m["labels"]["gender"]]
            group = f"{m['synth']} {GENDER_EN[m['labels']['gender']]} ({SPLIT_NAMES[m['split']]})"
            rows.append({"group": group, "semitones": 12 * np.log2(ms["f0_hz"] / ref), "rate": ms["rate"],
                         "level_dbfs": ms["level_dbfs"], "pause_share": ms["pause_share"]})
    return rows


def human_rows(folder: Path) -> list[dict]:
    from specdec_cli.demo.measure import measure_file, values

    genders = {json.loads(x)["file"]: json.loads(x)["gender"]
               for x in (folder / "genders.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()}
    rows = []
    for f, g in sorted(genders.items()):
        m = measure_file(folder / f)
        v = values(m, g)
        rows.append({"group": f"human recordings, {GENDER_EN[g]}", "semitones": v["pitch"], "rate": m.rate,
                     "level_dbfs": m.level_dbfs, "pause_share": v["pauses"]})
    return rows


def summary(rows: list[dict]) -> dict:
    by: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for _, key, _ in PANELS:
            if r[key] is not None:
                by[r["group"]][key].append(float(r[key]))
    return {g: {k: {"n": len(v), "p10": float(np.percentile(v, 10)), "median": float(np.median(v)),
                    "p90": float(np.percentile(v, 90))} for k, v in d.items()} for g, d in sorted(by.items())}


def plot(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({r["group"] for r in rows})
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(10, 3.2 * len(PANELS)))
    for ax, (attr, key, title) in zip(axes, PANELS, strict=True):
        data = [[r[key] for r in rows if r["group"] == g and r[key] is not None] for g in groups]
        ax.boxplot(data, vert=False, showfliers=True, flierprops={"markersize": 2})
        ax.set_yticks(range(1, len(groups) + 1), [f"{g} (n={len(d)})" for g, d in zip(groups, data, strict=True)],
                      fontsize=7)
        ax.set_title(title, fontsize=9)
        x0, x1 = ax.get_xlim()
        for k, (phrase, (lo, hi)) in enumerate(cut_points()["bands"][attr]["bands"].items()):
            lo_x = lo if lo is not None else x0
            hi_x = hi if hi is not None else x1
            ax.axvspan(lo_x, hi_x, alpha=0.12, color=("tab:blue", "tab:green", "tab:orange")[k])
            ax.text((lo_x + hi_x) / 2, len(groups) + 0.55, BAND_EN[phrase[2:]], ha="center", fontsize=7)
        ax.set_xlim(x0, x1)
        ax.set_ylim(0.4, len(groups) + 0.9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=REPO / ".demo-work" / "corpus-v4")
    ap.add_argument("--human", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = corpus_rows(args.corpus)
    if args.human:
        rows += human_rows(args.human)
    doc = {"cut_points": cut_points()["bands"], "groups": summary(rows),
           "command": "python bench/measure_distributions.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    for g, d in doc["groups"].items():
        print(g, {k: f"{v['p10']:.2f}/{v['median']:.2f}/{v['p90']:.2f}" for k, v in d.items()})
    if args.png:
        plot(rows, args.png)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
