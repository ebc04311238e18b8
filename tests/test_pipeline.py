"""Drafting ahead while a verdict is in flight (decoding/loop.py, issue 28) changes nothing.

Oracle: the blocking loop (the in-process cloud, whose verdict is done before the loop looks).
The pipelined loop must give the same tokens, the same blocks (drafts, verdicts, escalations) and
the same cloud work on every bundled sample and on held-out clips, greedy and with seeded
sampling: in this process with a cloud whose verdicts look in flight (so the loop drafts ahead
every time), and through a real `specdec serve` with the pipelined client. Each test also checks
that drafting ahead really ran, and that both of its outcomes (kept, discarded) happened.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from cli_helpers import heldout_clips
from remote_helpers import ROOT, Server

from specdec_cli.audio import load_audio
from specdec_cli.decoding import DecodingConfig, loop
from specdec_cli.decoding.verifier import LocalCloud
from specdec_cli.describe import Describer
from specdec_cli.models import load_pair
from specdec_cli.presets import resolve

SAMPLES = sorted((ROOT / "samples").glob("*.wav"))


def preset(name: str) -> DecodingConfig:
    return DecodingConfig().with_(**resolve(name, [ROOT / "specdec_cli/demo/models/edge/specdec_presets.toml"]).values)


GREEDY = {"quality": preset("quality"), "fluent": preset("fluent"),
          "always": preset("quality").with_(verify="always")}
SAMPLED = [preset("quality").with_(sample=True, seed=seed, **warp)
           for seed, warp in enumerate([{}, {"top_k": 5}, {"temperature": 0.7, "top_p": 0.9}, {"temperature": 1.3}])]


class InFlight(Future):
    """A verdict computed at submit (so the generator's draws happen where the blocking loop's do)
    that says it is not done until it is read: the loop drafts ahead every time."""

    def done(self) -> bool:
        return False


class ArrivesWhileDrafting(Future):
    """Not done when the loop first looks, done from the next look on: the verdict arrives while
    the edge drafts ahead (the drafting stops there when the verdict is not the one assumed)."""

    looks = 0

    def done(self) -> bool:
        self.looks += 1
        return self.looks > 1


class SlowCloud(LocalCloud):
    future = InFlight

    def submit(self, *args, **kwargs):
        future = self.future()
        future.set_result(self.verify(*args, **kwargs))
        return future


class ArrivingCloud(SlowCloud):
    future = ArrivesWhileDrafting


@pytest.fixture(scope="module")
def pair():
    return load_pair()


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    return heldout_clips(tmp_path_factory, 6, start=500)


@pytest.fixture
def ahead_counts(monkeypatch):
    """How often the loop drafted a block ahead ("drafted": it came back whole), how often one
    was discarded (while drafting, when the verdict arrived and broke its assumption, or at the
    verdict), and how often one was kept (drafted and not discarded at the verdict)."""
    counts = {"drafted": 0, "discarded": 0, "kept": 0}
    draft_ahead, discard = loop.draft_ahead, loop.Ahead.discard

    def counting_draft(*args, **kwargs):
        got = draft_ahead(*args, **kwargs)
        counts["drafted"] += got is not None
        if got is not None:
            counts["kept"] += 1
            got.counted = True
        return got

    def counting_discard(self, *args, **kwargs):
        counts["discarded"] += 1
        counts["kept"] -= getattr(self, "counted", False)
        return discard(self, *args, **kwargs)

    monkeypatch.setattr(loop.AheadPays, "now", lambda self: True)  # draft ahead whatever the timings
    monkeypatch.setattr(loop, "draft_ahead", counting_draft)
    monkeypatch.setattr(loop.Ahead, "discard", counting_discard)
    return counts


def blocks(result) -> list[tuple]:
    return [(e.draft, e.escalated, e.accepted, e.correction, e.correction_kind, e.cloud_tokens,
             e.cloud_prefill_tokens, e.answer) for e in result.events]


def cloud_work(result) -> tuple:
    s = result.stats
    return s.cloud_calls, s.cloud_tokens, s.cloud_prefill_tokens, s.cloud_work_forwards


def decode(pair, audio, cfg, cloud):
    inputs = Describer(pair).inputs(audio, cfg)
    return loop.speculative_decode(pair.edge, cloud, inputs, cfg, pair.masks, pair.eos_ids)


def check_in_process(pair, paths, cfgs, clouds=(SlowCloud, ArrivingCloud)):
    for path in paths:
        audio = load_audio(path, 16000, 30.0)
        for cfg in cfgs:
            blocking = decode(pair, audio, cfg, pair.cloud)
            for slow in clouds:
                pipelined = decode(pair, audio, cfg, slow(pair.cloud))
                assert pipelined.tokens == blocking.tokens, (path.name, cfg, slow)
                assert blocks(pipelined) == blocks(blocking), (path.name, cfg, slow)
                assert cloud_work(pipelined) == cloud_work(blocking), (path.name, cfg, slow)


def test_drafting_ahead_in_process_changes_nothing_greedy_on_every_sample(pair, ahead_counts):
    check_in_process(pair, SAMPLES, GREEDY.values())
    assert ahead_counts["drafted"] > 20 and ahead_counts["discarded"] > 0 and ahead_counts["kept"] > 0


def test_drafting_ahead_in_process_changes_nothing_sampled(pair, ahead_counts):
    check_in_process(pair, SAMPLES[:4], SAMPLED)
    assert ahead_counts["drafted"] > 10 and ahead_counts["discarded"] > 0 and ahead_counts["kept"] > 0


def test_drafting_ahead_in_process_changes_nothing_on_heldout_clips(pair, heldout, ahead_counts):
    check_in_process(pair, heldout, [*GREEDY.values(), SAMPLED[0]])
    assert ahead_counts["drafted"] > 0


@pytest.fixture(scope="module")
def server():
    with Server() as s:
        yield s


@pytest.fixture(scope="module")
def remote(server):
    describer = Describer(load_pair(None, server.url))
    yield describer
    describer.pair.remote.close()


def test_the_pipelined_client_gives_the_blocking_clients_tokens_through_a_server(pair, remote, ahead_counts):
    """Through a real server: pipelined == blocking client == in process, greedy and sampled."""
    local = Describer(pair)
    client = remote.pair.remote
    assert client.pipelined
    for path in SAMPLES:
        audio = load_audio(path, 16000, 30.0)
        for cfg in [*GREEDY.values(), *(SAMPLED if path in SAMPLES[:3] else [])]:
            here = local.run(audio, cfg)
            try:
                client.pipelined = False
                blocking = remote.run(audio, cfg)
            finally:
                client.pipelined = True
            pipelined = remote.run(audio, cfg)
            assert blocking.result.tokens == here.result.tokens, (path.name, cfg)
            assert pipelined.result.tokens == here.result.tokens, (path.name, cfg)
            assert blocks(pipelined.result) == blocks(here.result), (path.name, cfg)
            assert cloud_work(pipelined.result) == cloud_work(here.result), (path.name, cfg)
            assert pipelined.link.round_trips == blocking.link.round_trips == here.result.stats.escalations
    # A verification on loopback takes milliseconds: the edge drafted ahead for most of them.
    assert ahead_counts["drafted"] > 20 and ahead_counts["discarded"] > 0 and ahead_counts["kept"] > 0


def test_an_eager_upload_changes_no_token_and_no_count_but_its_own_forward(pair, remote, server):
    """--upload eager: the session opens with the clip at the start (POST /v1/sessions, prefilled
    in the background). Oracle: the lazy run of the same clip: same tokens, same blocks, the same
    prefill and cloud work but one forward more (the prefill runs alone), one round trip more
    (the open); a clip the edge keeps still closes its session; none is left open."""
    client = remote.pair.remote
    try:
        for path in SAMPLES[:5]:
            audio = load_audio(path, 16000, 30.0)
            for cfg in [GREEDY["quality"], GREEDY["always"], SAMPLED[1], preset("quality").with_(threshold=1e9)]:
                client.upload = "lazy"
                lazy = remote.run(audio, cfg)
                client.upload = "eager"
                eager = remote.run(audio, cfg)
                assert eager.result.tokens == lazy.result.tokens, (path.name, cfg)
                assert blocks(eager.result) == blocks(lazy.result)
                e, z = eager.result.stats, lazy.result.stats
                if z.escalations:
                    assert (e.cloud_calls, e.cloud_tokens, e.cloud_prefill_tokens) == \
                           (z.cloud_calls, z.cloud_tokens, z.cloud_prefill_tokens)
                    assert e.cloud_work_forwards == z.cloud_work_forwards + 1
                assert eager.link.round_trips == lazy.link.round_trips + 1
                assert eager.link.uplink_bytes > 20_000  # the clip went up, escalated or not
    finally:
        client.upload = "lazy"
    client.settle()
    import httpx
    assert httpx.get(f"{server.url}/health").json()["sessions"] == 0


def test_describe_upload_eager_through_the_server_gives_the_lazy_description(server):
    """The CLI flag reaches the client: --upload eager spends one more round trip (the open) and
    describes the clip as --upload lazy does; a bad choice is one line, exit 2."""
    import json
    import os
    import subprocess

    from remote_helpers import SPECDEC

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([SPECDEC, "--threads", "1", *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=ROOT)

    sample = str(SAMPLES[0])
    common = ("describe", sample, "--preset", "quality", "--json", "--cloud", server.url)
    lazy = json.loads(run(*common).stdout)
    eager = json.loads(run(*common, "--upload", "eager").stdout)
    assert eager["description"] == lazy["description"]
    assert eager["round_trips"] == lazy["round_trips"] + 1 == lazy["escalations"] + 1
    bad = run(*common, "--upload", "sometimes")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--upload" in bad.stderr


def test_k_for_the_link_only_where_k_is_free(server):
    """A remote cloud and no --k: verify=always (k changes no token) takes the link's k
    (block_length.best_k of the measured round trip and edge step); a calibrated preset keeps its
    k (its threshold was chosen with it); --k wins; an in-process cloud is left alone."""
    from specdec_cli.decoding.block_length import best_k
    from specdec_cli.models import presets_file_for
    from specdec_cli.pair import Pair
    from specdec_cli.presets import resolve

    shipped_k = resolve("quality", presets_file_for(None)).values["k"]  # the bundled presets file's (v5: 8)
    remote = Pair(cloud=server.url)
    client = remote.models.remote
    try:
        always = remote.resolve("quality", verify="always")
        assert always.cfg.k == always.run.k == best_k(client.rtt_s, client.edge_token_s)
        assert 0 < client.rtt_s < 5 and 0 < client.edge_token_s < 1
        assert remote.settings("quality").k == shipped_k
        assert remote.settings("quality", verify="always", k=5).k == 5
    finally:
        client.close()
    assert Pair().settings("quality", verify="always").k == shipped_k


def test_drafting_ahead_pays_only_while_verdicts_take_longer_than_drafting():
    """The timing policy (tokens never depend on it): the first time yes; then only while the
    last verdict took longer than the last block took to draft."""
    import time

    pays = loop.AheadPays()
    assert pays.now()
    with pays.drafting():
        time.sleep(0.02)
    done = Future()
    pays.watch(done)
    done.set_result(None)  # a verdict back at once: drafting ahead would only hold the loop up
    assert not pays.now()
    slow = Future()
    pays.watch(slow)
    time.sleep(0.05)
    slow.set_result(None)
    assert pays.now()
