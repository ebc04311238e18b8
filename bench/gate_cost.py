"""What the meaning gate costs per block at Qwen2.5-Omni's real widths, against one draft forward.

Run by hand:

    python bench/gate_cost.py [--json] [--k 8] [--rounds 7] [--listed 16,1000,10000]

The pair is bench/vocab152k.py's: the real Qwen2.5-Omni tokenizer (rebuilt offline) with a random
edge of 151,936 rows (as -3B; small hidden size, so its forward is mostly the 151,936-row output
layer). Measured in one process, rounds interleaved, medians of process CPU time (trust it over wall
time on a shared machine):

* `draft_forward_ms`: one edge step, `ModelState.advance([token])` (cut back after each, so every
  step sees the same cache length);
* `gate_per_block_ms[L]`: the gate's own work for one block of k draft tokens on real rows
  (softmaxed edge distributions, float32): k `MeaningGate.score` calls (one gather of the L listed
  ids' probabilities, one dot, one dict lookup each) plus the aggregate, for gates listing L ids;
* `drafting_marginal_ms[L]`: k `Drafting.step` calls on the same logits rows with the rules on,
  the meaning gate on and off, alternated block by block; the median of the paired differences is
  the marginal cost as the drafter pays it (the gate reads the probabilities the drafter's entropy
  already computed: no extra softmax, no tokenizer decode).

`ratio` = gate per block / draft forward; the target is <= 0.10.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from specdec_cli.decoding import DecodingConfig, DecodingRules  # noqa: E402
from specdec_cli.decoding.drafter import Drafting  # noqa: E402
from specdec_cli.decoding.gate import MeaningGate, aggregate  # noqa: E402
from specdec_cli.decoding.state import ModelState  # noqa: E402


def cpu_ms(fn, repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        fn()
    return 1000 * (time.process_time() - start) / repeat


def random_gate(n_text: int, listed: int, seed: int = 0) -> MeaningGate:
    rng = np.random.default_rng(seed)
    ids = rng.choice(n_text, listed, replace=False)
    return MeaningGate({int(t): float(w) for t, w in zip(ids, rng.uniform(0, 1, listed), strict=True)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--listed", default="16,1000,10000")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sys.path.insert(0, str(REPO / "bench"))
    from vocab152k import clip_inputs, real_width_pair

    sizes = [int(x) for x in args.listed.split(",")]
    pair = real_width_pair()
    inputs = clip_inputs(pair, 1)[0]
    cfg = DecodingConfig(k=args.k, verify="meaning")
    edge = ModelState(pair.edge, "edge")
    first = edge.prefill(inputs)
    prompt = list(edge.ids)
    # A realistic answer prefix: a description in real Qwen tokens, fed once.
    answer = pair.tokenizer("说话人是女声，语速较快，", add_special_tokens=False)["input_ids"]
    rows = torch.cat([first[None], edge.advance(answer)])           # row j predicts answer[j]
    base_len = len(edge)
    rules = DecodingRules.build(cfg, pair.masks, len(prompt), pair.eos_ids)
    k = min(args.k, len(answer))
    probs = [torch.softmax(rules.process_ids(prompt + answer[:j], rows[j], warp=False), -1).numpy() for j in range(k)]
    gates = {n: random_gate(pair.masks.n_text, n) for n in sizes}
    for g in gates.values():  # the per-width arrays are built once per pair, not per block
        g.scorer(probs[0].shape[-1])

    def forward() -> None:
        edge.advance([answer[-1]])
        edge.rollback(base_len)

    def gate_block(g: MeaningGate) -> None:
        aggregate([g.score(probs[j], answer[j]) for j in range(k)], "sum")

    def drafting(g: MeaningGate | None) -> None:
        d = Drafting(prompt + answer[:0], k, rules, None, g)
        for j in range(k):
            d.step(rows[j])
            d.tokens[-1] = answer[j]  # follow the fixed answer, so every variant scores the same rows

    samples: dict[str, list[float]] = {"draft_forward_ms": [], "drafting_without_ms": []}
    for n in sizes:
        samples[f"gate_per_block_ms[{n}]"] = []
        samples[f"drafting_with_gate_ms[{n}]"] = []
        samples[f"drafting_marginal_ms[{n}]"] = []
    for _ in range(args.rounds):
        samples["draft_forward_ms"].append(cpu_ms(forward, 20))
        for n, g in gates.items():
            samples[f"gate_per_block_ms[{n}]"].append(cpu_ms(lambda g=g: gate_block(g), 50))
        # The drafter with and without the gate, alternated block by block: the marginal cost is the
        # median of the paired differences (two ~3 ms blocks differ by less than their noise).
        for _pair in range(20):
            without = cpu_ms(lambda: drafting(None), 1)
            samples["drafting_without_ms"].append(without)
            for n, g in gates.items():
                with_gate = cpu_ms(lambda g=g: drafting(g), 1)
                samples[f"drafting_with_gate_ms[{n}]"].append(with_gate)
                samples[f"drafting_marginal_ms[{n}]"].append(with_gate - without)
    med = {name: statistics.median(v) for name, v in samples.items()}
    out = {"vocab_rows": int(rows.shape[-1]), "k": k, "rounds": args.rounds, "clock": "process CPU time, medians",
           **{name: round(v, 4) for name, v in med.items()},
           "ratio_gate_per_block_to_draft_forward": {n: round(med[f"gate_per_block_ms[{n}]"] / med["draft_forward_ms"], 4)
                                                     for n in sizes},
           "ratio_drafting_marginal_to_draft_forward": {
               n: round(med[f"drafting_marginal_ms[{n}]"] / med["draft_forward_ms"], 4)
               for n in sizes}}
    for n in sizes:
        print(f"listed {n:>6}: gate {med[f'gate_per_block_ms[{n}]']:.3f} ms per block of {k} vs draft forward "
              f"{med['draft_forward_ms']:.3f} ms: ratio {out['ratio_gate_per_block_to_draft_forward'][n]:.3f} "
              f"(in the drafter: {out['ratio_drafting_marginal_to_draft_forward'][n]:+.3f})", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
