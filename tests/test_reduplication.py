"""Reduplicated Chinese through the decoding rules, on both tokenizers (issue 19).

Chinese describes a voice with doubled characters and reduplicated words: 慢慢、轻轻 (AA), 断断续续、
结结巴巴、支支吾吾 (AABB), 慢吞吞、懒洋洋 (ABB). The rules must let them through while every seed loop
is still blocked or escalated before its second round ends.

"Touched" (the oracle, read off the processed rows, teacher-forced token by token):
  * ban: the next token of the description is -inf after the processors;
  * flip: the processors change the greedy choice of a model that wants the description: a raw row
    with the description's token at 10 and every other token at 8 (ahead by 2 nats, ~7x as
    likely), whose processed argmax is another token;
  * penalised doubling: the token that doubles the character just written (the second 慢 of 慢/慢)
    has its score lowered at all (reduplication is not repetition; the strict check);
  * loop: the loop gate (`shows_loop`) fires on a block of the description (k = 1, 3, 4, 6);
  * stop: generation would stop before the final 。, or not at it.
"""

from __future__ import annotations

import random

import pytest
import torch
from test_descriptions import CORPUS, SEED_LOOPS, _encode, _rules, _whole_characters

from specdec_cli.decoding import DecodingConfig
from specdec_cli.prompt import render_prompt

# -- the corpus ------------------------------------------------------------------------------------
# Clauses a careful writer uses about a voice, each holding a reduplicated word (or an ABAC idiom,
# which is not a repeat at all). Each clause has >= 4 CJK characters, so it can stand between marks.
AA = ["说话慢慢的", "声音轻轻的", "语气淡淡的", "声音低低的", "语气稳稳的", "慢慢地说着话", "轻轻地说着话",
      "缓缓地讲述", "声音沉沉的", "声音柔柔的", "声音细细的", "声音微微发颤", "音调稍稍偏高", "声音渐渐变低",
      "悄悄地说话"]
AABB = ["说话断断续续", "说得结结巴巴", "回答支支吾吾", "说话吞吞吐吐", "说话磕磕绊绊", "说话絮絮叨叨",
        "语气平平淡淡", "吐字清清楚楚", "说话含含糊糊", "说话犹犹豫豫", "语气战战兢兢", "说话慌慌张张",
        "语气干干脆脆", "说话嘟嘟囔囔", "声音安安静静", "语气稳稳当当", "说话大大咧咧", "说话急急忙忙"]
ABB = ["说话慢吞吞的", "语速慢悠悠的", "语气懒洋洋的", "听起来笑嘻嘻的", "语气气呼呼的", "声音软绵绵的",
       "声音颤巍巍的", "语气怯生生的", "说话急匆匆的", "语气冷冰冰的", "声音沉甸甸的", "声音轻飘飘的",
       "说话慢腾腾的", "声音干巴巴的", "语气硬邦邦的", "声音暖洋洋的", "声音娇滴滴的", "声音闷沉沉的"]
ABAC = ["说话一字一顿", "音调忽高忽低", "语速时快时慢", "声音有气无力", "说话细声细气"]
GENDER = ["男声", "女声"]
RATE = ["语速较慢", "语速适中", "语速较快"]
PITCH = ["音调偏低", "音调适中", "音调偏高"]
VOLUME = ["音量较小", "音量适中", "音量较大"]
EMOTION = ["情绪低落", "情绪平静", "情绪激动"]
TEMPLATES = [
    "说话人是{g}，{x}，{p}，{e}。",
    "这是{g}，{r}，{x}，{e}。",
    "{x}，{r}，{p}，整体{e}。",
    "说话人是{g}，{r}，{x}，{v}，{e}。",
    "听起来是一位{g}，{x}，{e}。",
    "这是一段{g}录音，{p}，{v}，{x}。",
    "说话者为{g}，{x}，{y}，{e}。",
    "这位说话人是{g}，{r}，{p}，{x}，{y}。",
]


def redup_corpus(n: int = 160) -> list[str]:
    """`n` descriptions, each holding at least one reduplicated word, from a fixed seed: every
    clause of AA, AABB and ABB appears (twice drawn, duplicates dropped)."""
    rng = random.Random(19)
    pool = AA + AABB + ABB
    clauses = pool * 2 + [rng.choice(pool) for _ in range(n - 2 * len(pool))]
    rng.shuffle(clauses)
    out: list[str] = []
    for i, x in enumerate(clauses):
        # A second clause with another opening pair of characters (说话…，说话… reads badly).
        y = rng.choice([c for c in pool + ABAC if c[:2] not in x])
        text = TEMPLATES[i % len(TEMPLATES)].format(g=rng.choice(GENDER), r=rng.choice(RATE), p=rng.choice(PITCH),
                                                    v=rng.choice(VOLUME), e=rng.choice(EMOTION), x=x, y=y)
        if text not in out:
            out.append(text)
    return out


REDUP = redup_corpus()
CONFIDENT, RUNNER_UP = 10.0, 8.0


@pytest.fixture(scope="module", params=["demo", "qwen"])
def tok(request):
    if request.param == "demo":
        from specdec_cli.demo.tokenizer import build_tokenizer

        return build_tokenizer(CORPUS + REDUP + [p + u for p, u in SEED_LOOPS])
    return request.getfixturevalue("qwen_tokenizer")


def touched(tok, text: str, cfg: DecodingConfig | None = None) -> str | None:
    """Why the rules touch `text` (see the module docstring), or None."""
    prompt = _encode(tok, render_prompt())
    ids = prompt + _encode(tok, text)
    rules = _rules(tok, prompt, cfg)
    width = 152064 if len(tok) > 150000 else len(tok)
    for i in range(len(prompt), len(ids)):
        target = ids[i]
        raw = torch.full((width,), RUNNER_UP)
        raw[target] = CONFIDENT
        scores = rules.process_ids(ids[:i], raw)
        piece = tok.decode(ids[len(prompt):i + 1])
        if not torch.isfinite(scores[target]):
            return f"ban at {piece}"
        if int(scores.argmax()) != target:
            return f"flip at {piece}"
        before, now = tok.decode(ids[len(prompt):i]), tok.decode([target])
        if before and now and before[-1] == now[0] and scores[target] < CONFIDENT:
            return f"penalised doubling at {piece}"
        if rules.stops(ids[:i + 1]) is not (i == len(ids) - 1):
            return f"stop at {piece}"
    for k in (1, 3, 4, 6):
        for start in range(len(prompt), len(ids), k):
            if rules.shows_loop(ids[:start + k], start):
                return f"loop at {tok.decode(ids[len(prompt):start + k])} (k={k})"
    return None


def test_the_corpus_is_reduplicated_and_larger_than_the_old_one():
    assert len(REDUP) >= 150 and len(set(REDUP)) == len(REDUP)
    assert len(REDUP) + len(CORPUS) > 1.5 * len(CORPUS)
    doubled = [t for t in REDUP if any(a == b for a, b in zip(t, t[1:], strict=False))]
    assert len(doubled) == len(REDUP)
    for word in AABB + ABB + AA:
        assert any(word in t for t in REDUP), word


def test_ordinary_and_reduplicated_descriptions_are_never_touched(tok):
    texts = [t for t in CORPUS + REDUP if _whole_characters(tok, t)]
    assert len(texts) >= 390
    bad = {t: why for t in texts if (why := touched(tok, t))}
    assert not bad, list(bad.items())[:5]


def test_the_oracle_sees_a_ban_a_penalty_and_a_loop(tok):
    """The same checks fire on text the rules must refuse: a character three times, a doubling that
    is also a repeat at a distance (penalised, though not enough to flip), and an ABAB repeat."""
    assert touched(tok, "说话人是女声，说话慢慢慢的，情绪平静。").startswith("ban")
    assert touched(tok, "说话人是女声，说话一顿一顿的，情绪平静。").startswith("loop")
    strong = DecodingConfig(max_new_tokens=200, repetition_penalty=1.5)  # 10 / 1.5 < 8: a flip
    assert touched(tok, "说话人是女声，语速较快，音调偏高，声音清亮，说话人很激动。", strong).startswith("flip")


def test_the_penalty_spares_only_the_doubling():
    """After 说/话 the penalty is HF's on the history less 话 (a second 话 is reduplication); after
    话/话 it is HF's on the whole history, and a third 话 is banned outright."""
    from transformers import RepetitionPenaltyLogitsProcessor

    from specdec_cli.decoding import DecodingRules, VocabMasks

    texts = ["<eos>", "说", "话", "人", "，", "慢慢"]
    masks = VocabMasks.from_texts(texts, len(texts))
    rules = DecodingRules.build(DecodingConfig(), masks, prompt_len=0, eos_ids=[0])
    torch.manual_seed(0)
    raw = torch.randn(len(texts)) * 3
    hf = RepetitionPenaltyLogitsProcessor(1.2)
    once = rules.process_ids([1, 2], raw)
    assert torch.equal(once[:4], hf(torch.tensor([[1]]), raw[None].clone())[0, :4])  # (， gated)
    twice = rules.process_ids([1, 2, 2], raw)
    assert twice[2] == -float("inf")
    assert twice[1] == hf(torch.tensor([[1, 2]]), raw[None].clone())[0, 1]
    assert once[5] == raw[5] and rules.process_ids([1, 3], raw)[5] == raw[5]  # 说慢慢, 人慢慢: fine
    assert rules.process_ids([5], raw)[5] == -float("inf")                    # 慢慢慢慢: banned
    assert torch.isfinite(rules.process_ids([5, 4, 1, 2, 3, 1], raw)[5])       # 慢慢，…慢慢 across a mark
