"""A character-level tokenizer carrying the Qwen2.5-Omni special tokens.

Built with the `tokenizers` library (WordLevel over single characters, `Fuse` decoder) and wrapped
in `PreTrainedTokenizerFast`, so it saves and loads like any Hugging Face tokenizer. Each canonical
phrase is one token (an added token, matched before the character split): that makes every
attribute a single decision for the demo models (field notes: shared multi-token prefixes confused
the small edge).
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from ..phrases import ALL_PHRASES
from ..prompt import CHAT_TEMPLATE, INSTRUCTION, SYSTEM

# Name on the tokenizer -> token text, as Qwen2.5-Omni's tokenizer registers them.
OMNI_SPECIAL = {
    "audio_token": "<|AUDIO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}
PAD, IM_START, IM_END, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>"
SPECIALS = [PAD, IM_START, IM_END, UNK, *OMNI_SPECIAL.values()]

BASE_CHARS = string.ascii_letters + string.digits + " .,:;!?'\"-()\n" + "，。、：；！？（）“”"


def build_tokenizer(texts: Iterable[str] = (), phrases: Iterable[str] = ALL_PHRASES) -> PreTrainedTokenizerFast:
    """A tokenizer whose vocabulary is the specials, `phrases` (one token each), and every character
    of `texts`, the prompt and a base set of ASCII and CJK punctuation. Deterministic: the same
    inputs give the same ids."""
    phrases = list(dict.fromkeys(phrases))
    chars = set(BASE_CHARS) | set(SYSTEM) | set(INSTRUCTION)
    for t in texts:
        chars |= set(t)
    vocab: dict[str, int] = {}
    for tok in [*SPECIALS, *phrases, *sorted(chars)]:
        vocab.setdefault(tok, len(vocab))

    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token=UNK,
        pad_token=PAD,
        eos_token=IM_END,
        extra_special_tokens=OMNI_SPECIAL,
        model_input_names=["input_ids", "attention_mask"],
    )
    # Specials are atomic (never split into characters) and skipped by skip_special_tokens.
    tok.add_special_tokens({"additional_special_tokens": [IM_START, *OMNI_SPECIAL.values()]})
    # Phrases: matched whole before the per-character split, decoded as their text.
    tok.add_tokens(phrases)
    tok.chat_template = CHAT_TEMPLATE
    return tok
