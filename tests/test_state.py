"""ModelState against an independent oracle: a full-context forward with no cache."""

from __future__ import annotations

import pytest
import torch

from specdec_cli.decoding.state import ModelState


def full_forward_logits(model, inputs, extra: list[int]) -> torch.Tensor:
    """Logits predicting each of `extra` and the token after, from one uncached forward over
    prompt + extra (positions computed by the model itself from the attention mask)."""
    ids = torch.cat([inputs["input_ids"], torch.tensor([extra])], dim=1)
    kwargs = dict(inputs)
    kwargs.update(input_ids=ids, attention_mask=torch.ones_like(ids))
    if hasattr(model, "model") and hasattr(model.model, "rope_deltas"):
        model.model.rope_deltas = None
    with torch.inference_mode():
        out = model(**kwargs, use_cache=False)
    return out.logits[0, -len(extra) - 1:].float()


@pytest.mark.parametrize("which", ["edge", "cloud"])
def test_incremental_logits_equal_full_forward_at_every_step(which, request, inputs):
    model = request.getfixturevalue(which)
    extra = torch.randint(20, 140, (9,), generator=torch.Generator().manual_seed(3)).tolist()
    oracle = full_forward_logits(model, inputs, extra)

    state = ModelState(model)
    steps = [state.prefill(inputs)]
    for chunk in ([extra[0]], extra[1:4], [extra[4]], extra[5:]):  # single and multi-token advances
        steps.extend(state.advance(chunk))
    cached = torch.stack(steps)
    assert cached.shape == oracle.shape
    assert (cached - oracle).abs().max() <= 1e-4


@pytest.mark.parametrize("which", ["edge", "cloud"])
def test_rollback_equals_fresh_prefill_of_the_kept_tokens(which, request, inputs):
    model = request.getfixturevalue(which)
    kept, dropped = [31, 47, 52], [60, 61, 62, 63]
    state = ModelState(model)
    state.prefill(inputs)
    prompt_len = len(state)
    state.advance(kept + dropped)
    state.rollback(prompt_len + len(kept))

    fresh = ModelState(model)
    fresh.prefill(inputs)
    fresh.advance(kept)
    assert state.ids == fresh.ids
    assert state.last_logits is None  # the logits at the cut were not kept: nobody can reuse stale ones
    for a, b in zip(state.cache.layers, fresh.cache.layers, strict=True):
        assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)
    # and the next step agrees with the oracle
    nxt = state.advance([70])
    assert (nxt - full_forward_logits(model, inputs, kept + [70])[-1:]).abs().max() <= 1e-4


def test_cache_and_tokens_cannot_drift_apart(edge, inputs):
    """F3: if anything but advance() grows the cache, the next operation refuses to go on."""
    state = ModelState(edge)
    state.prefill(inputs)
    state.advance([40])
    with torch.inference_mode():  # a second, unrecorded advance of the same cache
        edge(input_ids=torch.tensor([[41]]), past_key_values=state.cache, use_cache=True)
    with pytest.raises(AssertionError, match="cache holds"):
        state.advance([42])


def test_pending_refuses_a_sequence_the_cache_does_not_prefix(edge, inputs):
    state = ModelState(edge)
    state.prefill(inputs)
    state.advance([40, 41])
    seq = list(state.ids)
    seq[-1] = 99  # the cache holds 41 where the accepted sequence says 99: a missed rollback
    with pytest.raises(AssertionError, match="not a prefix"):
        state.pending(seq + [5])


def test_prefill_resets_per_clip_state(edge, processor):
    """rope_deltas and counters belong to the clip: a second prefill starts from scratch."""
    from conftest import clip

    state = ModelState(edge)
    state.prefill(processor(clip(1, 2.0)))
    state.advance([40, 41, 42])
    state.prefill(processor(clip(2, 1.0)))
    assert state.forwards == 0 and state.tokens_fed == 0
    assert len(state) == state.cache.get_seq_length() == processor(clip(2, 1.0))["input_ids"].shape[1]
