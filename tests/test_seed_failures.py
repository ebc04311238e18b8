"""One test per failure of the earlier prototype (../shared/docs/seed-digest.md, F1–F13).
Each would fail if the bug came back."""

from __future__ import annotations

import pytest
import torch
from conftest import clip
from toy import TableLM
from transformers import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

from specdec_cli.decoding import DecodingConfig, VocabMasks, generate_baseline, speculative_decode
from specdec_cli.decoding import loop as loop_module
from specdec_cli.decoding import verifier as verifier_module
from specdec_cli.decoding.processors import (
    ContentNoRepeatNGram,
    ContentRepetitionPenalty,
    DecodingRules,
    PunctuationGate,
    SentenceEndCriteria,
)
from specdec_cli.decoding.state import ModelState
from specdec_cli.decoding.vocab import content_chars

# A toy vocabulary: ids 0-2 specials-ish, CJK content, punctuation, ASCII.
TOY = ["<eos>", "x", "y", "说", "话", "人", "是", "语速较快", "音", "调", "高", "，", "。", "？", "z", "低", "沉", "慢",
       "声", "色", "好", "清", "亮"]
ID = {t: i for i, t in enumerate(TOY)}
TOY_MASKS = VocabMasks.from_texts(TOY, len(TOY))


def ids(*tokens: str, prompt: int = 2) -> torch.Tensor:
    """(1, L) history: `prompt` filler tokens then the answer tokens."""
    return torch.tensor([[ID["x"]] * prompt + [ID[t] for t in tokens]])


class RecordingState(ModelState):
    instances: list[ModelState] = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        type(self).instances.append(self)


def test_F1_both_caches_are_cut_back_to_the_accepted_prefix(edge, cloud, processor, masks, eos_ids, monkeypatch):
    """After every rejection, each cache equals a fresh prefill of exactly the tokens it holds,
    and those tokens are a prefix of the accepted sequence."""
    record_states(monkeypatch, RecordingState)
    inputs = processor(clip(5))
    checked = []

    def on_block(event):
        if event.correction_kind != "recovered":
            return
        assert {s.model for s in RecordingState.instances[-2:]} == {edge, cloud}
        for state in RecordingState.instances[-2:]:
            prompt_len = inputs["input_ids"].shape[1]
            held = state.ids[prompt_len:]
            assert held == event.answer[:len(held)]
            fresh = ModelState(state.model)
            fresh.prefill(inputs)
            if held:
                fresh.advance(held)
            for a, b in zip(state.cache.layers, fresh.cache.layers, strict=True):
                assert torch.allclose(a.keys, b.keys, atol=1e-5)
            checked.append(event.index)

    cfg = DecodingConfig(k=4, max_new_tokens=20, verify="always")
    speculative_decode(edge, cloud, inputs, cfg, masks, eos_ids, on_block)
    assert checked, "the unrelated pair should reject something"


def test_F2_next_draft_starts_from_the_last_accepted_token(edge, cloud, processor, masks, eos_ids):
    """No stale seed: after a rejection the edge's next forward is fed exactly the cloud's
    recovered token; after a full acceptance, the last draft token and the bonus token."""
    calls: list[list[int]] = []
    handle = edge.register_forward_pre_hook(
        lambda m, a, kw: calls.append(kw["input_ids"][0].tolist()), with_kwargs=True)
    marks: list[tuple[int, object]] = []
    try:
        cfg = DecodingConfig(k=3, max_new_tokens=24, verify="always")
        speculative_decode(edge, cloud, processor(clip(6)), cfg, masks, eos_ids,
                           lambda e: marks.append((len(calls), e)))
    finally:
        handle.remove()
    seen = 0
    for n_calls, event in marks:
        if event.done:
            break
        next_input = calls[n_calls]
        if event.correction_kind == "recovered":
            assert next_input == [event.correction]
            seen += 1
        elif event.correction_kind == "bonus":
            assert next_input == [event.draft[-1], event.correction]
    assert seen


def record_states(monkeypatch, cls: type[RecordingState]) -> None:
    """Make every ModelState the loop builds (the edge's in loop.py, the cloud's in verifier.py)
    a `cls`, listed in cls.instances."""
    cls.instances = []
    monkeypatch.setattr(loop_module, "ModelState", cls)
    monkeypatch.setattr(verifier_module, "ModelState", cls)


class AdvanceWatch(RecordingState):
    """A ModelState that knows when it is inside its own `advance`."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.depth = 0

    def advance(self, tokens, keep=None):
        self.depth += 1
        try:
            return super().advance(tokens, keep)
        finally:
            self.depth -= 1


def test_F3_one_place_advances_a_cache(edge, cloud, processor, masks, eos_ids, monkeypatch):
    """Every cache growth goes through ModelState.advance: each write into a cache (the cache's
    own `update`, which every attention layer calls to append its keys and values) happens while
    the state owning that cache is inside its `advance`, and nowhere else. A second forward on the
    cache while "updating context" (the prototype's bug) would write outside it. And the positions
    written add up: layer 0 grows by exactly the tokens advance was given, minus rollbacks."""
    from transformers import DynamicCache

    record_states(monkeypatch, AdvanceWatch)
    writes = []  # (state, positions written), one per layer-0 update
    original_update = DynamicCache.update

    def watched_update(cache, key_states, value_states, layer_idx, *args, **kwargs):
        owners = [s for s in AdvanceWatch.instances if s.cache is cache]
        assert len(owners) == 1, "a cache no ModelState owns was written"
        assert owners[0].depth > 0, f"{owners[0].name}'s cache grew outside ModelState.advance"
        if layer_idx == 0:
            writes.append((owners[0], key_states.shape[-2]))
        return original_update(cache, key_states, value_states, layer_idx, *args, **kwargs)

    monkeypatch.setattr(DynamicCache, "update", watched_update)

    def on_block(event):
        for state in AdvanceWatch.instances[-2:]:
            assert state.cache.get_seq_length() == len(state.ids)

    result = speculative_decode(edge, cloud, processor(clip(7)),
                                DecodingConfig(k=5, max_new_tokens=20, threshold=2.0), masks, eos_ids, on_block)
    states = AdvanceWatch.instances[-2:]
    assert {s.model for s in states} == {edge, cloud} and result.stats.cloud_calls > 0
    for state in states:
        grown = sum(n for s, n in writes if s is state)
        assert grown >= len(state.ids) > len(state.prompt_ids)  # rollbacks make up the difference


def test_F4_repetition_penalty_has_hf_semantics():
    """Positive logits divided, negative multiplied: a repeated token always loses probability.
    (The prototype divided everything by 1.1, which raised negative logits.) Bit-identical to HF's
    own processor given the answer's content tokens."""
    proc = ContentRepetitionPenalty(1.2, prompt_len=2, masks=TOY_MASKS)
    scores = torch.zeros(1, len(TOY))
    scores[0, ID["说"]], scores[0, ID["话"]], scores[0, ID["人"]] = 3.0, -2.0, 1.0
    out = proc(ids("说", "话", "，"), scores)  # (after 说/话 alone, 话 would be a doubling: not penalised)
    assert out[0, ID["说"]] == pytest.approx(2.5)
    assert out[0, ID["话"]] == pytest.approx(-2.4)   # more negative, not less
    assert out[0, ID["人"]] == 1.0                    # not in history: untouched
    history = ids("说", "，", "语速较快", "说", "x", "话", "。")
    random = torch.randn(1, len(TOY))
    hf = RepetitionPenaltyLogitsProcessor(1.2)(torch.tensor([[ID["说"], ID["语速较快"], ID["说"], ID["话"]]]), random)
    assert torch.equal(proc(history, random), hf)


def test_F5_no_repeat_ngram_bans_every_continuation_seen_before():
    """After `x`, every `y` with `x y` in the history is banned, so `A B A B` is impossible (the
    prototype only banned `A A`). Punctuation is stripped, so `A，B，A` bans B too. Over characters:
    with n=4 a multi-character token is banned when a 4-gram it completes occurred before."""
    proc = ContentNoRepeatNGram(2, prompt_len=2, masks=TOY_MASKS)
    out = proc(ids("音", "调", "音"), torch.zeros(1, len(TOY)))
    assert out[0, ID["调"]] == -float("inf")
    assert out[0, ID["音"]] == 0.0 and out[0, ID["高"]] == 0.0
    out = proc(ids("音", "，", "调", "，", "音"), torch.zeros(1, len(TOY)))
    assert out[0, ID["调"]] == -float("inf")
    four = ContentNoRepeatNGram(4, prompt_len=2, masks=TOY_MASKS)
    out = four(ids("语速较快", "，", "音", "调"), torch.zeros(1, len(TOY)))
    assert out[0, ID["语速较快"]] == -float("inf")     # 语速较快 again, inside one token
    assert out[0, ID["高"]] == 0.0                     # 调高: a 2-gram, nothing repeats
    out = four(ids("说", "话", "人", "是", "，", "说", "话", "人"), torch.zeros(1, len(TOY)))
    assert out[0, ID["是"]] == -float("inf") and out[0, ID["高"]] == 0.0


def test_F6_temperature_is_applied_once_and_last():
    rules = DecodingRules.build(DecodingConfig(temperature=0.7), TOY_MASKS, prompt_len=2, eos_ids=[0])
    warpers = [p for p in rules.processors if isinstance(p, TemperatureLogitsWarper)]
    assert len(warpers) == 1 and rules.processors[-1] is warpers[0]
    # Once, and after every other processor: scores with T == scores without T, divided by T once.
    plain = DecodingRules.build(DecodingConfig(), TOY_MASKS, prompt_len=2, eos_ids=[0])
    history = ids("说", "话", "人", "是", "音")
    logits = torch.randn(len(TOY))
    with_t, without_t = rules.process(history, logits), plain.process(history, logits)
    finite = torch.isfinite(without_t)
    assert torch.equal(finite, torch.isfinite(with_t)) and (~finite).any()  # constraints did fire
    assert torch.allclose(with_t[finite], without_t[finite] / 0.7)


def test_F7_incremental_steps_pass_positions_not_a_one_by_one_mask(edge, processor):
    seen = []
    handle = edge.register_forward_pre_hook(lambda m, a, kw: seen.append(kw), with_kwargs=True)
    try:
        state = ModelState(edge)
        state.prefill(processor(clip(1)))
        past = len(state)
        state.advance([40, 41])
    finally:
        handle.remove()
    step = seen[-1]
    assert "attention_mask" not in step or step["attention_mask"] is None
    expected = torch.arange(past, past + 2).view(1, 1, 2).expand(3, 1, 2) + state.rope_deltas.view(-1)[0]
    assert torch.equal(step["position_ids"], expected)
    # (test_state checks these positions reproduce a full forward's logits to 1e-4)


def test_F8_punctuation_gate_counts_characters_since_the_last_mark():
    gate = PunctuationGate(prompt_len=2, masks=TOY_MASKS, comma_min_chars=4, stop_min_chars=12)
    z = torch.zeros(1, len(TOY))
    assert gate(ids("说", "话", "人"), z)[0, ID["，"]] == -float("inf")       # 3 chars: no comma
    assert gate(ids("说", "话", "人", "是"), z)[0, ID["，"]] == 0.0            # 4 chars: allowed
    assert gate(ids("语速较快"), z)[0, ID["，"]] == 0.0                        # one token, 4 chars
    assert gate(ids("语速较快", "，", "音"), z)[0, ID["，"]] == -float("inf")  # counter restarts at a mark
    assert gate(ids("语速较快", "，", "音"), z)[0, ID["。"]] == -float("inf")  # 5 chars: no sentence end
    eleven = ("语速较快", "，", "音", "调", "高", "说", "话", "人", "是")
    assert gate(ids(*eleven), z)[0, ID["。"]] == -float("inf")
    assert gate(ids(*eleven, "好"), z)[0, ID["。"]] == 0.0                     # 12 chars


def test_F9_penalties_never_touch_punctuation():
    history = ids("说", "，", "话", "，", "人", "，")
    scores = torch.full((1, len(TOY)), 2.0)
    rep = ContentRepetitionPenalty(1.2, 2, TOY_MASKS)(history, scores)
    ngram = ContentNoRepeatNGram(2, 2, TOY_MASKS)(history, scores)
    for mark in ("，", "。"):
        assert rep[0, ID[mark]] == 2.0 and ngram[0, ID[mark]] == 2.0
    assert rep[0, ID["说"]] < 2.0


def _loop_pair():
    """An edge that confidently loops between content tokens / between ASCII tokens, and a cloud
    that would continue a varied sentence."""
    edge = TableLM(len(TOY), default=ID["说"])
    chain = ["说", "话", "人", "是", "声", "色", "好", "清", "亮", "低", "沉", "慢", "音", "调", "高"]
    cloud = TableLM(len(TOY), default=ID["说"])
    for a, b in zip(chain, chain[1:], strict=False):
        cloud.set(ID[a], ID[b])
        edge.set(ID[a], ID[b])
    cloud.set(ID["x"], ID["说"]).set(ID["y"], ID["z"]).set(ID["z"], ID["说"])
    return edge, cloud


def test_F10_constraints_see_previous_blocks():
    """The edge wants 说话说话…; with k=2 each repetition falls in a new block, so only a ban
    that sees earlier blocks stops it. Edge-only (threshold inf): the constrained output never
    repeats a 4-gram of its characters, where the unconstrained one loops."""
    edge, _ = _loop_pair()
    edge.set(ID["说"], ID["话"]).set(ID["话"], ID["说"])
    inputs = {"input_ids": torch.tensor([[ID["x"], ID["x"]]]), "attention_mask": torch.ones(1, 2, dtype=torch.long)}
    cfg = DecodingConfig(k=2, max_new_tokens=12, threshold=float("inf"))
    out = speculative_decode(edge, edge, inputs, cfg, TOY_MASKS, eos_ids=[0]).tokens
    stream = content_chars("".join(TOY[t] for t in out))
    grams = [stream[i:i + 4] for i in range(len(stream) - 3)]
    assert len(grams) == len(set(grams)) and stream.startswith("说话说话说")
    plain = speculative_decode(edge, edge, inputs, cfg.with_(constraints=False), TOY_MASKS, eos_ids=[0]).tokens
    assert [TOY[t] for t in plain[:8]] == ["说", "话"] * 4  # without constraints it does loop


def test_F11_a_confident_loop_escalates_whatever_the_entropy_and_does_not_stop():
    """An edge looping x y x y (ASCII: no content ban applies) with ~0 entropy: the loop detector
    sends the block to the cloud although the entropy is far below the threshold, and decoding goes
    on after the correction instead of breaking off."""
    edge, cloud = _loop_pair()
    edge.set(ID["x"], ID["y"]).set(ID["y"], ID["x"])
    inputs = {"input_ids": torch.tensor([[ID["x"]]]), "attention_mask": torch.ones(1, 1, dtype=torch.long)}
    cfg = DecodingConfig(k=4, max_new_tokens=12, threshold=1e6)
    events = []
    out = speculative_decode(edge, cloud, inputs, cfg, TOY_MASKS, eos_ids=[0], on_block=events.append)
    loops = [e for e in events if e.reason == "loop"]
    assert loops and all(e.uncertainty < 0.01 for e in loops)
    assert loops[0].accepted < len(loops[0].draft)        # the cloud broke the loop
    assert len(out.tokens) == 12                          # and decoding went on to the end
    # With loop detection impossible (threshold inf = never consult), the edge would loop on.
    never = speculative_decode(edge, cloud, inputs, cfg.with_(threshold=float("inf")), TOY_MASKS, eos_ids=[0])
    assert never.tokens[:4] == [ID["y"], ID["x"], ID["y"], ID["x"]]


def test_F11_a_confident_character_loop_escalates_before_any_ban_applies():
    """说话说话 breaks no ban yet (no 4-gram twice, no character twice in a row) but is a tandem
    repeat of the content stream: the block goes to the cloud at ~0 entropy, and the cloud's
    chain (说话人是…) replaces the loop."""
    edge, cloud = _loop_pair()
    edge.set(ID["说"], ID["话"]).set(ID["话"], ID["说"]).set(ID["x"], ID["说"])
    inputs = {"input_ids": torch.tensor([[ID["x"]]]), "attention_mask": torch.ones(1, 1, dtype=torch.long)}
    events = []
    cfg = DecodingConfig(k=4, max_new_tokens=8, threshold=1e6)
    out = speculative_decode(edge, cloud, inputs, cfg, TOY_MASKS, eos_ids=[0], on_block=events.append)
    assert events[0].reason == "loop" and events[0].uncertainty < 0.1  # the presets use 3-6 nats
    assert [TOY[t] for t in events[0].draft] == ["说", "话", "说", "话"]
    assert [TOY[t] for t in out.tokens[:3]] == ["说", "话", "人"]


def test_F12_one_sentence_stop_rule():
    crit = SentenceEndCriteria(prompt_len=2, masks=TOY_MASKS, min_chars=12)
    early = ids(*(["说"] * 5 + ["。"]))
    late = ids(*(["说"] * 11 + ["语速较快", "。"]))  # 15 CJK characters, 13 tokens
    assert not bool(crit(early, None)[0]) and bool(crit(late, None)[0])
    assert not bool(crit(ids(*(["说"] * 11 + ["。"])), None)[0])  # 11 characters: not yet
    # Through the loop: a 。 at token 5 does not stop, the ？ after 15 characters does.
    chain = ["说", "话", "人", "是", "。", "声", "色", "好", "清", "亮", "低", "沉", "慢", "音", "调", "高", "？", "说"]
    lm = TableLM(len(TOY), default=ID["z"])
    prev = "x"
    for tok in chain:
        lm.set(ID[prev], ID[tok])
        prev = tok
    inputs = {"input_ids": torch.tensor([[ID["x"]]]), "attention_mask": torch.ones(1, 1, dtype=torch.long)}
    out = speculative_decode(lm, lm, inputs, DecodingConfig(k=3, max_new_tokens=40, constraints=False),
                             TOY_MASKS, eos_ids=[0]).tokens
    assert [TOY[t] for t in out] == chain[:17]
    # EOS stops at once; max_new_tokens caps.
    lm.set(ID["是"], ID["<eos>"])
    out = speculative_decode(lm, lm, inputs, DecodingConfig(k=3, max_new_tokens=40, constraints=False),
                             TOY_MASKS, eos_ids=[0]).tokens
    assert [TOY[t] for t in out] == ["说", "话", "人", "是", "<eos>"]
    out = speculative_decode(lm, lm, inputs, DecodingConfig(k=3, max_new_tokens=2, constraints=False),
                             TOY_MASKS, eos_ids=[0]).tokens
    assert len(out) == 2


def test_F13_baselines_run_the_same_rules(edge, processor, masks, eos_ids, monkeypatch):
    """The HF-generate baseline receives the processors and sentence stop the spec loop uses."""
    captured = {}
    real_generate = edge.generate

    def spy(**kwargs):
        captured.update(kwargs)
        return real_generate(**kwargs)

    monkeypatch.setattr(edge, "generate", spy)
    inputs = processor(clip(2))
    cfg = DecodingConfig(mode="edge", temperature=0.9, max_new_tokens=6)
    generate_baseline(edge, inputs, cfg, masks, eos_ids)
    rules = DecodingRules.build(cfg, masks, inputs["input_ids"].shape[1], eos_ids)
    assert [type(p) for p in captured["logits_processor"]] == [type(p) for p in rules.processors]
    assert isinstance(captured["stopping_criteria"][0], SentenceEndCriteria)
    gc = captured["generation_config"]
    assert gc.max_new_tokens == 6 and list(gc.eos_token_id) == eos_ids
    assert gc.repetition_penalty in (None, 1.0) and gc.no_repeat_ngram_size in (None, 0)  # nothing doubled
    # (test_equivalence shows the outputs agree token for token with constraints on.)
