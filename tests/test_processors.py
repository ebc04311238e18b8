"""Vocabulary masks, the loop detector, the prompt and the audio processor."""

from __future__ import annotations

import pytest
from conftest import clip

from specdec_cli.decoding import DecodingConfig, VocabMasks
from specdec_cli.decoding.loop import block_uncertainty, repeats_ngram
from specdec_cli.processor import audio_token_count
from specdec_cli.prompt import messages, render_prompt


def test_masks_come_from_each_tokens_text(tokenizer):
    masks = VocabMasks.for_tokenizer(tokenizer, len(tokenizer) + 7)  # model vocab may be padded
    tid = tokenizer.convert_tokens_to_ids
    assert masks.content.shape[0] == len(tokenizer) + 7 and not masks.content[len(tokenizer):].any()
    assert masks.content[tid("语速较快")] and masks.cjk_chars[tid("语速较快")] == 4
    assert masks.content[tid("说")] and masks.cjk_chars[tid("说")] == 1
    assert masks.comma_like[tid("，")] and masks.punct[tid("，")] and not masks.content[tid("，")]
    assert masks.sentence_end[tid("。")] and not masks.comma_like[tid("。")]
    assert not masks.content[tid("<|im_end|>")] and not masks.content[tid("a")]
    assert VocabMasks.for_tokenizer(tokenizer, len(tokenizer) + 7) is masks  # built once


@pytest.mark.parametrize(("answer", "new_from", "expected"), [
    ([1, 2, 3, 4, 5], 3, False),
    ([1, 2, 3, 1, 2, 3], 3, True),          # the draft repeats the history
    ([1, 2, 3, 1, 2, 3], 6, False),         # old repeats are not news
    ([7, 1, 2, 3, 9, 1, 2], 5, False),      # only a 2-gram repeats
    ([7, 1, 2, 3, 9, 1, 2, 3], 5, True),    # the 3-gram straddles the block boundary
])
def test_loop_detector(answer, new_from, expected):
    assert repeats_ngram(answer, 3, new_from) is expected


def test_block_uncertainty():
    assert block_uncertainty([0.5, 1.5, 1.0], "sum") == 3.0
    assert block_uncertainty([0.5, 1.5, 1.0], "max") == 1.5
    assert block_uncertainty([0.5, 1.5, 1.0], "mean") == 1.0


@pytest.mark.parametrize("bad", [{"k": 0}, {"threshold": -1.0}, {"threshold": float("nan")}, {"temperature": 0.0},
                                 {"mode": "fast"}, {"verify": "never"}, {"uncertainty": "median"}])
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
