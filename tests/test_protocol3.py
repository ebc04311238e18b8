"""Protocol 3 (issue 43, item 1): a verification names the prefix it assumes the session holds
(`held`, and `prefix`: the digest of its answer tokens, then `pending` starting with the token the
last verdict gave); a real `specdec serve` refuses one whose assumption is not the session's
verified prefix as out of sync, before any forward and with the session unchanged.

Oracles: the in-process run of the clip (the cloud's greedy answer: every verdict on a draft that
is that answer with one token changed is known in advance), and the server's own counters before
and after a refusal (no token scored, no verification counted)."""

from __future__ import annotations

import httpx
import msgspec
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from remote_helpers import ROOT, Server, verdict, wire_clip
from remote_helpers import post_verify as post

from specdec_cli.audio import load_audio
from specdec_cli.decoding import DecodingConfig
from specdec_cli.describe import Describer
from specdec_cli.models import load_pair
from specdec_cli.remote import answers, wire
from specdec_cli.remote.client import config_dict
from specdec_cli.remote.exchange import Unusable

SAMPLE = sorted((ROOT / "samples").glob("*.wav"))[0]
K = 3


@pytest.fixture(scope="module")
def server():
    with Server("--max-batch", "1") as s:
        yield s


@pytest.fixture(scope="module")
def clip():
    """(the wire clip, the prompt's length, the in-process cloud-only answer's tokens)."""
    message, truth = wire_clip(SAMPLE, 3 * (K + 1) + 2)  # room for the verdicts below
    return message, len(message.prompt_ids), truth


def counters(server: Server) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_wrong_assumed_prefix_is_refused_unchanged_and_the_right_one_goes_on(server, clip):
    message, prompt_len, truth = clip
    # Opened with the clip, the first K tokens of the cloud's answer drafted: all kept, the bonus back.
    first = verdict(post(server.url, wire.VerifyRequest(list(truth[:K]), clip=message,
                                                        config=config_dict(DecodingConfig()))))
    assert (first["accepted"], first["token"], first["held"]) == (K, truth[K], prompt_len + K)
    sid, held = first["session"], first["held"]
    right = wire.prefix_digest(list(truth[:K]))
    draft = list(truth[K + 1:2 * K + 1])
    wrong_tokens = list(truth[:K])
    wrong_tokens[1] = (wrong_tokens[1] + 7) % 1000
    before = counters(server)
    refusals = {
        # assumes the session holds more (the block a pipelined client sent before this verdict)
        "position": wire.VerifyRequest(draft, session=sid, held=held + 2, pending=[truth[K]],
                                       prefix=wire.prefix_digest(list(truth[:K + 2]))),
        # the right length, other tokens
        "digest": wire.VerifyRequest(draft, session=sid, held=held, pending=[truth[K]],
                                     prefix=wire.prefix_digest(wrong_tokens)),
        # the right prefix, but not the token the verdict gave after it (a wrong guess of the bonus)
        "owed token": wire.VerifyRequest(draft, session=sid, held=held, pending=[(truth[K] + 1) % 1000],
                                         prefix=right),
    }
    for why, request in refusals.items():
        response = post(server.url, request)
        assert response.status_code == 409, (why, response.text)
        body = response.json()
        assert body["code"] == "out_of_sync" and "unchanged" in body["error"], (why, body)
    after = counters(server)
    # refused before any forward: nothing scored, nothing verified; each refusal counted
    assert after["specdec_tokens_scored_total"] == before["specdec_tokens_scored_total"]
    assert after["specdec_verifications_total"] == before["specdec_verifications_total"]
    assert after["specdec_verifications_out_of_sync_total"] == before["specdec_verifications_out_of_sync_total"] + 3

    # The session is as the first verdict left it: the right assumption goes on, and every verdict
    # from here on is the in-process answer's (a draft wrong at position j keeps j tokens and gets
    # the cloud's token there back).
    tokens, held, owed = list(truth[:K]), held, truth[K]
    for wrong_at in (K, 1, 0, K):  # K: nothing changed, the bonus comes back
        pos = len(tokens) + 1  # the draft follows the owed token
        draft = list(truth[pos:pos + K])
        if wrong_at < K:
            draft[wrong_at] = (draft[wrong_at] + 7) % 1000
        got = verdict(post(server.url, wire.VerifyRequest(draft, session=sid, held=held, pending=[owed],
                                                          prefix=wire.prefix_digest(tokens))))
        assert got["accepted"] == wrong_at and got["token"] == truth[pos + wrong_at], (wrong_at, got)
        tokens += [owed] + draft[:wrong_at]
        held, owed = got["held"], got["token"]
        assert held == prompt_len + len(tokens)
    assert tokens + [owed] == list(truth[:len(tokens) + 1])


def test_old_and_new_refuse_each_other_in_one_line(server, monkeypatch):
    """The versions meet at /health, as before: a protocol-2 client reading this server's, and this
    client reading a protocol-2 server's, each refuse with the same one line."""
    body = httpx.get(f"{server.url}/health", timeout=30).content
    assert answers.health(body)["protocol"] == wire.PROTOCOL == 3
    old = msgspec.json.encode({**msgspec.json.decode(body), "protocol": 2})
    with pytest.raises(Unusable, match="^it speaks protocol 2, this specdec speaks 3$"):
        answers.health(old)
    monkeypatch.setattr(wire, "PROTOCOL", 2)
    with pytest.raises(Unusable, match="^it speaks protocol 3, this specdec speaks 2$"):
        answers.health(body)


def test_the_prefix_digest_is_of_the_tokens_in_order():
    assert wire.prefix_digest([]) == wire.prefix_digest([]) and len(wire.prefix_digest([1, 2])) == 16
    assert wire.prefix_digest([1, 2]) != wire.prefix_digest([2, 1])
    assert wire.prefix_digest([1, 2]) != wire.prefix_digest([1, 2, 0])
    assert wire.prefix_digest(np.array([5, 6]).tolist()) == wire.prefix_digest([5, 6])


def test_a_clip_counts_its_verifications_refusals_and_discarded_forwards(server, clip):
    """Issue 43, item 4. Oracles: the in-process run of each sample (one verification per
    escalation, nothing refused, every verdict used) and a request built wrong by hand (one sent,
    one refused)."""
    from specdec_cli.remote.client import LinkStats, SessionLost

    local, remote = Describer(load_pair()), Describer(load_pair(None, server.url))
    try:
        cfg = DecodingConfig().with_(verify="always", k=K)
        for path in sorted((ROOT / "samples").glob("*.wav"))[:3]:
            audio = load_audio(path, 16000, 30.0)
            here, there = local.run(audio, cfg), remote.run(audio, cfg)
            assert there.result.tokens == here.result.tokens
            record = there.link.as_record()
            assert (record["verifications"], record["out_of_sync"], record["discarded_forwards"]) == \
                (here.result.stats.escalations, 0, 0), path.name
        # a verification that assumes a prefix the session does not hold: sent, refused, counted
        message, prompt_len, truth = clip
        first = verdict(post(server.url, wire.VerifyRequest(list(truth[:K]), clip=message,
                                                            config=config_dict(DecodingConfig()))))
        link = LinkStats()
        wrong = wire.VerifyRequest([truth[K + 1]], session=first["session"], held=first["held"] + 1,
                                   pending=[truth[K]], prefix=wire.prefix_digest(list(truth[:K + 1])))
        with pytest.raises(SessionLost, match="unchanged"):
            remote.pair.remote.call("POST", "/v1/verify", wrong, wire.VerifyResponse, link)
        assert (link.verifications, link.out_of_sync, link.round_trips) == (1, 1, 1)
    finally:
        remote.pair.remote.close()
