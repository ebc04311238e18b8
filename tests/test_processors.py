"""Vocabulary facts, the loop gate, the prompt and the audio processor."""

from __future__ import annotations

import pytest
from conftest import clip

from specdec_cli.decoding import DecodingConfig, DecodingRules, VocabMasks
from specdec_cli.decoding.loop import block_uncertainty
from specdec_cli.decoding.vocab import NO, facts_for_tokenizer, vocab_key
from specdec_cli.processor import audio_token_count
from specdec_cli.prompt import messages, render_prompt


def test_facts_come_from_each_tokens_text(tokenizer):
    masks = VocabMasks.for_tokenizer(tokenizer, len(tokenizer) + 7)  # model vocab may be padded
    facts, tid = masks.facts, tokenizer.convert_tokens_to_ids
    assert masks.vocab_size == len(tokenizer) + 7 and len(facts) == len(tokenizer)
    assert facts.cjk[tid("语速较快")] == "语速较快" and facts.cjk[tid("说")] == "说"
    assert facts.mark_pos[tid("，")] == 0 and facts.end_pos[tid("，")] == NO
    assert facts.end_pos[tid("。")] == 0 and facts.mark_pos[tid("。")] == NO
    assert facts.control[tid("<|im_end|>")] and not facts.control[tid("语速较快")]  # phrases are text
    assert facts.cjk[tid("a")] == ""
    assert VocabMasks.for_tokenizer(tokenizer, len(tokenizer) + 7).facts is facts  # built once


def test_facts_cache_is_keyed_by_content(tokenizer, tmp_path, monkeypatch):
    """A second process reads the disk cache; a tokenizer with other tokens gets other facts."""
    from specdec_cli.decoding import vocab
    from specdec_cli.demo.tokenizer import build_tokenizer

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(vocab, "_MEMORY", {})
    other = build_tokenizer(["别的字"])
    assert vocab_key(other) != vocab_key(tokenizer)
    fresh = build_tokenizer(["别的字"])
    first = facts_for_tokenizer(other)
    assert list(tmp_path.glob("vocab-facts-*.pkl"))
    monkeypatch.setattr(vocab, "_MEMORY", {})
    again = facts_for_tokenizer(fresh)  # new object, same content: from disk
    assert again is not first and again.cjk == first.cjk and (again.end_pos == first.end_pos).all()


LOOP_TEXTS = ["音色清亮，音色中", "犹豫犹豫", "音调适中，音量适中，音色适中", "女声，声音"]


@pytest.fixture(scope="module")
def loop_tokenizer():
    """The demo (character) tokenizer, holding every character of the texts below."""
    from specdec_cli.demo.tokenizer import build_tokenizer

    return build_tokenizer(LOOP_TEXTS)


def _rules(tokenizer):
    masks = VocabMasks.for_tokenizer(tokenizer, len(tokenizer))
    return DecodingRules.build(DecodingConfig(), masks, prompt_len=0, eos_ids=[0])


@pytest.mark.parametrize(("text", "new_from", "expected"), [
    ("音色清亮，音色中", 0, False),
    ("音色中，音色中", 4, True),             # the draft repeats the history: 音色中音色中
    ("音色中，音色中，", 8, False),          # old repeats are not news
    ("犹豫犹豫", 0, True),
    ("音调适中，音量适中，音色适中", 0, False),  # repeated 适中 at a distance: no loop
    ("女声，声音", 0, False),                # one-character units are 紧邻同字's business
])
def test_loop_gate_on_characters(loop_tokenizer, text, new_from, expected):
    rules = _rules(loop_tokenizer)
    ids = loop_tokenizer.encode(text)
    assert loop_tokenizer.unk_token_id not in ids
    cut = len(loop_tokenizer.encode(text[:new_from])) if new_from else 0
    assert rules.shows_loop(ids, cut) is expected


def test_loop_gate_on_token_ids(loop_tokenizer):
    """ABAB of tokens holding no CJK character (the character rules cannot see them)."""
    rules = _rules(loop_tokenizer)
    a, b = loop_tokenizer.convert_tokens_to_ids("a"), loop_tokenizer.convert_tokens_to_ids("b")
    assert not rules.shows_loop([a, b, a], 0)
    assert rules.shows_loop([a, b, a, b], 3) and rules.shows_loop([a, a], 1)
    assert not rules.shows_loop([a, b, a, b, 5], 4)


def test_block_uncertainty():
    assert block_uncertainty([0.5, 1.5, 1.0], "sum") == 3.0
    assert block_uncertainty([0.5, 1.5, 1.0], "max") == 1.5
    assert block_uncertainty([0.5, 1.5, 1.0], "mean") == 1.0


@pytest.mark.parametrize("bad", [{"k": 0}, {"threshold": -1.0}, {"threshold": float("nan")}, {"temperature": 0.0},
                                 {"mode": "fast"}, {"verify": "never"}, {"uncertainty": "median"},
                                 {"no_repeat_ngram": 1}, {"stop_min_chars": -1}])
def test_config_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        DecodingConfig(**bad)


def test_demo_chat_template_renders_the_prompt(tokenizer):
    assert tokenizer.apply_chat_template(messages(), tokenize=False, add_generation_prompt=True) == render_prompt()


@pytest.mark.parametrize("seconds", [0.3, 1.0, 2.37])
def test_processor_inserts_one_placeholder_per_encoder_frame(processor, edge, seconds):
    inputs = processor(clip(0, seconds))
    frames = int(inputs["feature_attention_mask"].sum())
    assert frames == int(seconds * 16000) // 160  # features on the valid length, not padded to 30 s
    n_audio = int((inputs["input_ids"] == edge.config.audio_token_index).sum())
    assert n_audio == audio_token_count(frames)
    # the encoder agrees: it emits exactly that many frames
    feats = edge.get_audio_features(inputs["input_features"], inputs["feature_attention_mask"]).last_hidden_state
    assert feats.shape[0] == n_audio
