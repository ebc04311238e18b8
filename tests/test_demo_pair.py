"""The bundled demo pair, loaded offline through the same from_pretrained path as Qwen2.5-Omni."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_helpers import measured

from specdec_cli.audio import load_audio
from specdec_cli.decoding import DecodingConfig
from specdec_cli.describe import Describer
from specdec_cli.models import load_pair, presets_file_for
from specdec_cli.phrases import ATTRIBUTES, find_phrases
from specdec_cli.presets import resolve

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
LABELS = [json.loads(line) for line in (SAMPLES / "labels.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def describer():
    os.environ["HF_HUB_OFFLINE"] = "1"
    return Describer(load_pair(None, None))


@pytest.fixture(scope="module")
def clips(describer):
    sr = describer.pair.processor.sampling_rate
    return {row["file"]: load_audio(SAMPLES / row["file"], sr, 30.0) for row in LABELS}


def test_samples_span_every_class():
    for attr, phrases in ATTRIBUTES.items():
        assert {row["labels"][attr] for row in LABELS} == set(phrases), attr


def test_pair_shares_tokenizer_and_edge_is_smaller(describer):
    pair = describer.pair
    n_edge = sum(p.numel() for p in pair.edge.parameters())
    n_cloud = sum(p.numel() for p in pair.cloud.parameters())
    assert n_cloud >= 3 * n_edge
    assert pair.edge.config.audio_token_index == pair.cloud.config.audio_token_index


@pytest.mark.parametrize("preset", ["fluent", "quality"])
def test_every_sample_gets_one_sentence_with_one_phrase_per_attribute(describer, clips, preset):
    values = resolve(preset, presets_file_for(None)).values
    cfg = DecodingConfig(**values)
    for row in LABELS:
        text = describer.run(clips[row["file"]], cfg).text
        assert text.endswith("。") and text.count("。") == 1, text
        found = find_phrases(text)
        assert all(len(found[a]) == 1 for a in ATTRIBUTES), (row["file"], text)


def test_verify_always_equals_cloud_only_on_the_samples(describer, clips):
    cfg = DecodingConfig(k=6, verify="always", max_new_tokens=40)
    for row in LABELS:
        spec = describer.run(clips[row["file"]], cfg).result
        cloud = describer.run(clips[row["file"]], cfg.with_(mode="cloud")).result
        assert spec.tokens == cloud.tokens
        assert spec.stats.cloud_calls < cloud.stats.cloud_calls  # the same answer for fewer cloud passes


def test_demo_presets_are_calibrated_in_the_model_folder():
    path = presets_file_for(None)
    assert path is not None and path.parent.name == "edge"
    fluent, quality = resolve("fluent", path), resolve("quality", path)
    assert fluent.source == quality.source and fluent.source.endswith("edge/specdec_presets.toml")
    # written by `specdec calibrate` (make presets)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Presets written by `specdec calibrate`")
    # fluent is the cheapest setting within 3 points, quality within 1: on the half they were chosen
    # on, fluent costs no more cloud calls per token (k and threshold are picked per preset, so
    # neither need be ordered on its own)
    on_calibration = measured(text)
    assert on_calibration["fluent/calibration"][1] <= on_calibration["quality/calibration"][1]

