"""Lazy cloud prefill: the cloud runs nothing until the first escalation, then the prompt (with the
audio), the accepted answer and the draft go through in one forward.

Oracles: HF `generate` (cloud-only / edge-only), an uncached full forward, and the eager prefill
(`lazy_prefill=False`), which the older tests pin to the same oracles."""

from __future__ import annotations

import pytest
import torch
from conftest import clip
from test_state import full_forward_logits

from specdec_cli.decoding import DecodingConfig, generate_baseline, speculative_decode
from specdec_cli.decoding.state import ModelState

KS = (2, 3, 5)


@pytest.mark.parametrize("constraints", [False, True], ids=["constraints-off", "constraints-on"])
def test_threshold_inf_never_runs_the_cloud(edge, cloud, processor, masks, eos_ids, constraints):
    calls = []
    handle = cloud.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        for seed, k in enumerate(KS):
            inputs = processor(clip(seed, 0.7))
            cfg = DecodingConfig(k=k, max_new_tokens=20, constraints=constraints, threshold=float("inf"))
            never = speculative_decode(edge, cloud, inputs, cfg, masks, eos_ids)
            s = never.stats
            assert never.tokens == generate_baseline(edge, inputs, cfg.with_(mode="edge"), masks, eos_ids).tokens
            assert (s.cloud_prefill_tokens, s.cloud_work_forwards, s.cloud_work_tokens, s.cloud_calls) == (0, 0, 0, 0)
    finally:
        handle.remove()
    assert calls == []  # not a single cloud forward, prefill included


@pytest.mark.parametrize("constraints", [False, True], ids=["constraints-off", "constraints-on"])
def test_verify_always_lazy_equals_cloud_generate_and_merges_the_prefill(edge, cloud, processor, masks, eos_ids,
                                                                         constraints):
    for seed, k in enumerate(KS):
        inputs = processor(clip(seed + 3, 0.8))
        prompt_len = inputs["input_ids"].shape[1]
        cfg = DecodingConfig(k=k, max_new_tokens=20, constraints=constraints, verify="always")
        lazy = speculative_decode(edge, cloud, inputs, cfg, masks, eos_ids)
        eager = speculative_decode(edge, cloud, inputs, cfg, masks, eos_ids, lazy_prefill=False)
        cloud_only = generate_baseline(cloud, inputs, cfg.with_(mode="cloud"), masks, eos_ids)
        assert lazy.tokens == eager.tokens == cloud_only.tokens
        a, b = lazy.stats, eager.stats
        # Same verifications and tokens fed; the lazy prefill rides in the first one.
        assert a.cloud_calls == b.cloud_calls == a.escalations
        assert a.cloud_tokens == b.cloud_tokens
        assert a.cloud_prefill_tokens == b.cloud_prefill_tokens == cloud_only.stats.cloud_prefill_tokens == prompt_len
        assert a.cloud_work_forwards == b.cloud_work_forwards - 1 == a.cloud_calls
        assert b.cloud_work_tokens == prompt_len + b.cloud_tokens
        first = lazy.events[0]
        assert first.escalated and first.cloud_prefill_tokens == prompt_len
        assert all(e.cloud_prefill_tokens == 0 for e in lazy.events[1:])
        assert cloud_only.stats.cloud_work_forwards == cloud_only.stats.cloud_calls + 1


@pytest.mark.parametrize("constraints", [False, True], ids=["constraints-off", "constraints-on"])
def test_late_first_escalation_gives_the_eager_tokens(edge, cloud, processor, masks, eos_ids, constraints):
    """Gated decoding where the cloud is first asked after some blocks ran on the edge alone: the
    lazy prefill then carries prompt + several accepted tokens + the draft in one forward."""
    late = 0
    for seed in range(8):
        inputs = processor(clip(seed, 0.6 + 0.1 * (seed % 3)))
        cfg = DecodingConfig(k=KS[seed % len(KS)], max_new_tokens=24, constraints=constraints)
        # Until the first escalation the blocks are the edge-only ones: a threshold just above the
        # first two blocks' uncertainty makes the first escalation (if any) come at block 2 or later.
        alone = speculative_decode(edge, cloud, inputs, cfg.with_(threshold=float("inf")), masks, eos_ids).events
        for threshold in (max(e.uncertainty for e in alone[:2]), 0.0):
            lazy = speculative_decode(edge, cloud, inputs, cfg.with_(threshold=threshold), masks, eos_ids)
            eager = speculative_decode(edge, cloud, inputs, cfg.with_(threshold=threshold), masks, eos_ids,
                                       lazy_prefill=False)
            assert lazy.tokens == eager.tokens
            assert [e.accepted for e in lazy.events] == [e.accepted for e in eager.events]
            assert lazy.stats.cloud_calls == eager.stats.cloud_calls
            first = next((e for e in lazy.events if e.escalated), None)
            if first is None:
                assert lazy.stats.cloud_work_forwards == lazy.stats.cloud_prefill_tokens == 0
            else:
                assert lazy.stats.cloud_work_forwards == eager.stats.cloud_work_forwards - 1
                assert first.cloud_prefill_tokens == inputs["input_ids"].shape[1]
                assert first.cloud_tokens == len(lazy.events[first.index - 1].answer if first.index else []) + len(first.draft)
                late += first.index >= 2
    assert late, "no clip escalated late: the test would not exercise a prefill carrying an answer"


def _positions_seen(model):
    seen = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("position_ids")), with_kwargs=True)
    return seen, handle


@pytest.mark.parametrize("which", ["edge", "cloud"])
def test_lazy_prefill_matches_full_forward_and_eager_positions(which, request, inputs):
    """prompt + answer + draft in one forward: the rows it keeps equal an uncached full forward,
    and its M-RoPE positions after the prompt are those the eager path gives step by step."""
    model = request.getfixturevalue(which)
    extra = [31, 47, 52, 60, 61]
    oracle = full_forward_logits(model, inputs, extra)  # [len(extra) + 1, V]
    prompt = inputs["input_ids"][0].tolist()

    seen, handle = _positions_seen(model)
    try:
        lazy = ModelState(model, "lazy")
        lazy.start(inputs)
        assert not lazy.started and len(lazy) == 0 and lazy.pending(prompt + extra) == prompt + extra
        rows = lazy.advance(prompt + extra, keep=4)
        eager = ModelState(model, "eager")
        eager.prefill(inputs)
        eager.advance(extra)
    finally:
        handle.remove()
    assert rows.shape[0] == 4
    assert (rows - oracle[-4:]).abs().max() <= 1e-4
    assert lazy.ids == eager.ids and torch.equal(lazy.rope_deltas, eager.rope_deltas)
    lazy_pos, eager_pos = seen[0], seen[2]
    assert torch.equal(lazy_pos[..., len(prompt):], eager_pos)
    # the cache it leaves behind continues correctly
    nxt = lazy.advance([70])
    assert (nxt - full_forward_logits(model, inputs, extra + [70])[-1:]).abs().max() <= 1e-4
    assert (lazy.prefill_tokens, lazy.forwards, lazy.tokens_fed, lazy.all_forwards) == (len(prompt), 2, 6, 2)


def test_prefill_computes_one_logits_row(edge, inputs):
    """The thinker's forward has no `logits_to_keep` in transformers 5.23: the output head must
    be handed only the rows we read."""
    rows = []
    handle = edge.get_output_embeddings().register_forward_hook(lambda m, a, out: rows.append(out.shape[1]))
    try:
        state = ModelState(edge)
        state.prefill(inputs)
        state.advance([40, 41, 42], keep=2)
        state.advance([43])
    finally:
        handle.remove()
    assert rows == [1, 2, 1]


def test_placeholder_id_in_the_answer_falls_back_to_two_forwards(cloud, inputs):
    """With the rules off an answer may hold the audio placeholder id; in the prompt's forward it
    would be taken for audio. It is run as prompt, then tokens — still equal to the oracle."""
    audio_id = cloud.config.audio_token_id
    extra = [31, audio_id, 52]
    prompt = inputs["input_ids"][0].tolist()
    state = ModelState(cloud, "cloud")
    state.start(inputs)
    rows = state.advance(prompt + extra, keep=4)
    assert rows.shape[0] == 4 and state.all_forwards == 2
    # oracle: eager prefill then the tokens as ordinary embeddings (what generate would do)
    eager = ModelState(cloud, "eager")
    first = eager.prefill(inputs)
    rest = eager.advance(extra)
    assert (rows - torch.cat([first[None], rest])).abs().max() <= 1e-4


def test_eval_summarises_cloud_work_against_cloud_only():
    """Hand-computed: cloud work means, the share of clips with no cloud work, ratios to cloud-only."""
    from test_evaluate import _correct, _record

    from specdec_cli.evaluate import EvalMode, summarize_all

    def rec(mode, prefill, fed, forwards):
        return {**_record(mode, _correct()), "cloud_prefill_tokens": prefill, "cloud_work_tokens": prefill + fed,
                "cloud_work_forwards": forwards}

    modes = [EvalMode("cloud", DecodingConfig(mode="cloud")), EvalMode("fluent", DecodingConfig(k=4), "fluent")]
    records = [rec("cloud", 90, 10, 11), rec("cloud", 110, 10, 13), rec("fluent", 0, 0, 0), rec("fluent", 100, 10, 2)]
    cloud, fluent = summarize_all(records, modes)
    assert (cloud["cloud_work_tokens"], cloud["cloud_work_forwards"], cloud["no_cloud_share"]) == (110, 12, 0.0)
    assert (fluent["cloud_prefill_tokens"], fluent["cloud_work_tokens"], fluent["cloud_work_forwards"]) == (50, 55, 1)
    assert fluent["no_cloud_share"] == 0.5
    assert fluent["cloud_work_tokens_vs_cloud"] == pytest.approx(0.5)
    assert fluent["cloud_work_forwards_vs_cloud"] == pytest.approx(1 / 12)
