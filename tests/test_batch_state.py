"""BatchState against an independent oracle: each row's logits equal a full uncached forward of
that row alone (its prompt with its audio + the tokens it holds), through joins, uneven advances,
a rollback of one row while the others accept, a leave, and a compaction."""

from __future__ import annotations

import pytest
import torch
from conftest import clip
from test_state import full_forward_logits

from specdec_cli.decoding.batch_state import BatchState
from specdec_cli.decoding.state import ModelState

TOL = 1e-4


def check_row(model, state: BatchState, key, inputs, got: torch.Tensor) -> None:
    """`got` [m, V] are the logits after the last m tokens the row holds: compare with the oracle."""
    row = state[key]
    answer = row.ids[len(row.prompt_ids):]
    if answer:
        full = full_forward_logits(model, inputs, answer)  # [len(answer) + 1, V]
    else:  # the prompt alone: one uncached forward, the last row
        model.model.rope_deltas = None
        with torch.inference_mode():
            full = model(**inputs, use_cache=False).logits[0, -1:].float()
    expected = full[-got.shape[0]:]
    assert (got - expected).abs().max() <= TOL, f"row {key}: batched logits differ from the uncached oracle"


@pytest.fixture(scope="module")
def clips(processor):
    # Different lengths, so prompts (audio placeholders) differ and rows start unaligned.
    return {name: processor(clip(seed, seconds)) for name, seed, seconds in
            (("a", 0, 1.0), ("b", 1, 0.6), ("c", 2, 1.4), ("d", 3, 0.8))}


@pytest.mark.parametrize("which", ["edge", "cloud"])
def test_rows_match_their_own_full_forward(which, request, clips, monkeypatch):
    model = request.getfixturevalue(which)
    state = BatchState(model, which, max_waste=4)  # a small waste limit makes it compact mid-test
    compactions = []
    compact = BatchState._compact
    monkeypatch.setattr(BatchState, "_compact", lambda self: (compactions.append(self.width), compact(self)))
    for key in ("a", "b", "c"):
        logits = state.join(key, clips[key])
        check_row(model, state, key, clips[key], logits)

    # Uneven advances: 1, 3 and 0 tokens in one forward, every row's logits kept.
    got = state.advance({"a": [40], "b": [41, 42, 43]})
    assert set(got) == {"a", "b"}
    for key in got:
        check_row(model, state, key, clips[key], got[key])

    # Keep only the last rows asked for.
    got = state.advance({"a": [44, 45, 46, 47], "b": [48], "c": [49, 50]}, keep={"a": 2, "c": 1})
    assert [got[k].shape[0] for k in "abc"] == [2, 1, 1]
    for key in "abc":
        check_row(model, state, key, clips[key], got[key])

    # Rollback of one row while the others accept: b loses 3 tokens, a and c keep theirs.
    b_len = len(state["b"])
    state.rollback("b", b_len - 3)
    assert state["b"].last_logits is None
    got = state.advance({"a": [51], "b": [52, 53], "c": [54]})
    for key in "abc":
        check_row(model, state, key, clips[key], got[key])

    # A row leaves, another joins mid-flight with its prompt plus tokens (a lazy prefill), and all go on.
    state.leave("a")
    logits = state.join("d", clips["d"], tokens=state_prompt(model, clips["d"]) + [55, 56], keep=3)
    check_row(model, state, "d", clips["d"], logits)
    state.rollback("c", len(state["c"]) - 1)
    got = state.advance({"b": [57], "c": [58, 59, 60], "d": [61]})
    for key in "bcd":
        check_row(model, state, key, clips[key], got[key])
    assert state.width <= max(len(state[k]) for k in "bcd") + 4  # cropped / compacted, not just growing
    assert compactions, "the holes never made the cache compact: that path went untested"


def state_prompt(model, inputs) -> list[int]:
    return inputs["input_ids"][0].tolist()


def test_join_gives_the_batch_one_cache_row_identical_to_batch_one(edge, clips):
    """The joining clip's prefill runs alone: its cache row is bit-identical to a ModelState's."""
    state = BatchState(edge, "edge")
    state.join("a", clips["a"])
    state.join("c", clips["c"])  # longer: the batch is padded to it
    single = ModelState(edge)
    single.prefill(clips["c"])
    for mine, theirs in zip(state.cache.layers, single.cache.layers, strict=True):
        assert torch.equal(mine.keys[1:2, :, :len(single)], theirs.keys)
    assert state.valid.sum(dim=1).tolist() == [len(state["a"]), len(state["c"])]


def test_the_per_row_invariant_is_asserted(edge, clips):
    state = BatchState(edge, "edge")
    state.join("a", clips["a"])
    state.join("b", clips["b"])
    with torch.inference_mode():
        state.valid[1, 0] = False  # a column of row b lost behind the state's back
    with pytest.raises(AssertionError, match=r"edge\[b\]: cache holds"):
        state.advance({"a": [40]})


def test_rollback_refuses_to_cut_into_the_prompt_or_roll_forward(edge, clips):
    state = BatchState(edge, "edge")
    state.join("a", clips["a"])
    n = len(state["a"])
    with pytest.raises(AssertionError, match="roll forward"):
        state.rollback("a", n + 1)
    state.advance({"a": [40, 41]})
    with pytest.raises(AssertionError, match="into the prompt"):
        state.rollback("a", n - 1)


def test_last_row_leaving_empties_the_batch(edge, clips):
    state = BatchState(edge, "edge")
    state.join("a", clips["a"])
    state.leave("a")
    assert len(state) == 0 and state.cache is None
    logits = state.join("b", clips["b"])
    check_row(edge, state, "b", clips["b"], logits)


@pytest.mark.parametrize("which", ["edge", "cloud"])
def test_rows_joining_together_match_their_own_full_forward(which, request, clips):
    """Several clips' prefills in one forward (right-padded prompts, audio through the tower
    together), one with answer tokens after its prompt (a lazy prefill), then a shared step."""
    model = request.getfixturevalue(which)
    state = BatchState(model, which)
    state.join("a", clips["a"])
    got = state.join_many({"b": (clips["b"], None, 1),
                           "c": (clips["c"], state_prompt(model, clips["c"]) + [40, 41, 42], 3),
                           "d": (clips["d"], None, 1)})
    assert [got[k].shape[0] for k in "bcd"] == [1, 3, 1]
    for key in "bcd":
        check_row(model, state, key, clips[key], got[key])
    assert state["c"].tokens_fed == 3 and state["c"].prefill_tokens == len(state_prompt(model, clips["c"]))
    got = state.advance({key: [43] for key in "abcd"})
    for key in "abcd":
        check_row(model, state, key, clips[key], got[key])


def compressed_audio_positions(model):
    """A get_rope_index under which a prompt's audio placeholders share one position (as an
    image's patches share positions in Qwen2.5-Omni), so rope_deltas = positions used − tokens is
    negative and differs per clip: what a row must add to its own length for the positions of
    every token after the prompt. Audio-only prompts give rope_deltas 0 with the real one."""
    audio = model.config.audio_token_id

    def get_rope_index(input_ids, image_grid_thw=None, video_grid_thw=None, attention_mask=None,
                       use_audio_in_video=False, audio_seqlens=None, second_per_grids=None):
        b, n = input_ids.shape
        pos, deltas = torch.zeros(3, b, n, dtype=torch.long), torch.zeros(b, 1, dtype=torch.long)
        for i in range(b):
            p, out, prev = 0, [], None
            for t in input_ids[i].tolist():
                if t == audio and prev == audio:
                    out.append(p - 1)
                else:
                    out.append(p)
                    p += 1
                prev = t
            pos[:, i] = torch.tensor(out)
            deltas[i] = p - n
        return pos.to(input_ids.device), deltas.to(input_ids.device)

    return get_rope_index


def test_each_row_adds_its_own_rope_deltas(cloud, clips, monkeypatch):
    monkeypatch.setattr(cloud.model, "get_rope_index", compressed_audio_positions(cloud), raising=False)
    state = BatchState(cloud, "cloud")
    for key in "abc":
        state.join(key, clips[key])
    deltas = {key: state[key].delta for key in "abc"}
    assert all(d < 0 for d in deltas.values()) and len(set(deltas.values())) == 3  # per row, not one for all
    got = state.advance({"a": [40, 41], "b": [42], "c": [43, 44, 45]})
    state.rollback("c", len(state["c"]) - 2)
    got.update(state.advance({"c": [46, 47]}))
    for key in "abc":
        check_row(cloud, state, key, clips[key], got[key])
