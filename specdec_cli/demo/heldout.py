"""Write held-out demo clips as WAV files with a labels.jsonl, for `specdec calibrate` and `specdec eval`.

`python -m specdec_cli.demo.heldout OUT [--clips N] [--start I] [--set SET] [--seed S]` synthesises
clips START..START+N-1 of a held-out split of corpus v4 (`corpus_v4.py`: held-out sentences; labels
measured from the audio, demo contract v3), clean:

- `val`: the training voices, sentences never used in training;
- `val_voices`: the held-out voices (never heard in training);
- `val_synth`: the held-out synthesizer (flite);
- `mixed` (default): clip i from `val`, `val_voices`, `val_synth` in turn (i mod 3).

Each line of labels.jsonl gives the file, its labels (what `eval`/`calibrate` read) and where it came
from (split, voice, synthesizer, measures). Needs espeak-ng, festival and its voices, flite and sox
(`make speech` installs them) and praat-parselmouth.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import soundfile as sf

from .corpus_v4 import make_clips
from .voices import SAMPLE_RATE

SETS = ("val", "val_voices", "val_synth")
SEED = 4


def split_of(kind: str, i: int) -> str:
    return SETS[i % len(SETS)] if kind == "mixed" else kind


def write_heldout(out: Path, clips: int, start: int = 0, seed: int = SEED, kind: str = "mixed") -> Path:
    """Write the clips and OUT/labels.jsonl; returns the labels file."""
    if kind not in (*SETS, "mixed"):
        raise ValueError(f"unknown held-out set {kind!r}: one of {', '.join((*SETS, 'mixed'))}")
    out.mkdir(parents=True, exist_ok=True)
    wanted = list(range(start, start + clips))
    by_split: dict[str, list[int]] = {}
    for i in wanted:
        by_split.setdefault(split_of(kind, i), []).append(i)
    made = {}
    for split, idx in by_split.items():
        for c in make_clips(split, idx, seed, 0.0, (0.0, 0.0)):
            made[c.index, split] = c
    lines = []
    for i in wanted:
        split = split_of(kind, i)
        c = made[i, split]
        name = f"{split}-{i:04d}.wav"
        sf.write(str(out / name), c.audio, SAMPLE_RATE, subtype="PCM_16")
        m = c.meta()
        lines.append(json.dumps({"file": name, "labels": c.labels, "split": split, "voice": m["voice"],
                                 "synth": m["synth"], "lang": m["lang"], "sentence": m["sentence"],
                                 "measures": m["measures"]}, ensure_ascii=False))
    labels = out / "labels.jsonl"
    labels.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return labels


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--clips", type=int, default=24)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--set", dest="kind", choices=(*SETS, "mixed"), default="mixed")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)
    print(write_heldout(args.out, args.clips, args.start, args.seed, args.kind))


if __name__ == "__main__":
    main()
