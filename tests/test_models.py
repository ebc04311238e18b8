"""Loading: full Qwen2.5-Omni checkpoints as their thinker, tokenizer mismatch refused."""

from __future__ import annotations

import pytest
import torch
from conftest import clip, make_thinker
from safetensors.torch import save_file
from transformers import Qwen2_5OmniConfig

from specdec_cli.demo.tokenizer import build_tokenizer
from specdec_cli.errors import ModelError
from specdec_cli.models import load_model, load_pair


def test_full_omni_checkpoint_loads_as_its_thinker(tmp_path, tokenizer, processor, edge):
    """Qwen/Qwen2.5-Omni-3B/7B store the thinker under `thinker.` next to the talker; load_model
    must map that prefix away and get the same weights (same logits)."""
    config = Qwen2_5OmniConfig(thinker_config=edge.config.to_dict())
    config.save_pretrained(tmp_path)
    state = {f"thinker.{k}": v.contiguous() for k, v in edge.state_dict().items()}
    state["talker.dummy"] = torch.zeros(1)  # weights of other parts must be ignored
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = load_model(str(tmp_path))
    inputs = processor(clip(3))
    with torch.inference_mode():
        a = edge(**inputs).logits
        b = loaded(**inputs).logits
    assert torch.allclose(a, b, atol=1e-5)


def test_pair_with_different_tokenizers_is_refused_before_decoding(tmp_path, tokenizer, processor):
    other = build_tokenizer(["完全不同的词表"], phrases=())
    for name, tok in (("edge", tokenizer), ("cloud", other)):
        model = make_thinker(tok, 1, hidden=32, layers=1, heads=2, kv_heads=1, audio_d=32)
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
        processor.feature_extractor.save_pretrained(tmp_path / name)
    with pytest.raises(ModelError, match="different tokenizers"):
        load_pair(str(tmp_path / "edge"), str(tmp_path / "cloud"))


def test_missing_model_names_the_path(tmp_path):
    with pytest.raises(ModelError, match="nowhere"):
        load_model(str(tmp_path / "nowhere"))
