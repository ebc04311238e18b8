"""Issue 34's item-5 goals for one pair, through real processes and a real socket.

    python bench/demo_goals.py [--edge DIR --cloud DIR] [--presets FILE] [--clips DIR | --start S --n N]
                               [--modes cloud,quality,fluent,frugal] [--json FILE] [--label NAME]

What runs. A real `specdec serve` hosting the cloud on 127.0.0.1 on a port the system picks
(`LocalServer`, stopped by its own pid), and the real CLI against it:
`specdec --threads 1 eval CLIPS --edge EDGE --cloud http://127.0.0.1:PORT --presets FILE
--modes cloud,quality,fluent[,frugal] --report FILE` (uploads lazy, the CLI's default: a clip the
edge keeps never leaves the device). Clips: labelled held-out demo clips calibration never saw
(`specdec_cli.demo.heldout`, default 1400-1495, 96 clips; cached under .demo-work/).

Every figure is `specdec eval --report`'s own (scoring, calls per token, zero-cloud share and cloud
work are `evaluate.summarize`'s, not re-implemented here); this script only runs it and keeps, per
setting: mean attribute accuracy, its distance to cloud-only in points, the share of clips with no
cloud work at all (`no_cloud_share`: no cloud forward, prefill included), cloud calls per output
token (`cloud_call_rate`), cloud work per clip in tokens (prefill + tokens fed) and as a share of
cloud-only's, and the share of clips that sent nothing up.

Presets: `--presets`, else the edge folder's specdec_presets.toml. A mode the presets file lacks
(frugal without a meaning gate) is left out and listed under "missing". bench/doc_tables.py renders
the before/after table of docs/demo-pair.md from two such JSONs (v2 and v3 pairs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from specdec_cli.remote.local_server import SPECDEC, LocalServer  # noqa: E402

DEMO = REPO / "specdec_cli/demo/models"
MODES = ("cloud", "quality", "fluent", "frugal")
KEPT = ("mean_accuracy", "accuracy", "cloud_call_rate", "no_cloud_share", "sent_nothing_share", "cloud_calls",
        "tokens", "cloud_work_tokens", "cloud_work_forwards", "cloud_work_tokens_vs_cloud", "uplink_bytes",
        "errors", "clips")


def heldout(start: int, n: int, corpus: str = "v4") -> Path:
    """The held-out clips start..start+n-1, written once under .demo-work/ (a tmp dir renamed into
    place, so a half-written set is never read). corpus v5: each clip through a channel, every
    evaluation family in turn (`specdec_cli.demo.heldout --corpus v5`)."""
    out = REPO / (f".demo-work/heldout-{start}-{n}" if corpus == "v4" else f".demo-work/heldout-{corpus}-{start}-{n}")
    if not (out / "labels.jsonl").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-heldout-{start}-"))
        subprocess.run([sys.executable, "-m", "specdec_cli.demo.heldout", str(tmp), "--start", str(start),
                        "--clips", str(n), "--corpus", corpus], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        tmp.rename(out)
    return out


def rel(path: Path) -> Path:
    """A path under the repository relative to it (the eval runs there), so the JSON reads the same
    on any checkout; others as given."""
    full = path.absolute()
    return full.relative_to(REPO) if full.is_relative_to(REPO) else path


def preset_names(presets: Path) -> set[str]:
    return {k for k, v in tomllib.loads(presets.read_text(encoding="utf-8")).items()
            if isinstance(v, dict) and k != "gate"}


def run(edge: Path, cloud: Path, presets: Path, clips: Path, modes: list[str], work: Path) -> dict[str, Any]:
    """`specdec eval` against a real `specdec serve`; returns eval's report (its JSON)."""
    report = work / "eval.json"
    with LocalServer("--cloud", str(cloud), log=work / "serve.log") as server:
        cmd = [SPECDEC, "--threads", "1", "eval", str(clips), "--edge", str(edge), "--cloud", server.url,
               "--presets", str(presets), "--modes", ",".join(modes), "--report", str(report)]
        print("+", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, cwd=REPO, stdout=sys.stderr)
        code, _ = server.stop()
    # The command as a reader would type it: the port and the temporary report named, not numbered.
    shown = ["specdec", *cmd[1:]]
    shown[shown.index(server.url)] = "http://127.0.0.1:PORT"
    shown[-1] = "FILE"
    return {"command": " ".join(shown), "serve_exit": code, "report": json.loads(report.read_text(encoding="utf-8"))}


def summarize(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per setting: eval's own figures, plus the distance to cloud-only in points."""
    rows = {s["mode"]: {k: s.get(k) for k in KEPT} for s in report["modes"]}
    base = rows["cloud"]["mean_accuracy"]
    for row in rows.values():
        row["vs_cloud_points"] = round(100 * (row["mean_accuracy"] - base), 4)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--edge", type=Path, default=DEMO / "edge")
    ap.add_argument("--cloud", type=Path, default=DEMO / "cloud")
    ap.add_argument("--presets", type=Path, help="default: the edge folder's specdec_presets.toml")
    ap.add_argument("--clips", type=Path, help="a folder of labelled clips (default: held-out --start/--n)")
    ap.add_argument("--start", type=int, default=1400)
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--corpus", choices=("v4", "v5"), default="v4",
                    help="the held-out clips' corpus (v5: through every channel family in turn)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--label", default="", help="a name for this pair in the JSON (e.g. v2, v3)")
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args()

    args.edge, args.cloud = rel(args.edge), rel(args.cloud)
    presets = rel(args.presets or args.edge / "specdec_presets.toml")
    for what, path in (("--edge", args.edge), ("--cloud", args.cloud), ("presets", presets)):
        if not path.exists():
            raise SystemExit(f"{what}: {path} does not exist")
    have = preset_names(presets)
    wanted = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "cloud" not in wanted:
        raise SystemExit("--modes: include cloud (every distance is to cloud-only)")
    modes = [m for m in wanted if m == "cloud" or m in have]
    clips = rel(args.clips or heldout(args.start, args.n, args.corpus))
    started, load = time.time(), list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="demo-goals-") as tmp:
        out = run(args.edge, args.cloud, presets, clips, modes, Path(tmp))
    report = out["report"]
    result = {
        "label": args.label,
        "edge": str(args.edge),
        "cloud": str(args.cloud),
        "presets": str(presets),
        "clips": str(clips) if args.clips else f"held-out {args.start}-{args.start + args.n - 1}"
        + ("" if args.corpus == "v4" else f" of corpus {args.corpus}"),
        "n_clips": report["modes"][0]["clips"],
        "command": out["command"],
        "serve_exit": out["serve_exit"],
        "missing": [m for m in wanted if m not in modes],
        "seconds": round(time.time() - started, 1),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "load_average": [round(x, 2) for x in load + list(os.getloadavg())],  # 1/5/15 min at start, then at end
        "settings": summarize(report),
    }
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
