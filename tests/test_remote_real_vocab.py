"""The remote cloud at the real Qwen2.5-Omni widths: the real tokenizer (151,665 tokens) with a
random edge of 151,936 rows here and a random cloud of 152,064 rows, laid out as a full Omni
checkpoint, hosted by a real `specdec serve` process. Oracle: the same pair in process."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import speech_clip
from remote_helpers import Server

from specdec_cli.decoding import DecodingConfig
from specdec_cli.describe import Describer
from specdec_cli.errors import ModelError
from specdec_cli.models import load_pair
from specdec_cli.qwen_vocab import CLOUD_VOCAB


@pytest.fixture(scope="module")
def served(real_pair):
    with Server("--cloud", real_pair.cloud_id) as s:
        yield s


def audio(seed: int) -> np.ndarray:
    """1 s of a bundled sample's speech: the server refuses a clip without speech (noise was used
    before its speech check; the random models do not care what they hear)."""
    return speech_clip(seed, 1.0)


def test_the_server_reports_the_real_width_and_the_pair_matches(served, real_pair):
    remote = load_pair(real_pair.edge_id, served.url)
    assert remote.remote.info["vocab"] == CLOUD_VOCAB
    assert remote.masks.vocab_size == real_pair.masks.vocab_size == CLOUD_VOCAB
    with pytest.raises(ModelError, match="another tokenizer"):
        load_pair(None, served.url)  # the demo edge's 444-token vocabulary against Qwen's


@pytest.mark.parametrize("cfg", [
    DecodingConfig(k=4, verify="always", max_new_tokens=12, stop_min_chars=0),
    DecodingConfig(k=4, verify="always", max_new_tokens=12, stop_min_chars=0, constraints=False),
    DecodingConfig(k=3, verify="always", max_new_tokens=10, stop_min_chars=0, sample=True, seed=5),
], ids=["greedy", "plain", "sample"])
def test_through_the_server_at_152k_equals_in_process(served, real_pair, cfg):
    local = Describer(real_pair)
    remote = Describer(load_pair(real_pair.edge_id, served.url))
    for seed in range(2):
        here, there = local.run(audio(seed), cfg), remote.run(audio(seed), cfg)
        assert there.result.tokens == here.result.tokens
        rejections = sum(e.correction_kind == "recovered" for e in there.result.events)
        if cfg.sample and rejections:
            # A sampled rejection brings the target's distribution at that position back (its
            # non-zero entries): at 152k rows that is what dominates the downlink.
            assert there.link.downlink_bytes > 1000 * rejections
    remote.pair.remote.close()
