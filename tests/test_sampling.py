"""Sampling through the whole loop: verified tokens follow the cloud's distribution, and the draft
probabilities handed to the acceptance rule are the ones the draft was sampled from."""

from __future__ import annotations

import torch
from conftest import clip
from test_acceptance import CHI2_999, chi2
from toy import TableLM

from specdec_cli.decoding import DecodingConfig, VocabMasks, speculative_decode
from specdec_cli.decoding.acceptance import draw
from specdec_cli.decoding.drafter import propose
from specdec_cli.decoding.processors import DecodingRules
from specdec_cli.decoding.state import ModelState

V = 6


def soft_table(rows: list[list[float]]) -> TableLM:
    lm = TableLM(V)
    lm.table = torch.tensor(rows).log()
    return lm


def test_spec_sampling_with_verify_always_follows_the_cloud():
    """Two tokens per clip over 3000 seeds on a 6-token vocabulary: the first token's and the
    second token's marginals match the cloud's, not the edge's."""
    edge = soft_table([[0.1, 0.5, 0.1, 0.1, 0.1, 0.1]] * V)
    cloud_rows = [[0.05, 0.05, 0.3, 0.3, 0.2, 0.1], [0.4, 0.1, 0.1, 0.1, 0.1, 0.2]] + [[0.2, 0.2, 0.2, 0.2, 0.1, 0.1]] * 4
    cloud = soft_table(cloud_rows)
    masks = VocabMasks.from_texts(["a", "b", "c", "d", "e", "f"], V)
    inputs = {"input_ids": torch.tensor([[1]]), "attention_mask": torch.tensor([[1]])}
    first, second = torch.zeros(V), torch.zeros(V)
    for seed in range(3000):
        cfg = DecodingConfig(k=2, max_new_tokens=2, verify="always", sample=True, seed=seed, constraints=False)
        out = speculative_decode(edge, cloud, inputs, cfg, masks, eos_ids=[99]).tokens
        first[out[0]] += 1
        second[out[1]] += 1
    p1 = torch.tensor(cloud_rows[1])                         # after prompt token 1
    p2 = sum(p1[a] * torch.tensor(cloud_rows[a]) for a in range(V))  # marginal of the second token
    assert chi2(first, p1) < CHI2_999[5]
    assert chi2(second, p2) < CHI2_999[5]


def test_draft_probs_are_what_the_draft_was_sampled_from(edge, processor, masks, eos_ids):
    inputs = processor(clip(4))
    state = ModelState(edge)
    state.prefill(inputs)
    seq = list(state.ids)
    rules = DecodingRules.build(DecodingConfig(temperature=0.7), masks, len(seq), eos_ids)
    gen = torch.Generator().manual_seed(11)
    replay = torch.Generator().manual_seed(11)
    prop = propose(state, seq, 4, rules, gen)

    oracle = ModelState(edge)  # independent: fresh state, one forward over the whole draft
    oracle.prefill(inputs)
    rows = torch.cat([oracle.last_logits[None], oracle.advance(prop.tokens[:-1])])
    for i, token in enumerate(prop.tokens):
        expected = torch.softmax(rules.process(torch.tensor([seq + prop.tokens[:i]]), rows[i]), dim=-1)
        assert torch.allclose(prop.draft_probs[i], expected, atol=1e-5)
        # the same generator stream, drawing from those probabilities, gives the same token
        assert draw(expected, replay) == token


def test_spec_sampling_across_vocabulary_widths_follows_the_cloud():
    """The edge scores 4 tokens, the cloud 6 (as Qwen2.5-Omni-3B's 151,936 rows against -7B's
    152,064): tokens 4 and 5 are ones the edge can never propose. Sampled through the whole loop
    with every block verified, both tokens' marginals still match the cloud's, rows 4-5 included.
    (The edge can *read* every token; it only lacks the output rows.)"""
    edge = TableLM(V)
    edge.table = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * V).log()  # [6 previous tokens, 4 outputs]
    cloud_rows = [[0.05, 0.05, 0.2, 0.1, 0.3, 0.3], [0.1, 0.1, 0.1, 0.1, 0.35, 0.25]] + \
                 [[0.1, 0.2, 0.2, 0.2, 0.2, 0.1]] * 4
    cloud = soft_table(cloud_rows)
    masks = VocabMasks.from_texts(["a", "b", "c", "d", "e", "f"], V)
    inputs = {"input_ids": torch.tensor([[1]]), "attention_mask": torch.tensor([[1]])}
    first, second = torch.zeros(V), torch.zeros(V)
    for seed in range(3000):
        cfg = DecodingConfig(k=2, max_new_tokens=2, verify="always", sample=True, seed=seed, constraints=False)
        out = speculative_decode(edge, cloud, inputs, cfg, masks, eos_ids=[99]).tokens
        first[out[0]] += 1
        second[out[1]] += 1
    p1 = torch.tensor(cloud_rows[1])
    p2 = sum(p1[a] * torch.tensor(cloud_rows[a]) for a in range(V))
    assert first[4:].sum() > 0 and second[4:].sum() > 0
    assert chi2(first, p1) < CHI2_999[5]
    assert chi2(second, p2) < CHI2_999[5]
