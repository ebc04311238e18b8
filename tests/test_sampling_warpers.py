"""Rejection sampling under HF's warpers (--temperature, --top-k, --top-p), across the real
Qwen2.5-Omni widths: the edge scores 151,936 rows (the 3B thinker), the cloud 152,064 (the 7B).

The oracle is computed by hand here (numpy: divide by T, keep the k largest, keep the smallest
set of tokens holding top_p of the probability), not by the warpers under test. Two tokens per run,
every block verified, many seeds: the emitted tokens follow the cloud's *warped* distribution
(a chi-square test), tokens the warpers cut are never emitted, and tokens only the cloud has rows
for (151,936..152,063) come out at their rate although the edge can never propose them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from torch import nn

from specdec_cli.decoding import DecodingConfig, VocabMasks, speculative_decode
from specdec_cli.decoding.processors import DecodingRules
from specdec_cli.qwen_vocab import CLOUD_VOCAB, EDGE_VOCAB

PROMPT = 7
FLOOR = -1000.0  # every other row: probability 0 in float32 at any temperature used here
# Tokens spread over the vocabulary, the last two past the edge's width (cloud-only rows).
TOKENS = [11, 4_000, 50_000, 120_000, 151_000, 151_935, 151_940, 152_063]
EDGE_LOGITS = {11: 2.0, 4_000: 1.5, 50_000: 1.0, 120_000: 0.5, 151_000: 0.0, 151_935: 1.0}
CLOUD_FIRST = {11: 0.3, 4_000: 2.2, 50_000: 1.0, 120_000: -0.4, 151_000: 1.6, 151_935: 0.1, 151_940: 1.9,
               152_063: 0.7}
CLOUD_NEXT = {11: 1.2, 4_000: 0.1, 50_000: 2.0, 120_000: 0.6, 151_000: -0.5, 151_935: 1.7, 151_940: 0.4,
              152_063: 1.5}
RUNS = 800


def row(width: int, logits: dict[int, float]) -> torch.Tensor:
    out = torch.full((width,), FLOOR)
    for token, value in logits.items():
        out[token] = value
    return out


class RowLM(nn.Module):
    """Logits that depend on the previous token only: `first` after the prompt token, `rest` after
    anything else; a real DynamicCache is advanced so ModelState's invariants are exercised."""

    def __init__(self, first: torch.Tensor, rest: torch.Tensor) -> None:
        super().__init__()
        self.first, self.rest = first, rest
        self.anchor = nn.Parameter(torch.zeros(1))

    @property
    def device(self) -> torch.device:
        return self.anchor.device

    def forward(self, input_ids: torch.Tensor, past_key_values=None, **kwargs):
        from types import SimpleNamespace

        b, n = input_ids.shape
        if past_key_values is not None:
            kv = torch.zeros(b, 1, n, 1)
            past_key_values.update(kv, kv, 0)
        rows = [self.first if int(t) == PROMPT else self.rest for t in input_ids[0]]
        return SimpleNamespace(logits=torch.stack(rows)[None])


def warped_by_hand(logits: dict[int, float], temperature: float, top_k: int, top_p: float) -> dict[int, float]:
    """The distribution the warpers should leave, computed without them."""
    ids = np.array(list(logits))
    x = np.array([logits[i] for i in ids], np.float64) / temperature
    order = np.argsort(-x)
    keep = order[:top_k] if top_k else order
    p = np.exp(x[keep] - x[keep].max())
    p /= p.sum()
    cum = np.cumsum(p)
    n = int(np.searchsorted(cum, top_p - 1e-9) + 1) if top_p < 1 else len(keep)
    kept = keep[:n]
    q = np.exp(x[kept] - x[kept].max())
    q /= q.sum()
    return {int(ids[j]): float(v) for j, v in zip(kept, q, strict=True)}


SETTINGS = [  # (temperature, top_k, top_p): margins chosen so no cut falls on a tie
    (0.7, 0, 1.0),
    (1.6, 0, 1.0),
    (1.0, 3, 1.0),
    (1.0, 0, 0.75),
    (1.3, 5, 0.9),
]


@pytest.fixture(scope="module")
def masks() -> VocabMasks:
    # Every id a one-letter token: the rules (constraints off) then ban only rows past the
    # tokenizer, so the cloud's distribution is the warped one and nothing else.
    return VocabMasks.from_texts(["a"] * CLOUD_VOCAB, CLOUD_VOCAB)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SETTINGS)
def test_rejection_sampling_is_exact_under_the_warpers(masks, temperature, top_k, top_p):
    edge = RowLM(row(EDGE_VOCAB, EDGE_LOGITS), row(EDGE_VOCAB, EDGE_LOGITS))
    cloud = RowLM(row(CLOUD_VOCAB, CLOUD_FIRST), row(CLOUD_VOCAB, CLOUD_NEXT))
    inputs = {"input_ids": torch.tensor([[PROMPT]]), "attention_mask": torch.tensor([[1]])}
    first: dict[int, int] = {}
    second: dict[int, int] = {}
    for seed in range(RUNS):
        cfg = DecodingConfig(k=2, max_new_tokens=2, verify="always", sample=True, seed=seed, constraints=False,
                             temperature=temperature, top_k=top_k, top_p=top_p)
        out = speculative_decode(edge, cloud, inputs, cfg, masks, eos_ids=[99]).tokens
        first[out[0]] = first.get(out[0], 0) + 1
        second[out[1]] = second.get(out[1], 0) + 1
    for counts, logits in ((first, CLOUD_FIRST), (second, CLOUD_NEXT)):
        expected = warped_by_hand(logits, temperature, top_k, top_p)
        assert set(counts) <= set(expected), "a token the warpers cut was emitted"
        ids = sorted(expected)
        observed = np.array([counts.get(i, 0) for i in ids], np.float64)
        result = chisquare(observed, np.array([expected[i] for i in ids]) * RUNS)
        assert result.pvalue > 1e-3, (temperature, top_k, top_p, dict(zip(ids, observed, strict=True)), expected)
        if any(i >= EDGE_VOCAB for i in expected):  # reachable only through the cloud's recovered tokens
            assert sum(counts.get(i, 0) for i in ids if i >= EDGE_VOCAB) > 0


def test_warpers_are_hf_objects_in_generate_order_after_the_rules(masks):
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    cfg = DecodingConfig(temperature=0.7, top_k=20, top_p=0.9)
    rules = DecodingRules.build(cfg, masks, prompt_len=1, eos_ids=[99])
    kinds = [type(p) for p in rules.processors]
    assert kinds[-3:] == [TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper]
    assert kinds.count(TemperatureLogitsWarper) == 1  # once (F6)
    plain = DecodingRules.build(DecodingConfig(), masks, prompt_len=1, eos_ids=[99])
    assert not any(isinstance(p, (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper))
                   for p in plain.processors)
    logits = row(CLOUD_VOCAB, CLOUD_FIRST)
    full = rules.process_ids([PROMPT], logits)
    assert torch.equal(rules.warp([PROMPT], rules.process_ids([PROMPT], logits, warp=False)), full)


def test_the_gate_reads_the_entropy_before_the_warpers(masks):
    """The drafter's entropy is the rules' distribution's, whatever the warpers: top-k 1 does not
    make a block look certain, and a greedy draft is the same tokens under any warper."""
    from specdec_cli.decoding.drafter import Drafting, entropy

    logits = row(EDGE_VOCAB, EDGE_LOGITS)
    plain = DecodingRules.build(DecodingConfig(constraints=False), masks, prompt_len=1, eos_ids=[99])
    expected = entropy(plain.process_ids([PROMPT], logits))
    assert expected > 1.0
    for temperature, top_k, top_p in SETTINGS + [(1.0, 1, 1.0)]:
        cfg = DecodingConfig(constraints=False, temperature=temperature, top_k=top_k, top_p=top_p)
        rules = DecodingRules.build(cfg, masks, prompt_len=1, eos_ids=[99])
        for generator in (None, torch.Generator().manual_seed(0)):
            drafting = Drafting([PROMPT], 1, rules, generator)
            assert drafting.step(logits) is None  # k = 1: the draft is complete
            token = drafting.tokens[0]
            assert drafting.entropies[0] == pytest.approx(expected, abs=1e-4)
            if generator is None:
                assert token == 11
            else:
                assert drafting.probs[0][token] > 0
                assert torch.allclose(drafting.probs[0], torch.softmax(rules.process_ids([PROMPT], logits), -1))


def test_the_baselines_run_the_same_warpers(edge, processor, masks_tiny, eos_ids):
    """HF `generate` (edge / cloud modes) receives the warpers as processors: sampling with top-k 1
    or a tiny top-p is the greedy answer, while plain sampling from this random thinker is not."""
    from conftest import clip

    from specdec_cli.decoding import generate_baseline

    inputs = processor(clip(2))
    base = DecodingConfig(mode="edge", max_new_tokens=10)
    greedy = generate_baseline(edge, inputs, base, masks_tiny, eos_ids).tokens
    for warp in ({"top_k": 1}, {"top_p": 1e-6}, {"top_k": 1, "temperature": 3.0}):
        torch.manual_seed(0)
        assert generate_baseline(edge, inputs, base.with_(sample=True, **warp), masks_tiny, eos_ids).tokens == greedy
    sampled = set()
    for seed in range(3):
        torch.manual_seed(seed)
        sampled.add(tuple(generate_baseline(edge, inputs, base.with_(sample=True), masks_tiny, eos_ids).tokens))
    assert sampled != {tuple(greedy)}


@pytest.fixture(scope="module")
def masks_tiny(tokenizer, cloud):
    return VocabMasks.for_tokenizer(tokenizer, cloud.config.text_config.vocab_size)
