"""`specdec serve` batching the verifications of concurrent sessions into one forward.

Oracles: the same requests verified one at a time by a server started with --max-batch 1 (the
one-request path that tests/test_remote.py checks against the in-process run), the cloud's own
greedy output (a draft that is the cloud's continuation with token j changed must keep exactly j
tokens and get the cloud's token back), and the in-process run of whole clips. Batching must have
happened: the server's specdec_verify_batch_size histogram shows batches of more than one."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import numpy as np
import pytest
from remote_helpers import ROOT, Server

from specdec_cli.audio import load_audio
from specdec_cli.decoding import DecodingConfig
from specdec_cli.describe import Describer
from specdec_cli.models import load_pair
from specdec_cli.presets import resolve
from specdec_cli.remote import wire
from specdec_cli.remote.client import config_dict

SAMPLES = sorted((ROOT / "samples").glob("*.wav"))
K = 4


@pytest.fixture(scope="module")
def batched():
    # A wide window: on a loaded machine concurrent requests still meet in one batch.
    with Server("--batch-window-ms", "60", "--max-batch", "8") as s:
        yield s


@pytest.fixture(scope="module")
def single():
    with Server("--max-batch", "1") as s:
        yield s


@pytest.fixture(scope="module")
def local():
    return Describer(load_pair())


def audio_of(path: Path) -> np.ndarray:
    return load_audio(path, 16000, 30.0)


def batch_sizes(server: Server) -> tuple[float, float]:
    """(verifications in batches, batches) from the server's histogram."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {s.name: s.value for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
              for s in f.samples}
    return values["specdec_verify_batch_size_sum"], values["specdec_verify_batch_size_count"]


class Session:
    """One clip's session driven by hand: drafts are the cloud's own greedy continuation with the
    token at a chosen position changed, so each verdict's expected outcome is known."""

    def __init__(self, local: Describer, path: Path, start: int, cfg: DecodingConfig) -> None:
        audio = audio_of(path)
        inputs = local.pair.processor(audio)
        self.prompt = inputs["input_ids"][0].tolist()
        data, codec = wire.encode_audio(audio, 16000)
        self.clip = wire.Clip(data, codec, 16000, self.prompt)
        self.cfg = cfg
        self.truth = local.run(audio, DecodingConfig(mode="cloud")).result.tokens  # the cloud's greedy answer
        self.vocab = local.pair.cloud.get_output_embeddings().weight.shape[0]
        self.pos, self.pending, self.held = start, list(self.truth[:start]), 0
        self.ids: dict[str, str | None] = {}  # server url -> session id
        self.done = False

    def request(self, url: str, wrong_at: int, rng: np.random.Generator | None) -> wire.VerifyRequest:
        draft = list(self.truth[self.pos:self.pos + K])
        if wrong_at < len(draft):
            draft[wrong_at] = (draft[wrong_at] + 7) % self.vocab
        sampling = None
        if rng is not None:
            sampling = wire.Sampling(rng.uniform(0.05, 1.0, len(draft)).tolist(), rng.uniform(0, 1, len(draft)).tolist(),
                                     float(rng.uniform()))
        sid = self.ids.get(url)
        if sid is None:
            return wire.VerifyRequest(draft, clip=self.clip, config=config_dict(self.cfg), pending=self.pending,
                                      sampling=sampling)
        return wire.VerifyRequest(draft, session=sid, held=self.held, pending=self.pending, sampling=sampling)

    def opened(self, url: str, answer: dict) -> None:
        self.ids[url] = answer["session"]

    def advance(self, answer: dict) -> None:
        """Both servers answered alike: move on by the verdict. A sampled rejection leaves the
        token to the client (its residual draw); any token will do here, the cloud's is taken."""
        token = answer["token"] if answer["token"] >= 0 else self.truth[self.pos + answer["accepted"]]
        self.pos += answer["accepted"] + 1
        self.held = answer["held"]
        self.pending = [token]
        self.done = answer["ended"] or self.pos + K >= len(self.truth)


def post(client: httpx.Client, url: str, request: wire.VerifyRequest) -> dict:
    response = client.post(f"{url}/v1/verify", content=wire.encode(request),
                           headers={"Content-Type": wire.MSGPACK})
    assert response.status_code == 200, response.text
    answer = msgspec.msgpack.decode(response.content)
    if answer.get("target_row") is not None:
        answer["target_row"] = wire.dense_row(wire.SparseRow(**answer["target_row"]))
    return answer


def send_together(clients: list[httpx.Client], url: str, reqs: dict[int, wire.VerifyRequest]) -> dict[int, dict]:
    """Each request from its own thread, released at once by a barrier."""
    barrier = threading.Barrier(len(reqs))

    def send(i: int) -> dict:
        barrier.wait(timeout=60)
        return post(clients[i], url, reqs[i])
    with ThreadPoolExecutor(len(reqs)) as pool:
        return dict(zip(reqs, pool.map(send, reqs), strict=True))


def drive(local, batched, single, cfg: DecodingConfig, sampled: bool) -> dict[str, int]:
    """Six sessions at different lengths (one joins in round 2, while the others are in flight),
    each round's requests sent at once to the batching server and one after another to the
    one-at-a-time server; every answer compared. Returns how many answers were compared, how many
    greedy verdicts were checked against the cloud's own output, how many were sampled rejections."""
    sessions = [Session(local, path, start, cfg) for path, start in zip(SAMPLES[:6], (0, 3, 1, 6, 2, 4), strict=True)]
    rng = np.random.default_rng(7)
    clients = [httpx.Client(timeout=120) for _ in sessions]
    counts = {"answers": 0, "checked": 0, "recovered": 0}
    try:
        for rnd in range(5):
            live = [i for i, s in enumerate(sessions) if not s.done and (i < 5 or rnd >= 2)]
            if not live:
                break
            wrong = {i: (i + rnd) % (K + 1) for i in live}  # K: nothing changed, the bonus comes back
            seeds = {i: int(rng.integers(1 << 30)) for i in live}
            want = {}
            for i in live:  # the oracle: one at a time
                s = sessions[i]
                req = s.request(single.url, wrong[i], np.random.default_rng(seeds[i]) if sampled else None)
                want[i] = post(clients[0], single.url, req)
                s.opened(single.url, want[i])
            reqs = {i: sessions[i].request(batched.url, wrong[i], np.random.default_rng(seeds[i]) if sampled else None)
                    for i in live}
            got = send_together(clients, batched.url, reqs)
            for i in live:
                s, a, b = sessions[i], got[i], want[i]
                s.opened(batched.url, a)
                for name in ("accepted", "token", "kind", "held", "fed", "prefilled", "forwards", "all_forwards",
                             "ended"):
                    assert a[name] == b[name], (i, rnd, name, a, b)
                if b["target_row"] is None:
                    assert a["target_row"] is None
                else:
                    assert np.abs(a["target_row"] - b["target_row"]).max() < 1e-5
                if not sampled:
                    j = wrong[i]
                    assert a["accepted"] == min(j, K) and a["token"] == s.truth[s.pos + min(j, K)], (i, rnd, a)
                    counts["checked"] += 1
                counts["answers"] += 1
                counts["recovered"] += a["kind"] == "recovered"
                s.advance(a)
        return counts
    finally:
        for c in clients:
            c.close()


def test_concurrent_greedy_verifications_in_one_forward_equal_one_at_a_time(local, batched, single):
    assert {k: httpx.get(f"{batched.url}/health").json()[k] for k in ("batch_window_ms", "max_batch")} == \
           {"batch_window_ms": 60, "max_batch": 8}
    assert {k: httpx.get(f"{single.url}/health").json()[k] for k in ("batch_window_ms", "max_batch")} == \
           {"batch_window_ms": 0, "max_batch": 1}
    before = batch_sizes(batched)
    counts = drive(local, batched, single, DecodingConfig(), sampled=False)
    after = batch_sizes(batched)
    assert counts["checked"] >= 15
    verifications, batches = after[0] - before[0], after[1] - before[1]
    assert verifications > batches  # some forward verified several sessions
    assert batch_sizes(single)[0] == batch_sizes(single)[1]  # the oracle never batched


def test_concurrent_sampled_verifications_in_one_forward_equal_one_at_a_time(local, batched, single):
    before = batch_sizes(batched)
    counts = drive(local, batched, single, DecodingConfig(sample=True, seed=3), sampled=True)
    after = batch_sizes(batched)
    assert counts["answers"] >= 15 and 3 <= counts["recovered"] < counts["answers"]  # rejections and bonuses
    assert after[0] - before[0] > after[1] - before[1]


def preset(name: str) -> DecodingConfig:
    return DecodingConfig().with_(**resolve(name, [ROOT / "specdec_cli/demo/models/edge/specdec_presets.toml"]).values)


def test_concurrent_describers_through_a_batching_server_equal_the_in_process_runs(local, batched):
    """Four describers, each in its own thread with its own edge, all clips, greedy and sampled:
    every output and every cloud counter equal the in-process run."""
    configs = {"quality": preset("quality"), "always": preset("quality").with_(verify="always"),
               "sampled": preset("quality").with_(sample=True, seed=5)}
    jobs = [(path, name) for path in SAMPLES for name in configs]
    want = {(path, name): local.run(audio_of(path), configs[name]) for path, name in jobs}
    before = batch_sizes(batched)

    describers = [Describer(load_pair(None, batched.url)) for _ in range(4)]  # loading is not thread-safe

    def worker(n: int) -> list[tuple]:
        return [((path, name), describers[n].run(audio_of(path), configs[name])) for path, name in jobs[n::4]]
    try:
        with ThreadPoolExecutor(4) as pool:
            results = [r for chunk in pool.map(worker, range(4)) for r in chunk]
    finally:
        for d in describers:
            d.pair.remote.close()
    assert len(results) == len(jobs)
    for job, there in results:
        here = want[job]
        assert there.result.tokens == here.result.tokens, job
        s, r = here.result.stats, there.result.stats
        assert (r.cloud_calls, r.cloud_tokens, r.cloud_prefill_tokens, r.cloud_work_forwards) == \
               (s.cloud_calls, s.cloud_tokens, s.cloud_prefill_tokens, s.cloud_work_forwards), job
    after = batch_sizes(batched)
    assert after[0] - before[0] > after[1] - before[1]  # batches of more than one happened


def test_adopt_and_release_lend_a_sessions_cache_to_a_batch_and_give_it_back(cloud, processor):
    """BatchState.adopt / release against ModelStates that never leave their own: three sessions
    at different lengths lend their caches, two are fed (one rolled back, the other keeping all),
    one is not; given back, every state holds what its twin holds (tokens, counters, cache within
    float rounding) and goes on to the same logits. While lent, a state holds nothing."""
    import torch
    from conftest import clip

    from specdec_cli.decoding.batch_state import BatchState
    from specdec_cli.decoding.state import ModelState

    inputs = {key: processor(clip(seed, seconds)) for key, seed, seconds in (("a", 1, 0.6), ("b", 2, 1.2), ("c", 3, 0.9))}
    lent, twin = {}, {}
    for key, x in inputs.items():
        answer = x["input_ids"][0].tolist() + list(range(30, 30 + 2 + 3 * len(lent)))
        for states in (lent, twin):
            states[key] = ModelState(cloud, key)
            states[key].start(x)
            states[key].advance(answer, keep=1)
    batch = BatchState(cloud, "cloud")
    batch.adopt(lent)
    assert all(not s.started and len(s) == 0 for s in lent.values())  # one owner: the batch
    with pytest.raises(AssertionError):
        batch.adopt({"a": twin["a"]})  # a key already in the batch
    assert [len(batch[k]) for k in "abc"] == [len(twin[k]) for k in "abc"]
    got = batch.advance({"a": [50, 51, 52], "b": [53]}, {"a": 3, "b": 1})
    want = {"a": twin["a"].advance([50, 51, 52], keep=3), "b": twin["b"].advance([53], keep=1)}
    for key in ("a", "b"):
        assert (got[key] - want[key]).abs().max() < 1e-4
    batch.rollback("a", len(batch["a"]) - 2)
    twin["a"].rollback(len(twin["a"]) - 2)
    batch.release(lent)
    assert len(batch) == 0 and batch.cache is None
    for key in "abc":
        mine, theirs = lent[key], twin[key]
        assert mine.ids == theirs.ids and mine.started
        assert (mine.prefill_tokens, mine.forwards, mine.tokens_fed, mine.all_forwards) == \
               (theirs.prefill_tokens, theirs.forwards, theirs.tokens_fed, theirs.all_forwards)
        assert (mine.last_logits is None) == (theirs.last_logits is None)
        for m, t in zip(mine.cache.layers, theirs.cache.layers, strict=True):
            assert m.keys.shape == t.keys.shape and torch.allclose(m.keys, t.keys, atol=1e-4)
            assert torch.allclose(m.values, t.values, atol=1e-4)
        assert (mine.advance([61], keep=1) - theirs.advance([61], keep=1)).abs().max() < 1e-4


def test_a_failed_batch_is_verified_one_request_at_a_time(monkeypatch):
    """The app in process (httpx over ASGI, requests concurrent on one event loop): three sessions
    open in one batch whose forward fails. Each request is then verified alone, from what its
    session held before the batch (issue 25: a request fails only itself): all three answered, with
    the verdicts the same requests get from a batch that works, and their sessions open."""
    import asyncio

    from specdec_cli.models import demo_pair
    from specdec_cli.remote import batching
    from specdec_cli.remote.server import ServeOptions, create_app, load_hosted

    hosted = load_hosted(demo_pair()[1])
    app = create_app(hosted, ServeOptions(batch_window_ms=500, max_batch=3))
    pair = load_pair()
    requests = []
    for path in SAMPLES[:3]:
        audio = audio_of(path)
        data, codec = wire.encode_audio(audio, 16000)
        clip = wire.Clip(data, codec, 16000, pair.processor(audio)["input_ids"][0].tolist())
        requests.append(wire.encode(wire.VerifyRequest([5, 6], clip=clip, config=config_dict(DecodingConfig()))))

    def broken(model, jobs):  # noqa: ANN001, ANN202
        raise RuntimeError("the accelerator fell over")

    async def send_all() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await asyncio.gather(*(http.post("/v1/verify", content=body, headers={"Content-Type": wire.MSGPACK})
                                          for body in requests))
    monkeypatch.setattr(batching, "verify_together", broken)
    alone = asyncio.run(send_all())
    assert [r.status_code for r in alone] == [200] * 3
    assert len(app.state.sessions) == 3
    assert app.state.metrics.registry.get_sample_value("specdec_verify_batch_size_sum") == 3  # one batch of three
    monkeypatch.undo()
    together = asyncio.run(send_all())
    assert [r.status_code for r in together] == [200] * 3 and len(app.state.sessions) == 6
    assert app.state.metrics.registry.get_sample_value("specdec_verify_batch_size_sum") == 6
    for a, b in zip(alone, together, strict=True):
        a, b = msgspec.msgpack.decode(a.content), msgspec.msgpack.decode(b.content)
        assert {k: v for k, v in a.items() if k != "session"} == {k: v for k, v in b.items() if k != "session"}
