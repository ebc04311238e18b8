"""The v2 demo trainer: a paused-and-resumed run equals an uninterrupted one (weights, optimizer,
eval history), and a state from another recipe is refused. Runs on a tiny fake corpus in the v2
shard format (random log-mels), so it needs neither espeak-ng nor the built corpus."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from specdec_cli.demo.corpus import TEMPLATES, bucket_of, describe, sample_labels
from specdec_cli.demo.train import Recipe, train

TINY = Recipe(size=dict(hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, audio_d=32, audio_layers=1, audio_heads=2,
                        audio_ffn=64, dropout=0.1, text_dropout=0.0),
              steps=7, lr=3e-3, batch=4, warmup=2, eval_every=3)


def _shard(root, name: str, n: int, seed: int) -> None:
    rng = random.Random(seed)
    feats, metas, off = [], [], 0
    for i in range(n):
        frames = rng.randint(30, 90)
        labels = sample_labels(rng)
        template = rng.randrange(len(TEMPLATES))
        chars = rng.randint(4, 40)
        feats.append(np.random.default_rng(seed * 100 + i).standard_normal((frames, 128)).astype(np.float16))
        metas.append({"labels": labels, "template": template, "offset": off, "frames": frames,
                      "bucket": bucket_of(chars), "target": describe(labels, template)})
        off += frames
    np.save(root / f"{name}.npy", np.concatenate(feats))
    (root / f"{name}.json").write_text(json.dumps(metas, ensure_ascii=False), encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    _shard(root, "train-000", 6, 1)
    _shard(root, "train-001", 5, 2)
    _shard(root, "val-000", 6, 3)
    _shard(root, "val_noisy-000", 6, 4)
    return root


def _quiet(_msg: str) -> None:
    pass


def test_paused_and_resumed_run_equals_uninterrupted(corpus, tmp_path):
    full = train("tiny", TINY, tmp_path / "a", corpus, log=_quiet)
    # Pause after 4 steps (mid-epoch: 11 clips make 2 batches of 4 per epoch), then resume twice.
    train("tiny", TINY, tmp_path / "b", corpus, stop_after=4, log=_quiet)
    mid = torch.load(tmp_path / "b" / "state.pt", weights_only=False)
    assert mid["step"] == 4 and mid["epoch"] == 1
    train("tiny", TINY, tmp_path / "b", corpus, stop_after=1, log=_quiet)
    resumed = train("tiny", TINY, tmp_path / "b", corpus, log=_quiet)
    assert resumed["step"] == full["step"] == TINY.steps
    for k, v in full["model"].items():
        assert torch.equal(v, resumed["model"][k]), k
    exp_avg = [s["exp_avg"] for s in full["optimizer"]["state"].values()]
    got = [s["exp_avg"] for s in resumed["optimizer"]["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(exp_avg, got, strict=True))
    assert [h["step"] for h in resumed["history"]] == [3, 6, 7]
    assert resumed["history"] == full["history"]
    assert set(full["history"][-1]["val"]["acc"]) >= {"all"} and "val_noisy" in full["history"][-1]


def test_state_from_another_recipe_is_refused(corpus, tmp_path):
    train("tiny", TINY, tmp_path, corpus, stop_after=1, log=_quiet)
    with pytest.raises(SystemExit, match="another recipe"):
        train("tiny", replace(TINY, lr=1e-3), tmp_path, corpus, log=_quiet)


def test_export_loads_like_a_bundled_model(corpus, tmp_path):
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer
    from specdec_cli.demo.train import export
    from specdec_cli.processor import AudioTextProcessor

    st = train("tiny", TINY, tmp_path / "run", corpus, stop_after=2, log=_quiet)
    export(tmp_path / "run", tmp_path / "model")
    model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(tmp_path / "model")
    proc = AudioTextProcessor.from_pretrained(tmp_path / "model")
    assert proc.tokenizer.get_vocab() == build_qwen_style_tokenizer().get_vocab()
    for k, v in st["model"].items():
        assert torch.equal(v, model.state_dict()[k]), k
