"""Every demo pair, rebuilt bit for bit from its committed training states.

    python -m specdec_cli.demo.previous v5 DIR    # the bundled pair (issue 51), as a second copy
    python -m specdec_cli.demo.previous v4 DIR    # DIR/edge, DIR/cloud, the presets it shipped with
    python -m specdec_cli.demo.previous v3 DIR
    python -m specdec_cli.demo.previous v2 DIR

The bundled pair (`specdec_cli/demo/models/`) is the latest (v5); an earlier one is not kept as a second
copy of its weights: `demo-train/<run>/state.pt` holds each of its models (committed), `train.export`
writes it as a model folder, and the sha256 of its weights file is checked against the one that was
bundled (so "v3" means the very models users had, not a retrained look-alike). The presets file it
shipped with is kept beside this module (`previous/<pair>_presets.toml`) and written into both
model folders, as the bundled pair has it. Use the folders with `--edge DIR/edge --cloud DIR/cloud`
(every command and bench/ script takes them).

v5 (demo contract v4: every training clip through a channel; edge_v5 + cloud_v5t) is the pair trained
for issue 51 and bundled since: its presets are the ones calibrated for it on corpus v5's held-out
clips 0-95 (`previous/v5_presets.toml`, the same file as the bundled `specdec_presets.toml`; a test
checks the bundled weights are v5's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
# pair -> model -> (training run under demo-train/, sha256 of the bundled model.safetensors)
PAIRS: dict[str, dict[str, tuple[str, str]]] = {
    "v2": {"edge": ("edge_short", "4f0cc80f343f9d48cd271451b43b420597ea8ac3eb1ab6c7b37c7339ee851f45"),
           "cloud": ("cloud", "12c245ab9ef7b07d842041c5f2d0dba29df872ea5cd2d6b23f4a459aae10d9f1")},
    "v3": {"edge": ("edge_distill", "a94e45d6a6602c93abc3ab9b8b87665fa4051ac6e6b161bc0f02ff38429ef297"),
           "cloud": ("cloud", "12c245ab9ef7b07d842041c5f2d0dba29df872ea5cd2d6b23f4a459aae10d9f1")},
    "v4": {"edge": ("edge_v4", "6c33464f89dcb4dc7bedfa8a1e040561e93052a578209733c1e39c04e77b522f"),
           "cloud": ("cloud_v4e", "bef0b2be82b4f9edadca78a0ecce703690750e3eef912e19322d25e2d85fb81e")},
    "v5": {"edge": ("edge_v5", "e2bae938b2b7e8d4281981156c1031eaf6336f344c28477452aa2ed308010154"),
           "cloud": ("cloud_v5t", "62242d695248a802d7e4d3c6434dfb143f70b2b4b947589ae7a2bbaeb48d438b")},
}


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def rebuild(pair: str, out: Path, runs: Path | None = None) -> dict[str, str]:
    """Write pair's edge/ and cloud/ under `out` with its presets; returns model -> folder. Raises
    SystemExit when a rebuilt weights file is not the one that was bundled."""
    from .train import RUNS, export

    if pair not in PAIRS:
        raise SystemExit(f"unknown pair {pair!r}: one of {', '.join(PAIRS)}")
    folders = {}
    for model, (run, digest) in PAIRS[pair].items():
        folder = out / model
        export((runs or RUNS) / run, folder)
        got = sha256(folder / "model.safetensors")
        if got != digest:
            raise SystemExit(f"{folder}: rebuilt from demo-train/{run} but its weights are not the {pair} pair's "
                             f"(sha256 {got[:12]}…, expected {digest[:12]}…); was the state retrained?")
        shutil.copyfile(HERE / "previous" / f"{pair}_presets.toml", folder / "specdec_presets.toml")
        folders[model] = str(folder)
    return folders


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pair", choices=list(PAIRS))
    ap.add_argument("out", type=Path, help="folder for edge/ and cloud/")
    args = ap.parse_args(argv)
    print(json.dumps(rebuild(args.pair, args.out)))


if __name__ == "__main__":
    main()
