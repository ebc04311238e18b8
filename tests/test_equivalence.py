"""Token-for-token equivalence with HF `generate` (the independent oracle).

verify=always is lossless: the output must equal cloud-only greedy `generate` with the same
processors. threshold=+inf never consults the cloud: the output must equal edge-only `generate`.
Both with constraints on and off, over 20 clips and several k."""

from __future__ import annotations

import pytest
import torch
from conftest import clip, make_thinker

from specdec_cli.decoding import DecodingConfig, generate_baseline, speculative_decode
from specdec_cli.decoding.processors import DecodingRules

SEEDS = range(20)
KS = (1, 2, 3, 5, 8)


def _run_pair(edge, cloud, processor, masks, eos_ids, constraints: bool):
    outputs = []
    for seed in SEEDS:
        inputs = processor(clip(seed, 0.6 + 0.1 * (seed % 4)))
        cfg = DecodingConfig(k=KS[seed % len(KS)], max_new_tokens=24, constraints=constraints)
        always = speculative_decode(edge, cloud, inputs, cfg.with_(verify="always"), masks, eos_ids)
        cloud_only = generate_baseline(cloud, inputs, cfg.with_(mode="cloud"), masks, eos_ids)
        never = speculative_decode(edge, cloud, inputs, cfg.with_(threshold=float("inf")), masks, eos_ids)
        edge_only = generate_baseline(edge, inputs, cfg.with_(mode="edge"), masks, eos_ids)
        outputs.append((always, cloud_only, never, edge_only))
    return outputs


@pytest.fixture(scope="module", params=[False, True], ids=["constraints-off", "constraints-on"])
def unrelated(request, edge, cloud, processor, masks, eos_ids):
    return request.param, _run_pair(edge, cloud, processor, masks, eos_ids, request.param)


def test_verify_always_equals_cloud_generate(unrelated):
    _, runs = unrelated
    for always, cloud_only, _, _ in runs:
        assert always.tokens == cloud_only.tokens
        # the lazy prefill rides in the first verification: one cloud forward per cloud call
        assert always.stats.cloud_work_forwards == always.stats.cloud_calls == always.stats.escalations
        assert always.stats.cloud_prefill_tokens == cloud_only.stats.cloud_prefill_tokens


def test_threshold_inf_equals_edge_generate_and_never_calls_the_cloud(unrelated):
    _, runs = unrelated
    for _, _, never, edge_only in runs:
        assert never.tokens == edge_only.tokens
        assert never.stats.cloud_calls == 0
        # lazy prefill (the default): the cloud never ran at all, not even its prefill
        assert never.stats.cloud_prefill_tokens == never.stats.cloud_work_forwards == 0


def test_unrelated_pair_rejects_most_drafts(unrelated):
    """Otherwise the equivalence above would hold trivially."""
    _, runs = unrelated
    drafted = sum(r[0].stats.verified_drafted for r in runs)
    accepted = sum(r[0].stats.verified_accepted for r in runs)
    assert accepted / drafted < 0.5
    assert any(r[0].tokens != r[3].tokens for r in runs)  # cloud and edge really disagree


def _edge_rows(edge, inputs, answer: list[int]) -> torch.Tensor:
    """The edge's logits after each prefix of `answer` (row j: after answer[:j]), from one uncached
    forward over prompt + answer: the independent oracle for what the edge predicts."""
    ids = torch.cat([inputs["input_ids"], torch.tensor([answer], dtype=torch.long)], dim=1)
    kwargs = dict(inputs, input_ids=ids, attention_mask=torch.ones_like(ids))
    edge.model.rope_deltas = None
    with torch.inference_mode():
        logits = edge(**kwargs, use_cache=False).logits[0]
    return logits[inputs["input_ids"].shape[1] - 1:].float()


def _replayed_blocks(edge, inputs, cfg, masks, eos_ids, cloud_tokens: list[int], events) -> int:
    """How many cloud calls verify=always must make: walk the cloud's greedy answer (HF generate);
    at each position the edge drafts greedily (checked row by row against an uncached forward,
    under the same rules), the cloud keeps the longest prefix equal to its own answer and adds
    its next token. Returns the number of blocks, i.e. of cloud calls."""
    prompt = inputs["input_ids"][0].tolist()
    rules = DecodingRules.build(cfg, masks, len(prompt), eos_ids)
    pos = blocks = 0
    while pos < len(cloud_tokens):
        budget = min(cfg.k, cfg.max_new_tokens - pos)
        draft = events[blocks].draft  # what the loop drafted here; every token is checked below
        rows = _edge_rows(edge, inputs, cloud_tokens[:pos] + draft)[pos:]
        for j, token in enumerate(draft):
            context = prompt + cloud_tokens[:pos] + draft[:j]
            assert token == int(rules.process_ids(context, rows[j]).argmax()), (blocks, j)
            ends = j + 1 == budget or rules.stops(context + [token])
            assert ends == (j + 1 == len(draft)), (blocks, j)  # drafts stop at k or at the end
        kept = 0
        while kept < len(draft) and pos + kept < len(cloud_tokens) and draft[kept] == cloud_tokens[pos + kept]:
            kept += 1
        assert events[blocks].accepted == kept
        pos += kept + 1
        blocks += 1
    return blocks


def test_spec_cloud_calls_match_a_replay_of_greedy_drafts_against_cloud_generate(edge, processor, masks, eos_ids,
                                                                                  unrelated):
    """The number of cloud calls verify=always makes is what a replay from independent oracles
    predicts (edge drafts from uncached forwards, the cloud's answer from HF generate): one per
    block, a block ending at the first draft token the cloud's answer disagrees with."""
    constraints, runs = unrelated
    audio = edge.config.audio_token_id  # an uncached forward would take it for audio (rules off only)
    checked = 0
    for seed, (always, cloud_only, _, _) in zip(SEEDS, runs, strict=True):
        if checked == 8 or audio in cloud_only.tokens or any(audio in e.draft for e in always.events):
            continue
        checked += 1
        inputs = processor(clip(seed, 0.6 + 0.1 * (seed % 4)))
        cfg = DecodingConfig(k=KS[seed % len(KS)], max_new_tokens=24, constraints=constraints)
        blocks = _replayed_blocks(edge, inputs, cfg, masks, eos_ids, cloud_only.tokens, always.events)
        assert always.stats.cloud_calls == blocks == len(always.events)
    assert checked == 8


def test_constraints_change_the_output_somewhere(edge, cloud, processor, masks, eos_ids, unrelated):
    """The constrained equivalence is not vacuous: constraints do alter greedy output here."""
    constraints, runs = unrelated
    if not constraints:
        pytest.skip("checked once, on the constrained run")
    plain = _run_pair(edge, cloud, processor, masks, eos_ids, constraints=False)
    assert any(a[1].tokens != b[1].tokens or a[3].tokens != b[3].tokens for a, b in zip(runs, plain, strict=True))


def test_identical_pair_accepts_every_draft(tokenizer, processor, masks, eos_ids):
    twin = make_thinker(tokenizer, 7, hidden=32, layers=1, heads=2, kv_heads=1, audio_d=32)
    for k in (2, 4):
        inputs = processor(clip(k))
        cfg = DecodingConfig(k=k, max_new_tokens=20, verify="always")
        spec = speculative_decode(twin, twin, inputs, cfg, masks, eos_ids)
        assert spec.tokens == generate_baseline(twin, inputs, cfg.with_(mode="cloud"), masks, eos_ids).tokens
        assert spec.stats.acceptance_rate == 1.0
        assert all(e.correction_kind == "bonus" for e in spec.events)
        # k drafts + 1 bonus per cloud call: far fewer cloud forwards than tokens
        assert spec.stats.cloud_calls <= -(-spec.stats.tokens // (k + 1))


def test_plain_text_causal_lm_works_too(tokenizer, masks, eos_ids):
    """The loop does not care which architecture it drives: Qwen2 text LMs with a text prompt."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def lm(seed, hidden):
        torch.manual_seed(seed)
        cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          initializer_range=0.2, tie_word_embeddings=False)
        return Qwen2ForCausalLM(cfg).eval()

    edge_lm, cloud_lm = lm(3, 32), lm(4, 64)
    ids = tokenizer("<|im_start|>user\n说话人是谁<|im_end|>\n<|im_start|>assistant\n", return_tensors="pt",
                    add_special_tokens=False)
    inputs = {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"]}
    for k in (1, 3, 6):
        cfg = DecodingConfig(k=k, max_new_tokens=20, verify="always")
        spec = speculative_decode(edge_lm, cloud_lm, inputs, cfg, masks, eos_ids)
        assert spec.tokens == generate_baseline(cloud_lm, inputs, cfg.with_(mode="cloud"), masks, eos_ids).tokens
