"""ModelState's bookkeeping against hand-counted expectations and an uncached forward: the work
counters a record reports, which rows `keep` returns (and how they are cut: `logits_to_keep` or a
hook that leaves nothing behind), and each refusal of a misuse, with its message."""

from __future__ import annotations

import pytest
import torch
from test_state import full_forward_logits

from specdec_cli.decoding.state import ModelState, logits_for_last

EXTRA = [31, 47, 52, 60]


def counters(state: ModelState) -> tuple[int, int, int, int]:
    return state.prefill_tokens, state.forwards, state.tokens_fed, state.all_forwards


def test_work_counters_eager(edge, inputs):
    state = ModelState(edge, "edge")
    p = inputs["input_ids"].shape[1]
    assert counters(state) == (0, 0, 0, 0) and not state.started
    state.prefill(inputs)
    assert counters(state) == (p, 0, 0, 1) and state.started and len(state) == p
    state.advance([EXTRA[0]])
    assert counters(state) == (p, 1, 1, 2)
    state.advance(EXTRA[1:3])
    assert counters(state) == (p, 2, 3, 3)
    state.rollback(p + 1)  # cutting back is no forward
    assert counters(state) == (p, 2, 3, 3) and len(state) == p + 1
    state.start(inputs)  # a new clip starts from zero
    assert counters(state) == (0, 0, 0, 0) and state.ids == [] and state.cache is None


def test_work_counters_lazy_first_forward(edge, inputs):
    """The prompt and two answer tokens in one forward: one forward in all, two tokens after the prompt."""
    state = ModelState(edge)
    state.start(inputs)
    p = len(state.prompt_ids)
    rows = state.advance(state.prompt_ids + EXTRA[:2], keep=3)
    assert counters(state) == (p, 1, 2, 1)
    oracle = full_forward_logits(edge, inputs, EXTRA[:2])
    assert rows.shape == oracle.shape and (rows - oracle).abs().max() <= 1e-4


@pytest.mark.parametrize("keep", [1, 2, 4])
def test_keep_returns_the_last_rows_and_leaves_no_hook(edge, inputs, keep):
    """The thinker's forward has no logits_to_keep: a pre-hook on lm_head cuts the hidden states,
    and is removed after the forward (a later full forward sees every row)."""
    head = edge.get_output_embeddings()
    state = ModelState(edge)
    state.prefill(inputs)
    rows = state.advance(EXTRA, keep=keep)
    oracle = full_forward_logits(edge, inputs, EXTRA)[1:]  # row j: after EXTRA[j]
    assert rows.shape == (keep, oracle.shape[-1])
    assert (rows - oracle[-keep:]).abs().max() <= 1e-4
    assert torch.equal(state.last_logits, rows[-1])
    assert len(head._forward_pre_hooks) == 0


def test_logits_to_keep_is_passed_where_the_forward_takes_it(tokenizer):
    """A Qwen2 text LM takes logits_to_keep: it is handed the count, and no hook is installed."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)).eval()
    seen = []
    handle = lm.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("logits_to_keep")), with_kwargs=True)
    try:
        with logits_for_last(lm, 3) as extra:
            assert extra == {"logits_to_keep": 3}
            assert len(lm.get_output_embeddings()._forward_pre_hooks) == 0
        ids = [5, 6, 7, 8, 9]
        state = ModelState(lm)
        state.start({"input_ids": torch.tensor([ids[:2]]), "attention_mask": torch.ones(1, 2, dtype=torch.long)})
        rows = state.advance(ids, keep=2)
        assert seen == [2]
        with torch.inference_mode():
            full = lm(input_ids=torch.tensor([ids])).logits[0, -2:]
        assert rows.shape == (2, full.shape[-1]) and (rows - full).abs().max() <= 1e-5
    finally:
        handle.remove()


def test_a_model_with_neither_is_left_alone():
    class Plain(torch.nn.Module):
        def forward(self, x):
            return x

    with logits_for_last(Plain(), 2) as extra:
        assert extra == {}


def test_misuse_is_refused_with_the_states_name(edge, inputs):
    state = ModelState(edge, "edge")
    with pytest.raises(AssertionError, match="^edge: start\\(inputs\\) first$"):
        state.advance([1])
    state.start(inputs)
    with pytest.raises(AssertionError, match="^edge: the first forward must start with the prompt$"):
        state.advance(EXTRA)
    state.prefill(inputs)
    p = len(state)
    with pytest.raises(AssertionError, match="^advance needs tokens$"):
        state.advance([])
    with pytest.raises(AssertionError, match="^edge: cannot keep 3 of 2 rows$"):
        state.advance(EXTRA[:2], keep=3)
    with pytest.raises(AssertionError, match="^edge: cannot keep 0 of 2 rows$"):
        state.advance(EXTRA[:2], keep=0)
    assert len(state) == p  # nothing was fed
    with pytest.raises(AssertionError, match=f"^edge: cannot roll forward from {p} to {p + 1}$"):
        state.rollback(p + 1)
    state.advance(EXTRA[:2])
    with pytest.raises(AssertionError, match="^edge: cannot cut into the prompt$"):
        state.rollback(p - 1)
    logits = state.last_logits
    state.rollback(p + 2)  # to where it is: nothing cut, the logits at the end still valid
    assert state.last_logits is logits
    state.rollback(p + 1)
    state.rollback(p)  # back to the bare prompt: allowed
    assert state.ids == state.prompt_ids and state.cache.get_seq_length() == p
    state.advance(EXTRA[:2])
    state.rollback(p + 1)
    with pytest.raises(AssertionError, match="^edge: no logits after a rollback without new tokens$"):
        state.logits_after(state.ids)
    with pytest.raises(AssertionError, match="^edge: cache holds tokens that are not a prefix of the accepted "
                                             "sequence$"):
        state.pending(state.ids[:-1] + [EXTRA[3]])
    with pytest.raises(AssertionError, match="^one clip at a time$"):
        state.start({"input_ids": inputs["input_ids"].repeat(2, 1)})


def test_a_cache_out_of_step_with_the_tokens_is_caught(edge, inputs):
    state = ModelState(edge, "edge")
    state.prefill(inputs)
    p = len(state)
    state.ids.append(EXTRA[0])  # tokens without their cache entry
    with pytest.raises(AssertionError, match=f"^edge: cache holds {p} positions but {p + 1} tokens$"):
        state.rollback(p + 1)


@pytest.mark.parametrize("pending", [1, 3])
def test_logits_after_catches_up_in_one_forward(edge, inputs, pending):
    """logits_after(sequence) feeds the tokens the cache lacks in one forward and returns the row
    after the last: the uncached forward's."""
    state = ModelState(edge)
    state.prefill(inputs)
    sequence = state.ids + EXTRA[:pending]
    row = state.logits_after(sequence)
    assert state.ids == sequence and state.forwards == 1 and state.tokens_fed == pending
    assert row.shape == (edge.config.text_config.vocab_size,)
    assert (row - full_forward_logits(edge, inputs, EXTRA[:pending])[-1]).abs().max() <= 1e-4
    assert torch.equal(state.logits_after(sequence), row) and state.forwards == 1  # nothing pending: no forward


def test_the_output_head_sees_only_the_rows_kept(edge, inputs):
    rows = []
    handle = edge.get_output_embeddings().register_forward_hook(lambda m, a, out: rows.append(out.shape[1]))
    try:
        state = ModelState(edge)
        state.prefill(inputs)
        state.advance(EXTRA[:3], keep=2)
        state.advance(EXTRA[3:])
    finally:
        handle.remove()
    assert rows == [1, 2, 1]


@pytest.mark.parametrize(("extra", "keep"), [([31, "audio", 52], 4), ([31, "audio", 52], 2),
                                             (["audio"], 1), ([31, "audio"], 3)])
def test_a_placeholder_id_in_the_answer_runs_prompt_then_tokens(cloud, inputs, extra, keep):
    """An answer token equal to the audio placeholder id cannot ride in the prompt's forward; the
    rows kept are still those of the eager prefill followed by the tokens."""
    extra = [cloud.config.audio_token_id if t == "audio" else t for t in extra]
    prompt = inputs["input_ids"][0].tolist()
    state = ModelState(cloud, "cloud")
    state.start(inputs)
    rows = state.advance(prompt + extra, keep=keep)
    assert state.all_forwards == 2 and state.ids == prompt + extra and counters(state)[:3] == (len(prompt), 1,
                                                                                              len(extra))
    eager = ModelState(cloud, "eager")
    expected = torch.cat([eager.prefill(inputs)[None], eager.advance(extra)])[-keep:]
    assert rows.shape == expected.shape and (rows - expected).abs().max() <= 1e-4


def test_incremental_positions_carry_the_prompts_rope_offset(edge, inputs, monkeypatch):
    """With audio alone the thinker's rope_deltas is 0, which would hide a step that forgets it.
    Shift the prompt's M-RoPE positions by 7 (rope_deltas 7): RoPE depends only on distances, so
    the uncached, unshifted forward stays the oracle, and every later step must add the 7 too."""
    original = edge.model.get_rope_index

    def shifted(*args, **kwargs):
        positions, deltas = original(*args, **kwargs)
        return positions + 7, deltas + 7

    monkeypatch.setattr(edge.model, "get_rope_index", shifted)
    state = ModelState(edge)
    steps = [state.prefill(inputs)]
    steps.extend(state.advance(EXTRA[:1]))
    steps.extend(state.advance(EXTRA[1:]))
    assert state.rope_deltas.view(-1).tolist() == [7]
    oracle = full_forward_logits(edge, inputs, EXTRA)
    assert (torch.stack(steps) - oracle).abs().max() <= 1e-4
    lazy = ModelState(edge)  # the lazy first forward: prompt and answer tokens in one
    lazy.start(inputs)
    rows = lazy.advance(lazy.prompt_ids + EXTRA[:2], keep=3)
    rows = torch.cat([rows, lazy.advance(EXTRA[2:])])
    assert (rows - oracle).abs().max() <= 1e-4


def test_a_text_lm_steps_with_one_dimensional_positions(tokenizer):
    """A plain Qwen2 LM (no M-RoPE): incremental steps after a prefill equal its uncached forward."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                      initializer_range=0.2)).eval()
    ids = [5, 6, 7, 8, 9, 10, 11]
    state = ModelState(lm)
    steps = [state.prefill({"input_ids": torch.tensor([ids[:3]]), "attention_mask": torch.ones(1, 3, dtype=torch.long)})]
    steps.extend(state.advance(ids[3:4]))
    steps.extend(state.advance(ids[4:]))
    with torch.inference_mode():
        full = lm(input_ids=torch.tensor([ids])).logits[0, 2:]
    assert (torch.stack(steps) - full).abs().max() <= 1e-5
