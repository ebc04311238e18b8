"""Cloud-only `/v1/generate` continuously batched, through a real `specdec serve` process.

Oracles: the same server run one generation at a time (`--max-generate-batch 1`: HF generate per
request, the path before batching) and the in-process cloud-only run of the same pair. Concurrent
clients (threads, each with its own client) on held-out demo clips must get the same tokens and
counters from the batching server as from both. A step that fails in the batch fails only the
request that fails alone too (the others are run again alone and answered)."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from cli_helpers import heldout_clips
from remote_helpers import Server

from specdec_cli.audio import load_audio
from specdec_cli.decoding import DecodingConfig
from specdec_cli.describe import Describer
from specdec_cli.models import load_pair

CLOUD = DecodingConfig(mode="cloud")
CLIENTS = 6


@pytest.fixture(scope="module")
def heldout(tmp_path_factory) -> list[np.ndarray]:
    return [load_audio(p, 16000, 30.0) for p in heldout_clips(tmp_path_factory, CLIENTS, start=700)]


def fingerprint(desc) -> tuple:
    s = desc.result.stats
    return tuple(desc.result.tokens), (s.tokens, s.cloud_calls, s.cloud_tokens, s.cloud_prefill_tokens,
                                       s.cloud_work_forwards)


def concurrently(url: str, clips: list[np.ndarray], cfgs: list[DecodingConfig]) -> list:
    """Each clip from its own client thread, all released at once; one result (or exception) each."""
    describers = [Describer(load_pair(None, url)) for _ in clips]
    start = threading.Barrier(len(clips))

    def one(i: int):
        start.wait(timeout=60)
        try:
            return describers[i].run(clips[i], cfgs[i])
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            return exc
    try:
        with ThreadPoolExecutor(len(clips)) as pool:
            return list(pool.map(one, range(len(clips))))
    finally:
        for d in describers:
            d.pair.remote.close()


def test_concurrent_cloud_only_clients_get_what_one_at_a_time_and_in_process_give(heldout, tmp_path):
    local = Describer(load_pair())
    here = [fingerprint(local.run(audio, CLOUD)) for audio in heldout]
    # Different lengths per row, so rows leave at different steps and others go on.
    cfgs = [CLOUD.with_(max_new_tokens=n) for n in (64, 64, 12, 64, 30, 64)][:len(heldout)]
    short = [fingerprint(local.run(audio, cfg)) for audio, cfg in zip(heldout, cfgs, strict=True)]
    with Server("--max-generate-batch", "1") as alone:
        one_at_a_time = [fingerprint(d) for d in concurrently(alone.url, heldout, [CLOUD] * len(heldout))]
    log = tmp_path / "serve.log"
    with Server("--max-generate-batch", "4", log=log) as batched:
        together = concurrently(batched.url, heldout, [CLOUD] * len(heldout))
        mixed = concurrently(batched.url, heldout, cfgs)
        metrics = httpx.get(batched.url + "/metrics").text
    assert one_at_a_time == here
    assert [fingerprint(d) for d in together] == here
    assert [fingerprint(d) for d in mixed] == short
    # The server did batch: some step ran more than one row.
    ones = float(re.search(r'specdec_generate_batch_size_bucket\{le="1\.0"\} (\S+)', metrics).group(1))
    steps = float(re.search(r"specdec_generate_batch_size_count (\S+)", metrics).group(1))
    assert steps > ones


def test_a_failing_row_fails_only_itself(heldout, tmp_path):
    """One clip's prefill raises, in the batch and alone: that request gets an error, the others
    the tokens they get alone. (The clip is known in the server by its prompt's length.)"""
    prelude = (
        "import os\n"
        "BAD = int(os.environ['SPECDEC_TEST_BAD_PROMPT'])\n"
        "from specdec_cli.decoding import batch_state\n"
        "_join = batch_state.BatchState._prefill\n"
        "def _prefill(self, plan, joins):\n"
        "    if any(len(p[0]) == BAD for p in plan.values()): raise RuntimeError('injected')\n"
        "    return _join(self, plan, joins)\n"
        "batch_state.BatchState._prefill = _prefill\n"
        "from specdec_cli.decoding import baselines\n"
        "_gen = baselines.generate_baseline\n"
        "def generate_baseline(model, inputs, *a, **k):\n"
        "    if inputs['input_ids'].shape[1] == BAD: raise RuntimeError('injected')\n"
        "    return _gen(model, inputs, *a, **k)\n"
        "baselines.generate_baseline = generate_baseline\n"
    )
    local = Describer(load_pair())
    lengths = [int(local.pair.processor(a)["input_ids"].shape[1]) for a in heldout]
    bad = [n == lengths[2] for n in lengths]
    assert sum(bad) == 1, lengths
    here = [fingerprint(local.run(audio, CLOUD)) for audio in heldout]
    with Server("--max-generate-batch", "4", prelude=prelude, log=tmp_path / "serve.log",
                env={"SPECDEC_TEST_BAD_PROMPT": str(lengths[2])}) as server:
        got = concurrently(server.url, heldout, [CLOUD] * len(heldout))
        logged = server.logged()
    for i, result in enumerate(got):
        if bad[i]:
            assert isinstance(result, Exception), i
        else:
            assert not isinstance(result, Exception), (i, result)
            assert fingerprint(result) == here[i]
    assert "cloud-only generations failed" in logged
