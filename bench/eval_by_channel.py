"""One `specdec eval --report` JSON broken down by channel family: accuracy per mode and family.

    python bench/eval_by_channel.py docs/results/eval-heldout-v5-v4.json docs/results/eval-heldout-v5-v5.json

The held-out clips of `python -m specdec_cli.demo.heldout --corpus v5` are named SET-FAMILY-NNNN.wav
(e.g. val_voices-telephone-0101.wav); each attribute is scored over the clips labelled for it, as
`eval` scores it, and the mean is over the attributes. Prints a Markdown table per report; --json
writes {report: {mode: {family: {"mean": %, "gender": %, ..., "clips": n}}}}.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

FAMILY = re.compile(r"^(?P<set>[a-z_]+)-(?P<family>[a-z_]+)-\d+\.wav$")


def breakdown(report: dict) -> dict[str, dict[str, dict[str, float]]]:
    tally: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: [0, 0])))
    clips: dict = defaultdict(lambda: defaultdict(set))
    for r in report["records"]:
        if r.get("error") is not None or r.get("predicted") is None:
            continue
        m = FAMILY.match(Path(r["file"]).name)
        family = m["family"] if m else "other"
        mode = r.get("eval_mode") or r["mode"]
        clips[mode][family].add(r["file"])
        for attr, want in r["labels"].items():
            cell = tally[mode][family][attr]
            cell[0] += r["predicted"].get(attr) == want
            cell[1] += 1
    out: dict = {}
    for mode, fams in tally.items():
        out[mode] = {}
        for family, attrs in sorted(fams.items()):
            acc = {a: 100 * c / n for a, (c, n) in attrs.items() if n}
            out[mode][family] = {**{a: round(v, 1) for a, v in acc.items()},
                                 "mean": round(sum(acc.values()) / len(acc), 1), "clips": len(clips[mode][family])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = {}
    for path in args.reports:
        got = breakdown(json.loads(path.read_text(encoding="utf-8")))
        result[str(path)] = got
        families = sorted({f for fams in got.values() for f in fams})
        print(f"\n{path}: mean attribute accuracy (%) per channel family (gender in brackets)\n")
        print("| mode | " + " | ".join(families) + " |")
        print("|---|" + "---:|" * len(families))
        for mode, fams in got.items():
            cells = [f"{fams[f]['mean']:.1f} ({fams[f].get('gender', float('nan')):.0f})" if f in fams else "–"
                     for f in families]
            print(f"| {mode} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
