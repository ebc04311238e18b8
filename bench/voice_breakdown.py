"""Per voice: a demo model's teacher-forced held-out accuracy on each voice of corpus v4's held-out
sets (issue 41: which unseen voices the pair mishears, and on what). The same metric as training's
held-out evaluations (`train.evaluate_tf`: an attribute is right when every one of its decision
positions is), grouped by the clip's voice instead of its length.

    python bench/voice_breakdown.py --model .demo-work/pair-v4/cloud --corpus .demo-work/corpus-v4 \
        --json docs/results/demo-v4-cloud-voices.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer  # noqa: E402
from specdec_cli.demo.train import AttributeSpans, Corpus, evaluate_tf  # noqa: E402
from specdec_cli.phrases import ATTRIBUTES  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="an exported demo model folder")
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--splits", default="val,val_voices,val_synth")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    torch.set_num_threads(1)
    model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(args.model).eval()
    tok = build_qwen_style_tokenizer()
    spans = AttributeSpans(tok)
    out = {"model": str(args.model), "corpus": str(args.corpus), "splits": {}}
    for split in args.splits.split(","):
        data = Corpus(split, tok, spans, args.corpus)
        for m in data.meta:  # evaluate_tf groups by "bucket": group by voice instead
            m["bucket"] = f"{m['voice']} ({m['labels']['gender']})"
        with torch.no_grad():
            ev = evaluate_tf(model, data)
        counts = Counter(m["bucket"] for m in data.meta)
        out["splits"][split] = {v: {"clips": counts[v], **acc} for v, acc in sorted(ev["acc"].items()) if v != "all"}
        print(f"## {split}")
        print("| voice | clips | " + " | ".join(ATTRIBUTES) + " | mean |")
        print("|---|---:|" + "---:|" * (len(ATTRIBUTES) + 1))
        for v, acc in out["splits"][split].items():
            print(f"| {v} | {acc['clips']} | " + " | ".join(f"{100 * acc[a]:.0f}" for a in ATTRIBUTES)
                  + f" | {100 * acc['mean']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
