"""Qwen2.5-Omni thinker configs for small models built from scratch (the demo pair and the tests).

Facts from the field notes (transformers 5.23): the text config takes `rope_parameters` with an
`mrope_section` summing to head_dim / 2; the thinker needs vision start/end ids even for audio-only
input; the audio encoder's `output_dim` must equal the text hidden size; a depth-1 vision tower
keeps the unused vision part small.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase, Qwen2_5OmniThinkerConfig


def _mrope_section(head_dim: int) -> list[int]:
    half = head_dim // 2
    a = half // 4
    b = (half - a) // 2
    return [a, b, half - a - b]


def thinker_config(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int | None = None,
    audio_d: int = 64,
    audio_layers: int = 1,
    audio_heads: int = 4,
    audio_ffn: int | None = None,
    dropout: float = 0.0,
    text_dropout: float | None = None,
) -> Qwen2_5OmniThinkerConfig:
    """A thinker config sized by the arguments, with token ids taken from `tokenizer`. `dropout` is
    the audio encoder's and, unless `text_dropout` is given, the text attention's (text attention
    dropout forces a slower attention path: ~2.6x dearer training steps on these CPUs)."""
    ids = tokenizer.convert_tokens_to_ids
    head_dim = hidden // heads
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": ffn or 4 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": _mrope_section(head_dim)},
        "attention_dropout": dropout if text_dropout is None else text_dropout,
        "tie_word_embeddings": True,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    audio = {
        "num_mel_bins": 128,
        "encoder_layers": audio_layers,
        "encoder_attention_heads": audio_heads,
        "encoder_ffn_dim": audio_ffn or 4 * audio_d,
        "d_model": audio_d,
        "output_dim": hidden,
        "max_source_positions": 1500,
        "n_window": 100,
        "dropout": dropout,
    }
    vision = {"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "intermediate_size": 32,
              "out_hidden_size": hidden, "fullatt_block_indexes": [0]}
    return Qwen2_5OmniThinkerConfig(
        text_config=text,
        audio_config=audio,
        vision_config=vision,
        audio_token_index=ids("<|AUDIO|>"),
        image_token_index=ids("<|IMAGE|>"),
        video_token_index=ids("<|VIDEO|>"),
        audio_start_token_id=ids("<|audio_bos|>"),
        audio_end_token_id=ids("<|audio_eos|>"),
        vision_start_token_id=ids("<|vision_bos|>"),
        vision_end_token_id=ids("<|vision_eos|>"),
        user_token_id=ids("<|im_start|>"),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
