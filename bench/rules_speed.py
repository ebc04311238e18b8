"""Time of the decoding rules outside model forwards, per row and per token, at a real vocabulary
width (random logits rows; the histories are real descriptions, teacher-forced).

    python bench/rules_speed.py            # Qwen2.5-Omni tokenizer, 152,064-wide rows
    python bench/rules_speed.py --demo     # the demo character tokenizer

Per token the speculative loop spends, outside the forwards: one draft row (the rules, then one
softmax shared by the pick and the entropy), the stop check, and in an escalated block its share
of the verification block (k+1 rows processed in one call, then the greedy verdict). Worst case
here: every block escalated. One CPU thread, timed on the process CPU clock (on a shared machine
the wall clock is mostly time spent waiting for a core); report the load average too."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_cli.decoding import DecodingConfig, DecodingRules, VocabMasks  # noqa: E402
from specdec_cli.decoding.acceptance import greedy_verdict  # noqa: E402
from specdec_cli.decoding.drafter import pick  # noqa: E402

TEXTS = [
    "说话人是女声，语速较快，音调偏高，音量适中，停顿较少，整体情绪激动。",
    "音调适中，音量适中，音色清亮，声音低沉，语气平和，停顿自然。",
    "这是一段男声录音，语速较慢，音调偏低，音量较小，停顿较多，整体情绪低落。",
]


def _timeit(fn, n: int = 20) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n


def measure(tok, width: int, k: int, repeats: int) -> dict:
    t0 = time.process_time()
    masks = VocabMasks.for_tokenizer(tok, width)
    masks.index(DecodingConfig().no_repeat_ngram, DecodingConfig().comma_min_chars, DecodingConfig().stop_min_chars)
    masks_s = time.process_time() - t0
    prompt = tok.encode("<|im_start|>assistant\n")
    rows = torch.randn(k + 1, width) * 4
    gen = torch.Generator().manual_seed(0)
    draft_t = block_t = verdict_t = tokens = blocks = rows_n = 0.0
    for _ in range(repeats):
        for text in TEXTS:
            answer = tok.encode(text)
            rules = DecodingRules.build(DecodingConfig(max_new_tokens=200), masks, len(prompt), [0])
            seq = list(prompt)
            for start in range(0, len(answer), k):
                draft = answer[start:start + k]
                t = time.process_time()
                for i in range(len(draft)):
                    ctx = seq + draft[:i]
                    scores = rules.process_ids(ctx, rows[i])
                    pick(scores, None, rules.banned_parts(ctx, width))
                    rules.stops(seq + draft[:i + 1])
                rules.shows_loop(seq + draft, len(seq))
                draft_t += time.process_time() - t
                t = time.process_time()
                scored = rules.process_block(seq, draft, rows[:len(draft) + 1])
                block_t += time.process_time() - t
                t = time.process_time()
                greedy_verdict(draft, scored)
                verdict_t += time.process_time() - t
                seq += draft
                tokens += len(draft)
                blocks += 1
                rows_n += len(draft) + 1
    del gen
    row = rows[0].clone()
    unit = min(_timeit(lambda: torch.softmax(row, -1)) for _ in range(5))
    return {
        "width": width,
        "k": k,
        "masks_s": round(masks_s, 3),
        "draft_ms_per_token": round(1e3 * draft_t / tokens, 3),
        "verify_rules_ms_per_row": round(1e3 * block_t / rows_n, 3),
        "verify_rules_ms_per_token": round(1e3 * block_t / tokens, 3),
        "greedy_verdict_ms_per_token": round(1e3 * verdict_t / tokens, 3),
        "outside_forwards_ms_per_token_all_escalated": round(1e3 * (draft_t + block_t + verdict_t) / tokens, 3),
        "outside_forwards_ms_per_token_none_escalated": round(1e3 * draft_t / tokens, 3),
        "one_softmax_ms": round(1e3 * unit, 3),  # the same machine's yardstick, same run
        "tokens": int(tokens),
        "loadavg": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.demo:
        from specdec_cli.demo.tokenizer import build_tokenizer

        tok = build_tokenizer(TEXTS)
        width = len(tok)
    else:
        from specdec_cli.qwen_vocab import CLOUD_VOCAB, build_qwen_tokenizer

        tok, width = build_qwen_tokenizer(), CLOUD_VOCAB
    np.random.seed(0)
    print(json.dumps(measure(tok, width, args.k, args.repeats)))


if __name__ == "__main__":
    main()
