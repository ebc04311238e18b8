"""Write held-out demo clips as WAV files with a labels.jsonl, for `specdec calibrate` and `specdec eval`.

`python -m specdec_cli.demo.heldout OUT [--clips N] [--start I] [--seed S]` synthesises clips
START..START+N-1 of the corpus's held-out split (`corpus.py`: held-out clauses only, clean, the same
seed and per-clip random streams), so the clips are the ones the trainer's own evaluation holds out,
and the bundled samples/ are not reused for choosing presets. Needs espeak-ng.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import soundfile as sf

from .corpus import SAMPLE_RATE, finish, sample_clip, split_clauses


def write_heldout(out: Path, clips: int, start: int = 0, seed: int = 2) -> Path:
    """Write the clips and OUT/labels.jsonl; returns the labels file."""
    _, val_clauses = split_clauses(seed)
    by_len: dict[int, list[str]] = {}
    for c in val_clauses:
        by_len.setdefault(len(c), []).append(c)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(start, start + clips):
        rng = random.Random(f"{seed}/val/{i}")  # corpus.make_shard's stream for val clip i
        spec, speech = sample_clip(rng, val_clauses, by_len, 0.0, (0.0, 0.0), ("white",))
        name = f"val-{i:04d}.wav"
        sf.write(str(out / name), finish(speech, spec), SAMPLE_RATE, subtype="PCM_16")
        lines.append(json.dumps({"file": name, "labels": spec.labels}, ensure_ascii=False))
    labels = out / "labels.jsonl"
    labels.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return labels


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--clips", type=int, default=24)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--seed", type=int, default=2)
    args = ap.parse_args(argv)
    print(write_heldout(args.out, args.clips, args.start, args.seed))


if __name__ == "__main__":
    main()
