"""Does what a user calibrates carry? `specdec calibrate` on a few labelled clips of one set, then the
presets it wrote, on another set, against cloud-only (issue 41, item 5).

    python bench/calibrate_carries.py --label v4 [--edge DIR --cloud DIR] [--work DIR] --json FILE

What runs (the real CLI, as a user would type it; each step kept in --work and skipped when its
output is there, so a run resumes):

1. `python -m specdec_cli.demo.heldout CAL --set val --start 2000 --clips 48`: 48 held-out clips of
   the training voices, and `… EVAL --set val_voices --start 2000 --clips 96`: 96 clips of voices the
   pair never heard, which neither calibration nor training saw;
2. `specdec calibrate CAL --labels CAL/labels.jsonl --edge E --cloud C --out P --report R` with
   calibrate's defaults (block lengths 4 and 6, its default thresholds and margin: what a user gets);
3. `specdec eval EVAL --edge E --cloud C --presets P --modes cloud,quality,fluent --report F`.

The JSON keeps calibrate's choices (setting, the check half's figures) and eval's per-mode mean
attribute accuracy and cloud calls per token; bench/doc_tables.py renders it (calibrate_carries).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from specdec_cli.remote.local_server import SPECDEC  # noqa: E402

DEMO = REPO / "specdec_cli/demo/models"


def clips(out: Path, kind: str, start: int, n: int) -> Path:
    if not (out / "labels.jsonl").is_file():
        subprocess.run([sys.executable, "-m", "specdec_cli.demo.heldout", str(out), "--set", kind, "--start", str(start),
                        "--clips", str(n)], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", required=True, help="a name for the pair (v3, v4)")
    ap.add_argument("--edge", type=Path, default=DEMO / "edge")
    ap.add_argument("--cloud", type=Path, default=DEMO / "cloud")
    ap.add_argument("--work", type=Path, default=REPO / ".demo-work/carries")
    ap.add_argument("--cal-clips", type=int, default=48)
    ap.add_argument("--eval-clips", type=int, default=96)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    w = args.work
    cal = clips(w / "cal", "val", 2000, args.cal_clips)
    ev = clips(w / "eval", "val_voices", 2000, args.eval_clips)
    presets, cal_report, ev_report = w / f"{args.label}.toml", w / f"{args.label}-presets.json", w / f"{args.label}-eval.json"
    models = ["--edge", str(args.edge), "--cloud", str(args.cloud)]
    steps = [
        (cal_report, [SPECDEC, "--threads", "1", "calibrate", str(cal), "--labels", str(cal / "labels.jsonl"), *models,
                      "--out", str(presets), "--overwrite", "--report", str(cal_report)]),
        (ev_report, [SPECDEC, "--threads", "1", "eval", str(ev), *models, "--presets", str(presets),
                     "--modes", "cloud,quality,fluent", "--report", str(ev_report)]),
    ]
    for out, cmd in steps:
        if not out.is_file():
            print("+", " ".join(cmd), file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    c = json.loads(cal_report.read_text(encoding="utf-8"))
    e = json.loads(ev_report.read_text(encoding="utf-8"))
    result: dict[str, Any] = {
        "label": args.label, "edge": str(args.edge), "cloud": str(args.cloud),
        "calibrated_on": f"{c['n_calib']} + {c['n_check']} held-out clips of the training voices (val 2000-)",
        "evaluated_on": f"{e['clips']} held-out clips of held-out voices (val_voices 2000-)",
        "choices": [{k: ch.get(k) for k in ("name", "points", "met", "setting", "margin")} for ch in c["choices"]],
        "eval": {m["mode"]: {"mean_accuracy": m["mean_accuracy"], "cloud_call_rate": m["cloud_call_rate"]}
                 for m in e["modes"]},
    }
    args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(result["eval"]))


if __name__ == "__main__":
    main()
