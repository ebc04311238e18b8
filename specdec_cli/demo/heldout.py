"""Write held-out demo clips as WAV files with a labels.jsonl, for `specdec calibrate` and `specdec eval`.

`python -m specdec_cli.demo.heldout OUT [--clips N] [--start I] [--set SET] [--seed S]` synthesises
clips START..START+N-1 of a held-out split of corpus v4 (`corpus_v4.py`: held-out sentences; labels
measured from the audio, demo contract v3), clean:

- `val`: the training voices, sentences never used in training;
- `val_voices`: the held-out voices (never heard in training);
- `val_synth`: the held-out synthesizer (flite);
- `mixed` (default): clip i from `val`, `val_voices`, `val_synth` in turn (i mod 3).

`--corpus v5` draws the clips as corpus v5 does (`corpus_v5.py`, demo contract v4) and writes each
through a channel: `--channel clean|telephone|codec|room|far_field`, or `mixed` (default there): clip
i through the evaluation family (i // 3) mod 5, so every set meets every channel. Labels are contract
v4's: rate, pitch and pauses measured before the channel, volume as heard, and an ambiguous attribute
left out of `labels` (listed under `ambiguous`): `eval` and `calibrate` score each attribute over the
clips labelled for it.

Each line of labels.jsonl gives the file, its labels (what `eval`/`calibrate` read) and where it came
from (split, voice, synthesizer, measures). Needs espeak-ng, festival and its voices, flite and sox
(`make speech` installs them) and praat-parselmouth.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import soundfile as sf

from .corpus_v4 import make_clips
from .voices import SAMPLE_RATE

SETS = ("val", "val_voices", "val_synth")
SEED = 4
SEEDS = {"v4": 4, "v5": 5}


def split_of(kind: str, i: int) -> str:
    return SETS[i % len(SETS)] if kind == "mixed" else kind


def family_of(channel: str, i: int) -> str:
    from .channel import EVAL_FAMILIES

    return EVAL_FAMILIES[(i // len(SETS)) % len(EVAL_FAMILIES)] if channel == "mixed" else channel


def write_heldout_v5(out: Path, clips: int, start: int = 0, seed: int = 5, kind: str = "mixed",
                     channel: str = "mixed") -> Path:
    """write_heldout for corpus v5: each clip through a channel (see the module's docstring)."""
    import random

    from . import channel as ch
    from .corpus_v5 import hear, make_clean

    out.mkdir(parents=True, exist_ok=True)
    wanted = list(range(start, start + clips))
    by_split: dict[str, list[int]] = {}
    for i in wanted:
        by_split.setdefault(split_of(kind, i), []).append(i)
    made = {}
    for split, idx in by_split.items():
        for c in make_clean(split, idx, seed):
            made[c.index, split] = c
    lines = []
    for i in wanted:
        split = split_of(kind, i)
        c = made[i, split]
        family = family_of(channel, i)
        # the same draw as the corpus's held-out copy of clip i (babble falls back to pink noise here)
        steps = ch.draw(random.Random(f"{seed}/{split}/{i}/channel/{family}"), family)
        cp = hear(c, steps, None)
        name = f"{split}-{family}-{i:04d}.wav"
        sf.write(str(out / name), cp.audio, SAMPLE_RATE, subtype="PCM_16")
        lines.append(json.dumps({"file": name, "labels": cp.labels, "ambiguous": cp.ambiguous, "split": split,
                                 "family": family, "band_limited": ch.band_limited(steps), "channel": steps,
                                 "voice": c.plan.voice, "synth": c.plan.voice.split(":")[0], "lang": c.plan.lang,
                                 "measures": {**asdict(c.measures), "heard_level_dbfs": cp.level_dbfs}},
                                ensure_ascii=False))
    labels = out / "labels.jsonl"
    labels.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return labels


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
    ap.add_argument("--corpus", choices=tuple(SEEDS), default="v4",
                    help="the corpus whose held-out clips to draw (v5: through channels)")
    ap.add_argument("--channel", default="mixed",
                    help="v5: clean, telephone, codec, room, far_field, or mixed (each family in turn)")
    ap.add_argument("--seed", type=int, default=None, help="default: the corpus's own (v4: 4, v5: 5)")
    args = ap.parse_args(argv)
    seed = SEEDS[args.corpus] if args.seed is None else args.seed
    if args.corpus == "v5":
        from .channel import EVAL_FAMILIES

        if args.channel not in (*EVAL_FAMILIES, "mixed"):
            ap.error(f"--channel: one of {', '.join((*EVAL_FAMILIES, 'mixed'))}")
        print(write_heldout_v5(args.out, args.clips, args.start, seed, args.kind, args.channel))
    else:
        print(write_heldout(args.out, args.clips, args.start, seed, args.kind))


if __name__ == "__main__":
    main()
