"""The indexed bans equal a brute-force re-read of the text, over the whole vocabulary.

For each answer prefix, every token id is appended to the prefix's decoded text and the rules are
checked from scratch on the resulting string, with none of the indexes, facts or incremental state
the processors use. Text is decode(prefix) + decode(token): equal to decode(prefix + [token])
whenever neither holds a partial UTF-8 character, and tokens that do are banned either way."""

from __future__ import annotations

import itertools
import random
import unicodedata

import pytest

from specdec_cli.decoding import DecodingConfig, DecodingRules, VocabMasks
from specdec_cli.decoding.vocab import _self_triggers, new_grams_repeat

CFG = DecodingConfig()
N, COMMA, STOP = CFG.no_repeat_ngram, CFG.comma_min_chars, CFG.stop_min_chars
PREFIXES = [
    "",
    "说话人是女声",
    "说话人是女声，语速较快，音调偏高",
    "音色中，音色中",
    "犹豫犹豫犹",
    "情绪，情绪情",
    "语速适中，音调适中，音量",
    "说话人在地方的地方",
    "说话慢慢",
    "说话断断续续，慢",
    "说话慢吞",
    "这是男声，声音低沉，声",
    "说话人是男声，语速较慢，音调偏低，音量较小，停顿较多，整体情绪低",
    "ok no ok",
]


def _cjk(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf" or "\uf900" <= ch <= "\ufaff"


def _kind(ch: str) -> str:
    if _cjk(ch):
        return "cjk"
    if ch in "。！？":
        return "end"
    cat = unicodedata.category(ch)
    if cat.startswith("P"):
        return "neutral" if cat in ("Ps", "Pe", "Pi", "Pf") else "mark"
    return "other"


def brute_banned(prefix: str, token: str) -> bool:
    """Whether appending `token` to an answer reading `prefix` breaks a rule, read off the text."""
    text, start = prefix + token, len(prefix)
    if "\ufffd" in token:
        return True
    ends = [j for j, c in enumerate(token) if _kind(c) == "end"]
    if ends and token[ends[0] + 1:].strip():
        return True                                              # a sentence end, then more text
    stream, since, end_ok = "", 0, True
    for j, ch in enumerate(text):
        kind = _kind(ch)
        new = j >= start
        if kind == "cjk":
            if new and j > 1 and text[j - 1] == ch == text[j - 2]:
                return True                                      # 紧邻同字: three side by side
            stream += ch
            since += 1
            gram = stream[-N:]
            if new and len(gram) == N and stream.find(gram) < len(stream) - N:
                return True                                      # a 4-gram seen before
        elif kind == "mark":
            if new and since < COMMA:
                return True                                      # a mark too soon
            since = 0
        elif kind == "end" and new and end_ok:
            end_ok = False
            if len(stream) < STOP:
                return True                                      # a sentence end too soon
    return False


@pytest.fixture(scope="module")
def demo_tokenizer():
    from specdec_cli.demo.tokenizer import build_tokenizer

    return build_tokenizer(PREFIXES + ["声音低沉清亮。“（）！？"])


@pytest.fixture(scope="module", params=["demo", "qwen"])
def setup(request, demo_tokenizer):
    tok = demo_tokenizer if request.param == "demo" else request.getfixturevalue("qwen_tokenizer")
    width = len(tok) + 7 if request.param == "demo" else 152064
    texts = tok.batch_decode([[i] for i in range(len(tok))], skip_special_tokens=False)
    control = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items()
                                          if t.special or (t.content.startswith("<") and t.content.endswith(">"))}
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    rules = DecodingRules.build(CFG, VocabMasks.for_tokenizer(tok, width), prompt_len=0, eos_ids=[eos])
    return tok, width, texts, control, eos, rules


@pytest.mark.parametrize("prefix", PREFIXES)
def test_indexed_bans_equal_brute_force(setup, prefix):
    tok, width, texts, control, eos, rules = setup
    ids = tok.encode(prefix, add_special_tokens=False)
    assert tok.decode(ids) == prefix
    got = set(rules.banned(ids, width).tolist())
    expected = {t for t in range(width)
                if t >= len(texts) or (t in control and t != eos) or (t not in control and brute_banned(prefix, texts[t]))}
    assert got == expected, (sorted(got - expected)[:10], sorted(expected - got)[:10])


def test_eos_and_rows_past_the_tokenizer(setup):
    tok, width, _, _, eos, rules = setup
    banned = set(rules.banned([], width).tolist())
    assert eos not in banned and set(range(len(tok), width)) <= banned
    assert all(i in banned for i in tok.all_special_ids if i != eos)


def test_qwen_classes(qwen_tokenizer):
    """Markup added tokens are never text; sentence-end tokens with text after them are banned."""
    rules = DecodingRules.build(CFG, VocabMasks.for_tokenizer(qwen_tokenizer, 151936), 0, [151645])
    banned = set(rules.banned(qwen_tokenizer.encode("说话人是男声，语速较慢，音调偏低，音量"), 151936).tolist())
    tid = qwen_tokenizer.convert_tokens_to_ids
    for markup in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_pad|>", "<|file_sep|>"):
        assert tid(markup) in banned
    for piece in ("。（", "。“", "。，"):
        ids = qwen_tokenizer.encode(piece)
        assert len(ids) == 1 and ids[0] in banned, piece
    assert qwen_tokenizer.encode("。")[0] not in banned and qwen_tokenizer.encode("较大")[0] not in banned
    fffd = [i for i in range(151643) if "\ufffd" in qwen_tokenizer.decode([i])]
    assert len(fffd) > 1000 and set(fffd) <= banned


def test_self_repeat_triggers_are_exact():
    """For every token string over a small alphabet and every stream tail: the token repeats a gram
    it completes itself exactly when some suffix of the tail is one of its triggers."""
    rng = random.Random(0)
    alphabet = "甲乙丙"
    tails = ["".join(p) for k in range(0, N) for p in itertools.product(alphabet, repeat=k)]
    for _ in range(400):
        c = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        if new_grams_repeat("", c, N):
            continue  # repeats inside itself: banned outright, triggers not consulted
        trig = _self_triggers(c, N)
        for tail in tails:
            expected = new_grams_repeat(tail, c, N)
            assert any(tail[-s:] in trig for s in range(1, len(tail) + 1)) is expected, (tail, c)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fast_path_equals_the_processors_one_by_one(setup, temperature):
    """`process_ids` / `process_block` (all bans of a row at once) give bit for bit what HF
    `generate` computes by calling each processor in turn; the drafter's entropy from its one
    softmax equals the reference formula."""
    import torch

    from specdec_cli.decoding.drafter import entropy, pick

    tok, width, _, _, eos, _ = setup
    cfg = CFG.with_(temperature=temperature)
    rules = DecodingRules.build(cfg, VocabMasks.for_tokenizer(tok, width), prompt_len=2, eos_ids=[eos])
    torch.manual_seed(0)
    answer = tok.encode("说话人是女声，语速较快，音调偏高，音量", add_special_tokens=False)
    prompt = answer[:2]
    rows = torch.randn(len(answer) - 1, width) * 4
    block = rules.process_block(prompt, answer[2:], rows)
    for j in range(rows.shape[0]):
        ids = prompt + answer[2:2 + j]
        chain = rows[j][None].clone()
        for processor in rules.processors:
            chain = processor(torch.tensor([ids]), chain)
        fast = rules.process_ids(ids, rows[j])
        assert torch.equal(fast, chain[0]) and torch.equal(block[j], chain[0])
        token, h, _ = pick(fast.clone(), None, rules.banned_parts(ids, width))
        assert token == int(torch.argmax(chain[0])) and h == pytest.approx(entropy(chain[0]), abs=1e-3)
        changed = rules.changed_ids(ids, width)
        assert (changed is None) == (temperature != 1.0)
        if changed is not None:  # the entropy from the raw logits plus the penalty's correction
            before = fast.clone()
            token2, h2, _ = pick(fast, None, (), raw=rows[j], changed=changed)
            assert token2 == token and h2 == pytest.approx(h, abs=1e-5)
            assert torch.equal(fast, before)  # the row is read, never written


def test_verification_rows_are_processed_only_up_to_the_first_rejection(setup):
    """The verifier's lazy rows equal `process_block`'s bit for bit, and the greedy verdict reads
    (so the rules process) rows up to the first disagreement only: one row for a draft rejected at
    its first token, all k+1 for a draft accepted whole (the bonus row)."""
    import torch

    from specdec_cli.decoding.acceptance import greedy_verdict
    from specdec_cli.decoding.verifier import TargetScores

    tok, width, _, _, eos, _ = setup
    rules = DecodingRules.build(CFG, VocabMasks.for_tokenizer(tok, width), prompt_len=2, eos_ids=[eos])
    answer = tok.encode("说话人是女声，语速较快，音调偏高", add_special_tokens=False)
    prompt, draft = answer[:2], answer[2:7]
    torch.manual_seed(1)
    rows = torch.randn(len(draft) + 1, width)
    block = rules.process_block(prompt, draft, rows)
    lazy = TargetScores(rules, prompt, draft, rows)
    assert all(torch.equal(lazy[j], block[j]) for j in reversed(range(len(draft) + 1)))
    assert torch.equal(lazy.dense(), block)

    agree = rows.clone()  # the target agrees with draft[:2], then prefers another token
    for j, t in enumerate(draft[:2]):
        agree[j, t] = 100.0
    for wanted, accepted in ((agree, 2), (rows, None)):
        lazy = TargetScores(rules, prompt, draft, wanted)
        verdict = greedy_verdict(draft, lazy)
        expected = greedy_verdict(draft, rules.process_block(prompt, draft, wanted))
        assert verdict == expected and (accepted is None or verdict.accepted == accepted)
        assert lazy.processed_rows == verdict.accepted + 1


def test_repetition_penalty_on_qwen_tokens(qwen_tokenizer):
    """What the penalty does to legitimately repeated characters: on Qwen 音调 is 音/调, so after
    it the single-character token 音 is in the history and 音量 / 音色 pay the penalty on their
    音; 较快 and 较少 are different tokens, so 较 is not penalised by 较快."""
    import torch

    tok = qwen_tokenizer
    rules = DecodingRules.build(CFG, VocabMasks.for_tokenizer(tok, 152064), prompt_len=0, eos_ids=[151645])
    ids = tok.encode("说话人是女声，语速较快，音调偏高，")
    row = rules.process_ids(ids, torch.full((152064,), 6.0))
    yin, jiao, jiaoshao = tok.encode("音")[0], tok.encode("较")[0], tok.encode("较少")[0]
    assert row[yin] == pytest.approx(5.0)             # 6 / 1.2
    assert row[jiao] == 6.0 and row[jiaoshao] == 6.0
    assert row[tok.encode("，")[0]] == -float("inf")  # the gate, not the penalty
