"""Property tests of the decoding rules on both tokenizers: the demo's character tokenizer and the
real Qwen2.5-Omni one (语/速/较快, 音/调/偏/高, 适/中).

Ordinary descriptions, teacher-forced token by token through the rules, are never touched: no
token banned, no stop before the end, a stop at the final 。, the loop gate silent. Every loop of
the seeds is blocked before its second round completes: a token banned, or the loop gate sending
the block to the cloud."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from specdec_cli.decoding import DecodingConfig, DecodingRules, VocabMasks
from specdec_cli.decoding.vocab import content_chars
from specdec_cli.prompt import render_prompt

# -- the corpus ----------------------------------------------------------------------------------
# Canonical phrases (demo-spec.md) in templates with the connectives a careful writer uses, plus
# free phrasing. Generated from a fixed seed, so the list is the same on every run.
GENDER = ["男声", "女声"]
RATE = ["语速较慢", "语速适中", "语速较快"]
PITCH = ["音调偏低", "音调适中", "音调偏高"]
VOLUME = ["音量较小", "音量适中", "音量较大"]
PAUSES = ["停顿较少", "停顿较多"]
EMOTION = ["情绪低落", "情绪平静", "情绪激动"]
TEMPLATES = [
    "说话人是{g}，{r}，{p}，{v}，{pa}，整体{e}。",
    "说话者为{g}，{r}，{p}，{v}，{pa}，{e}。",
    "这是一段{g}录音，{r}，{p}，{v}，{pa}，整体{e}。",
    "听起来是{g}，{r}，{p}，{v}，{pa}，{e}。",
    "这是{g}，{r}，{p}，{v}，{pa}，整体{e}。",
    "说话人是{g}，{p}，{r}，{v}，{pa}，听起来{e}。",
    "这位说话人是{g}，{r}而且{p}，{v}，{pa}，{e}。",
    "从声音判断是{g}，{r}，{p}，{v}，说话时{pa}，{e}。",
    "说话人为{g}，{e}，{r}，{p}，{v}，{pa}。",
    "一位{g}说话者，{r}，{p}，{v}，{pa}，整体{e}。",
    "说话人是{g}，{r}，{p}，{v}，{pa}，整体听起来{e}。",
    "录音中的说话人是{g}，{v}，{p}，{r}，{pa}，{e}。",
]
FREE = [
    "这位女士的声音清亮柔和，语速适中，语气平和，停顿自然。",
    "声音低沉而浑厚，语速较慢，音调偏低，情绪平静。",
    "说话人的音色清亮，音调偏高，音量适中，听起来情绪激动。",
    "一位男性说话者，声音低沉，语速较慢，停顿较多，情绪低落。",
    "这是女声，音色明亮，语速适中，音量适中，停顿自然，语气平和。",
    "说话人是男声，音调适中，音量适中，语速适中，情绪平静。",
    "音调适中，音量适中，音色清亮，声音低沉，语气平和，停顿自然。",
    "这是男声，声音洪亮，语速较快，音量较大，停顿较少，情绪激动。",
    "这是女声，声音温柔，音调偏高，音量较小，停顿较多，语气平和。",
    "说话人语速较快，音调较高，音量较大，语气急促，情绪激动。",
    "他说话的声音比较低沉，语速较慢，停顿也比较多，整体情绪低落。",
    "她的声音清脆悦耳，语速适中，音调偏高，语气轻松，情绪平静。",
    "这段录音里是一位男声，吐字清晰，语速适中，音量适中，语气平和。",
    "说话人声音沙哑，音调偏低，语速较慢，停顿较多，显得有些疲惫。",
    "这是女声，音色甜美，语速较快，音调偏高，听起来很开心。",
    "这是男声，音色厚重，语速平稳，音调偏低，整体情绪平静。",
    "说话者是女声，声音柔和，语速较慢，音量较小，情绪低落。",
    "说话人是男声，声音有力，语速较快，音量较大，情绪激动。",
    "声音清亮，音调偏高，音量适中，语速适中，停顿自然，语气平和。",
    "整体来看是女声，语速适中，音调适中，音量适中，情绪平静。",
    "说话人是女声，声音轻柔，吐字清楚，语速较慢，停顿较多。",
    "这是男声，嗓音低沉，语速较慢，音调偏低，音量较小，情绪低落。",
    "这是男声，语气坚定，语速较快，音调适中，音量较大。",
    "这是女声，语调起伏明显，语速较快，音量较大，情绪激动。",
    "说话人是男声，音色浑厚，音调偏低，语速适中，语气平和。",
    "这是女声，声音明亮，音调偏高，语速较快，停顿较少，情绪激动。",
    "说话人的声音低沉，语速较慢，音量较小，停顿较多，情绪低落。",
    "这是男声，音色清亮，语速适中，音调偏高，音量适中，语气轻快。",
    "这是女声，声音平稳，语速适中，音量适中，停顿较少，情绪平静。",
    "这位男士说话很慢，音调偏低，音量较小，听起来情绪低落。",
    "说话人是女声，声音有点紧张，语速较快，音调偏高，停顿较少。",
    "这是男声，说话节奏均匀，语速适中，音调适中，情绪平静。",
    "这是女声，说话时略带笑意，语速适中，音调偏高，情绪愉快。",
    "说话人为男声，声音沉稳，语速较慢，音量适中，语气平和。",
    "这是女声，音色柔美，音调适中，音量较小，停顿自然，情绪平静。",
    "说话者声音洪亮，语速较快，音调偏高，音量较大，情绪激动。",
    "这是一位女声，语速较慢，音调偏低，音量较小，情绪低落。",
    "这是男声，音调偏高，语速较快，音量较大，停顿较少，语气激昂。",
    "这是女声，嗓音清澈，语速适中，音量适中，停顿较多，语气温和。",
    "说话人是男声，声音略显低沉，语速较慢，停顿较多，情绪平静。",
]


def corpus() -> list[str]:
    rng = random.Random(0)
    combos = list(itertools.product(GENDER, RATE, PITCH, VOLUME, PAUSES, EMOTION))
    rng.shuffle(combos)
    out = []
    for i, (g, r, p, v, pa, e) in enumerate(combos[:200]):
        out.append(TEMPLATES[i % len(TEMPLATES)].format(g=g, r=r, p=p, v=v, pa=pa, e=e))
    return out + FREE


CORPUS = corpus()

# Seed loops (seeds 000, 001, 003, 004): (prefix, repeated unit). Blocked means a token banned or
# the loop gate firing at a token that starts before the prefix + two copies of the unit end.
SEED_LOOPS = [
    ("说话人说话时语速较慢，音调平稳，音量适中，", "音色中，"),
    ("", "音色中，"),
    ("说话人用缓慢的语速，音调平稳，", "情绪，情绪情绪，"),
    ("说话人", "犹豫犹豫，"),
    ("说话人在", "地方的"),
    ("", "语，速，较，快，"),
    ("说话人", "真想"),
    ("说话人说话时", "员在"),
    ("说话人是女声，", "停顿"),
    ("说话人是女声，语速较快，", "音调偏高，"),
    ("说话人是男声，", "语速适中音调适中"),
]


@pytest.fixture(scope="module")
def demo_tokenizer():
    from specdec_cli.demo.tokenizer import build_tokenizer

    texts = CORPUS + [p + u for p, u in SEED_LOOPS]
    return build_tokenizer(texts)


@pytest.fixture(scope="module", params=["demo", "demo-v2", "qwen"])
def tok(request, demo_tokenizer):
    if request.param == "demo":
        return demo_tokenizer
    if request.param == "demo-v2":  # the compact Qwen-style BPE of issue 11
        from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer

        return build_qwen_style_tokenizer()
    return request.getfixturevalue("qwen_tokenizer")


def _whole_characters(tok, text: str) -> bool:
    """Whether `text` tokenizes into whole characters. The v2 demo vocabulary holds only the
    demo corpus's tokens; other characters fall back to byte tokens, which the rules never emit
    (U+FFFD), so those texts are outside what that tokenizer can answer."""
    return all("\ufffd" not in tok.decode([i]) for i in tok.encode(text, add_special_tokens=False))


def _rules(tok, prompt: list[int], cfg: DecodingConfig | None = None) -> DecodingRules:
    width = 152064 if len(tok) > 150000 else len(tok)  # Qwen: the 7B thinker's padded width
    masks = VocabMasks.for_tokenizer(tok, width)
    eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    return DecodingRules.build(cfg or DecodingConfig(max_new_tokens=200), masks, len(prompt), eos)


def _encode(tok, text: str) -> list[int]:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.unk_token_id is None or tok.unk_token_id not in ids, text
    assert tok.decode(ids) == text
    return ids


def test_corpus_is_large_and_ordinary():
    assert len(CORPUS) >= 200 and len(set(CORPUS)) == len(CORPUS)
    assert all(d.endswith("。") and d.count("。") == 1 for d in CORPUS)
    assert sum("适中" in d and d.count("适中") >= 2 for d in CORPUS) >= 20  # repeated 适中
    assert all(d.count("音") >= 2 for d in CORPUS[:200])                    # 音调 and 音量


def test_ordinary_descriptions_pass_every_rule(tok):
    """Teacher-forced through the processors themselves (rows of the model's width): the next
    token is never -inf, nothing stops before the final 。, that 。 stops, the loop gate is silent."""
    prompt = _encode(tok, render_prompt())
    width = 152064 if len(tok) > 150000 else len(tok)
    zeros = torch.zeros(width)
    texts = [t for t in CORPUS if _whole_characters(tok, t)]
    assert len(texts) >= 180
    for text in texts:
        ids = prompt + _encode(tok, text)
        rules = _rules(tok, prompt)
        for i in range(len(prompt), len(ids)):
            scores = rules.process_ids(ids[:i], zeros)
            assert torch.isfinite(scores[ids[i]]), (text, tok.decode(ids[len(prompt):i + 1]))
            assert rules.stops(ids[:i + 1]) is (i == len(ids) - 1), (text, tok.decode(ids[len(prompt):i + 1]))
        for k in (1, 3, 4, 6):
            for start in range(len(prompt), len(ids), k):
                assert not rules.shows_loop(ids[:start + k], start), (text, k)


def _blocked_at(tok, rules: DecodingRules, prompt: list[int], ids: list[int]) -> int | None:
    """Characters of the answer before the first token the rules ban or the loop gate flags."""
    for i in range(len(prompt), len(ids)):
        banned = rules.banned(ids[:i], 152064 if len(tok) > 150000 else len(tok))
        if (banned == ids[i]).any() or rules.shows_loop(ids[:i + 1], i):
            return len(tok.decode(ids[len(prompt):i]))
    return None


# The seeds' loops, and loops of a doubled word (doubling alone is ordinary Chinese: 慢慢, 轻轻).
@pytest.mark.parametrize(("prefix", "unit"), SEED_LOOPS + [("说话人", "慢慢，"), ("说话人是女声，", "轻轻的")])
def test_seed_loops_are_blocked_before_their_second_round_ends(tok, prefix, unit):
    prompt = _encode(tok, render_prompt())
    text = prefix + unit * 4
    if not _whole_characters(tok, text):
        pytest.skip("characters outside this tokenizer's vocabulary")
    ids = prompt + _encode(tok, text)
    at = _blocked_at(tok, _rules(tok, prompt), prompt, ids)
    assert at is not None and at < len(prefix) + 2 * len(unit), (text, at)  # the token holding the end


def test_abab_token_id_loops_are_blocked(tok):
    """Tokens with no CJK character (here Latin words): only the id-level loop gate sees them."""
    prompt = _encode(tok, render_prompt())
    rules = _rules(tok, prompt)
    a, b = _encode(tok, "ok")[0], _encode(tok, "no")[0]
    for unit in ([a, b], [a], [a, b, b]):
        ids = prompt + unit * 4
        at = next(i for i in range(len(prompt), len(ids)) if rules.shows_loop(ids[:i + 1], i))
        assert at - len(prompt) < 2 * len(unit)


def test_why_four_characters():
    """n=3 would refuse ordinary descriptions (适中音 in 语速适中，音调适中，音量…); at n=4 none of
    the corpus repeats a gram, and every seed loop still does within two rounds."""
    def repeats(text: str, n: int) -> bool:
        s = content_chars(text)
        grams = [s[i:i + n] for i in range(len(s) - n + 1)]
        return len(grams) != len(set(grams))

    assert sum(repeats(d, 3) for d in CORPUS) >= 15  # 19 of 240
    assert not any(repeats(d, 4) for d in CORPUS)
    assert all(repeats(p + u * 2 + u[:2], 4) or len(content_chars(u)) < 2 for p, u in SEED_LOOPS)


def test_qwen_splits_descriptions_into_several_tokens(qwen_tokenizer):
    """The corpus exercises multi-token Chinese on Qwen (语/速/较快), single tokens on the demo."""
    pieces = [qwen_tokenizer.decode([i]) for i in qwen_tokenizer.encode("说话人是女声，语速较快，音调偏高。")]
    assert pieces == ["说话", "人", "是", "女", "声", "，", "语", "速", "较快", "，", "音", "调", "偏", "高", "。"]


def test_every_demo_target_passes_every_rule():
    """The v2 demo pair is trained on these targets and decoded under these rules: a target the
    rules refuse (v2.0's "{gender}，…" opened with 2 characters before a comma) teaches the model
    an answer it may not write. Teacher-forced as above, on the v2 demo tokenizer."""
    from specdec_cli.demo.corpus import all_descriptions
    from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer

    tok = build_qwen_style_tokenizer()
    prompt = _encode(tok, render_prompt())
    zeros = torch.zeros(len(tok))
    targets = all_descriptions()
    assert len(targets) >= 800
    for text in targets:
        ids = prompt + _encode(tok, text)
        rules = _rules(tok, prompt)
        for i in range(len(prompt), len(ids)):
            assert torch.isfinite(rules.process_ids(ids[:i], zeros)[ids[i]]), (text, tok.decode(ids[len(prompt):i + 1]))
            assert rules.stops(ids[:i + 1]) is (i == len(ids) - 1), text
        for k in (2, 4, 6):
            for start in range(len(prompt), len(ids), k):
                assert not rules.shows_loop(ids[:start + k], start), (text, k)
