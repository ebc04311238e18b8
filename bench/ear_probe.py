"""What a demo model's ears carry: linear probes of its audio tower (issue 41's diagnosis).

A model that answers an attribute at chance either does not hear it (its audio tower's output does
not carry it) or hears it and fails to say it (its text side does not read it). This tells the two
apart: per clip, the audio tower's output is mean- and std-pooled over time, and a logistic
regression (scikit-learn's, standardised inputs) is fitted on the corpus's training split and
scored on each held-out split, per attribute. The same probe on the log-mel input itself (pooled
the same way) is the reference for what a pooled linear read-out can get from the features at all,
and a probe on the measured values (`measures` in the corpus lists: F0 in Hz, syllables per second,
...) the ceiling the labels allow. Pitch is probed with and without the speaker's declared gender
as an extra input (demo contract v3 measures pitch against the gender's reference).

    python bench/ear_probe.py --model .demo-work/pair-v4/cloud --corpus .demo-work/corpus-v4 \
        --out docs/results/ear-probe-v4.json

Prints one table (accuracy per probe input, split and attribute) and writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ATTRS = ("gender", "pitch", "rate", "volume", "pauses")


def load_split(root: Path, split: str, limit: int | None) -> tuple[list[np.ndarray], list[dict]]:
    feats, metas = [], []
    for path in sorted(root.glob(f"{split}-*.json")):
        arr = np.load(path.with_suffix(".npy"), mmap_mode="r")
        for m in json.loads(path.read_text(encoding="utf-8")):
            feats.append(np.asarray(arr[m["offset"]:m["offset"] + m["frames"]], dtype=np.float32))
            metas.append(m)
            if limit and len(metas) >= limit:
                return feats, metas
    return feats, metas


def pooled(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x.mean(0), x.std(0)])


@torch.no_grad()
def tower_outputs(model, feats: list[np.ndarray]) -> list[np.ndarray]:
    out = []
    for f in feats:
        x = torch.from_numpy(f.T.copy())[None]  # (1, 128, frames)
        mask = torch.ones((1, f.shape[0]), dtype=torch.long)
        h = model.get_audio_features(x, feature_attention_mask=mask).last_hidden_state
        out.append(h.float().numpy())
    return out


def measured_inputs(metas: list[dict]) -> np.ndarray | None:
    keys = sorted(metas[0].get("measures", {}))
    if not keys:
        return None
    # log F0 too: the pitch bands are semitones (a log scale) from a reference per gender.
    rows = [[float(m["measures"].get(k) or 0.0) for k in keys] + [np.log(m["measures"].get("f0_hz") or 1.0)]
            for m in metas]
    return np.asarray(rows, dtype=np.float64)


def gender_column(metas: list[dict]) -> np.ndarray:
    return np.asarray([[1.0 if m["labels"].get("gender") == "女声" else 0.0] for m in metas])


def probe(x_train, y_train, tests: dict[str, tuple[np.ndarray, list[str]]]) -> dict[str, float]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0))
    clf.fit(x_train, y_train)
    return {name: round(float(np.mean(clf.predict(x) == np.asarray(y))), 4) for name, (x, y) in tests.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="exported demo model folder (its audio tower)")
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus-v4 folder (train + held-out shards)")
    ap.add_argument("--train-limit", type=int, default=1000)
    ap.add_argument("--test-limit", type=int, default=300)
    ap.add_argument("--fit-on", default="train", help="the split the probes are fitted on (default train)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    torch.set_num_threads(2)
    model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(args.model).eval()
    splits = {args.fit_on: args.train_limit}
    splits.update({s: args.test_limit for s in ("val", "val_voices", "val_synth") if s != args.fit_on})
    data = {}
    for split, limit in splits.items():
        feats, metas = load_split(args.corpus, split, limit)
        if not metas:
            continue
        tower = tower_outputs(model, feats)
        data[split] = {
            "metas": metas,
            "log-mel": np.stack([pooled(f) for f in feats]),
            "audio tower": np.stack([pooled(h) for h in tower]),
            "measured": measured_inputs(metas),
        }
        print(f"{split}: {len(metas)} clips", file=sys.stderr, flush=True)
    fit = args.fit_on
    if fit not in data:
        raise SystemExit(f"no {fit} shards under {args.corpus}")
    tests = [s for s in data if s != fit]
    table = []
    for source in ("log-mel", "audio tower", "measured"):
        if data[fit][source] is None:
            continue
        for attr in ATTRS:
            for with_gender in ((False, True) if attr == "pitch" else (False,)):
                def inputs(split: str, with_gender=with_gender, source=source):
                    x = data[split][source]
                    return np.hstack([x, gender_column(data[split]["metas"])]) if with_gender else x

                if source == "measured" and attr == "gender":
                    continue
                y = [m["labels"][attr] for m in data[fit]["metas"]]
                acc = probe(inputs(fit), y, {s: (inputs(s), [m["labels"][attr] for m in data[s]["metas"]])
                                                 for s in tests})
                row = {"input": source, "attribute": attr + (" | gender" if with_gender else ""), **acc}
                table.append(row)
                print(f"{source:12s} {row['attribute']:16s} " + "  ".join(f"{s} {acc[s]:.3f}" for s in tests),
                      flush=True)
    result = {"model": str(args.model), "corpus": str(args.corpus),
              "clips": {s: len(d["metas"]) for s, d in data.items()}, "probe": "logistic regression on "
              "mean+std pooled inputs, standardised", "fitted_on": fit, "table": table}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
