"""Issue 35 items 2 and 5 on one `specdec serve` process: sessions named by the client, prefills
counted per session in /metrics, and the access log.

The client names a clip's session (128 random bits) and sends the id in X-Session-Id from the
clip's first request on, so a session-affine router can place the first request where the rest
follow (tests/test_serve_fleet.py has the router). Here, against one real server with two tokens:
the server opens the session under the client's id; the same id from another token is refused and
the first token's session is untouched; an id that is not 22-64 URL-safe characters is refused; a
reopen under the same id by its token is a rebuild (the prefill count for that id goes to 2); and
a described clip's requests all carry its id. The access log has one line per request in uvicorn's
format with the route, status, time and session prefix, and never the token, a whole session id or
anything of the audio; --quiet turns it off."""

from __future__ import annotations

import re
import secrets

import httpx
import msgspec
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from remote_helpers import ROOT, Server
from typer.testing import CliRunner

from specdec_cli.audio import load_audio
from specdec_cli.commands.app import app
from specdec_cli.decoding import DecodingConfig
from specdec_cli.models import load_pair
from specdec_cli.remote import wire

SAMPLES = sorted((ROOT / "samples").glob("*.wav"))
TOKENS = ["alpha-" + "a" * 26, "bravo-" + "b" * 26]
MP = {"Content-Type": wire.MSGPACK}
# uvicorn's access line, then ours: time taken and the session's first 8 characters (or -)
LINE = re.compile(r'^INFO: +(\S+) - "(GET|POST|DELETE) (\S+) HTTP/1\.1" (\d{3}) [A-Za-z ]+ (\d+\.\d) ms session (\S+)$')


def auth(i: int = 0) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[i]}"}


@pytest.fixture(scope="module")
def clip() -> wire.Clip:
    pair = load_pair()
    audio = load_audio(SAMPLES[3], 16000, 30.0)
    data, codec = wire.encode_audio(audio, 16000)
    return wire.Clip(data, codec, 16000, pair.processor(audio)["input_ids"][0].tolist())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ids")
    (folder / "tokens").write_text("\n".join(TOKENS) + "\n")
    with Server("--token-file", str(folder / "tokens"), log=folder / "serve.log", quiet=False) as s:
        yield s


def opening(clip: wire.Clip, session: str | None) -> bytes:
    body = {"draft": [5], "clip": msgspec.structs.asdict(clip), "config": DecodingConfig().as_dict()}
    if session is not None:
        body["session"] = session
    return msgspec.msgpack.encode(body)


def prefills(server: Server, token: int = 0) -> dict[str, float]:
    """The per-session prefill counts `token` sees in /metrics (its own sessions', issue 42)."""
    text = httpx.get(f"{server.url}/metrics", headers=auth(token)).text
    return {s.labels["session"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "specdec_session_prefills_total"}


def test_the_server_opens_the_session_under_the_clients_id(server, clip):
    mine = secrets.token_urlsafe(16)
    with httpx.Client(base_url=server.url, timeout=120) as http:
        r = http.post("/v1/verify", content=opening(clip, mine), headers={**MP, **auth(0), wire.SESSION_HEADER: mine})
        assert r.status_code == 200, r.text
        answer = msgspec.msgpack.decode(r.content)
        assert answer["session"] == mine
        assert prefills(server)[mine[:8]] == 1

        # Another token cannot take it, and is answered as for any unknown session (404, issue 42:
        # the 409 it got before told it the id existed); mine is untouched.
        taken = http.post("/v1/verify", content=opening(clip, mine), headers={**MP, **auth(1)})
        assert taken.status_code == 404 and taken.json()["code"] == "unknown_session"
        follow = {"draft": [5], "session": mine, "held": answer["held"], "pending": [6]}
        r = http.post("/v1/verify", content=msgspec.msgpack.encode(follow), headers={**MP, **auth(0)})
        assert r.status_code == 200, r.text
        assert prefills(server)[mine[:8]] == 1  # no second prefill: the session went on

        # The same token opening it again (a client rebuilding a session it thinks lost): a rebuild.
        r = http.post("/v1/verify", content=opening(clip, mine), headers={**MP, **auth(0)})
        assert r.status_code == 200 and msgspec.msgpack.decode(r.content)["prefilled"] == len(clip.prompt_ids)
        assert prefills(server)[mine[:8]] == 2

        # Without an id the server mints one, as before.
        r = http.post("/v1/verify", content=opening(clip, None), headers={**MP, **auth(0)})
        minted = msgspec.msgpack.decode(r.content)["session"]
        assert r.status_code == 200 and re.fullmatch(wire.SESSION_ID_PATTERN, minted) and minted != mine


def test_a_token_sees_only_its_own_sessions_in_metrics_and_health(server, clip):
    """Issue 42: /metrics gave any token every tenant's session prefixes and prefill counts, and
    /health every tenant's session count and the model's path on the server's disk. Now each
    token sees its own: the other token's /metrics holds no series of my session, its /health
    counts none of my sessions, and the model is named, not located."""
    mine = secrets.token_urlsafe(16)
    r = httpx.post(f"{server.url}/v1/verify", content=opening(clip, mine),
                   headers={**MP, **auth(0), wire.SESSION_HEADER: mine}, timeout=120)
    assert r.status_code == 200, r.text
    try:
        mine_seen = prefills(server)  # token 0's view (the helper's)
        other = httpx.get(f"{server.url}/metrics", headers=auth(1)).text
        others_seen = {s.labels["session"] for f in text_string_to_metric_families(other) for s in f.samples
                       if s.name == "specdec_session_prefills_total"}
        assert mine[:8] in mine_seen and mine[:8] not in others_seen
        health = {i: httpx.get(f"{server.url}/health", headers=auth(i)).json() for i in (0, 1)}
        assert health[0]["sessions"] >= 1 and health[1]["sessions"] == 0, health
        assert "/" not in health[1]["model"] and health[1]["model"] == "cloud", health[1]["model"]
    finally:
        httpx.delete(f"{server.url}/v1/sessions/{mine}", headers=auth(0))


def test_two_tokens_opening_one_id_at_once_never_both_get_it(server):
    """Issue 42: the holder check ran before the clip was prepared and the model turn awaited, so
    two tokens opening the same id at the same moment both got 200 in 8 of 12 trials, the later
    open silently replacing the other's session. Now the id is claimed before any await: in each
    of 12 trials (both opens released together, each a 30 s clip to prepare) at most one token
    gets it, the other a 404, and the winner's session goes on (its next verification answers)."""
    import threading

    pair = load_pair()
    audio = np.resize(np.concatenate([load_audio(p, 16000, 30.0) for p in SAMPLES]), 30 * 16000)
    data, codec = wire.encode_audio(audio.astype(np.float32), 16000)
    long_clip = wire.Clip(data, codec, 16000, pair.processor(audio)["input_ids"][0].tolist())
    both = 0
    for _ in range(12):
        sid = secrets.token_urlsafe(16)
        body = opening(long_clip, sid)
        gate = threading.Barrier(2)
        answers: dict[int, httpx.Response] = {}

        def open_as(token: int, body: bytes = body, gate: threading.Barrier = gate,
                    answers: dict[int, httpx.Response] = answers) -> None:
            gate.wait()
            answers[token] = httpx.post(f"{server.url}/v1/verify", content=body, headers={**MP, **auth(token)},
                                        timeout=120)
        threads = [threading.Thread(target=open_as, args=(t,)) for t in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [t for t, r in answers.items() if r.status_code == 200]
        both += len(won) == 2
        for r in answers.values():
            assert r.status_code in (200, 404, 503), r.text
            if r.status_code == 404:
                assert r.json()["code"] == "unknown_session"
        for t in won:
            got = msgspec.msgpack.decode(answers[t].content)
            follow = {"draft": [5], "session": sid, "held": got["held"], "pending": [6]}
            r = httpx.post(f"{server.url}/v1/verify", content=msgspec.msgpack.encode(follow),
                           headers={**MP, **auth(t)}, timeout=120)
            assert r.status_code == 200 or len(won) == 2, r.text
            httpx.delete(f"{server.url}/v1/sessions/{sid}", headers=auth(t), timeout=30)
    assert both == 0


@pytest.mark.parametrize("bad", ["short", "a" * 21, "a" * 65, "x" * 21 + "/", "ÿ" * 22])
def test_an_id_that_is_not_128_url_safe_bits_is_refused(server, clip, bad):
    r = httpx.post(f"{server.url}/v1/verify", content=opening(clip, bad), headers={**MP, **auth(0)}, timeout=60)
    assert r.status_code == 400 and r.json()["code"] in ("bad_session_id", "bad_request"), r.text
    open_body = msgspec.msgpack.encode({"clip": msgspec.structs.asdict(clip), "config": DecodingConfig().as_dict(),
                                        "session": bad})
    r = httpx.post(f"{server.url}/v1/sessions", content=open_body, headers={**MP, **auth(0)}, timeout=60)
    assert r.status_code == 400, r.text


def test_a_described_clip_carries_one_id_from_its_first_request_and_is_logged(server, monkeypatch):
    """The real client through the CLI: every request of the clip (the first, which carries the
    clip, included) has the same X-Session-Id, the one the server opened the session under; each
    request is one access-log line with no token, no whole id and nothing of the audio."""
    monkeypatch.setenv("SPECDEC_TOKEN", TOKENS[1])
    before = server.log.read_text()
    clip = SAMPLES[0].with_name("f_mid_low_noisy.wav")  # two verifications under quality (v5 pair)
    result = CliRunner().invoke(app, ["describe", str(clip), "--cloud", server.url, "--preset", "quality",
                                      "--json"])
    assert result.exit_code == 0, result.output
    record = msgspec.json.decode(result.stdout.strip().splitlines()[-1])
    assert record["cloud_calls"] >= 2 and record["rebuilds"] == 0
    lines = server.log.read_text()[len(before):].splitlines()
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed, strict=True) if not m]
    verifies = [m for m in parsed if m.group(3) == "/v1/verify"]
    assert len(verifies) == record["cloud_calls"]  # one line per request
    assert {m.group(4) for m in verifies} == {"200"}
    ids = {m.group(6) for m in verifies}
    assert len(ids) == 1 and len(ids.pop()) == 8  # one session, its prefix only
    logged = "\n".join(lines)
    assert TOKENS[1] not in logged and "Bearer" not in logged
    assert all(len(m.group(6)) <= 8 for m in parsed)
    assert (prefix := verifies[0].group(6)) in prefills(server, 1) and prefills(server, 1)[prefix] == 1


def test_a_strangers_long_paths_are_refused_before_routing_and_logged_cut(server):
    """Issue 55, finding 7: an unknown route or a wrong method was answered (404, 405) before the
    token was looked at, and the whole path, up to ~64 KB, went into the access log (five 60 KB
    paths added ~300 KB). Now a request without a valid token is answered 401 whatever its route,
    and a logged path is at most 64 characters and a `…`."""
    before = len(server.log.read_text())
    for _ in range(5):
        r = httpx.get(f"{server.url}/{'x' * 60_000}", timeout=30)
        assert r.status_code == 401 and r.json()["code"] == "unauthorized", r.text
    assert httpx.put(f"{server.url}/health", timeout=30).status_code == 401
    assert httpx.delete(f"{server.url}/v1/verify", timeout=30).status_code == 401
    assert httpx.get(f"{server.url}/{'x' * 60_000}", headers=auth(0), timeout=30).status_code == 404  # (the control)
    added = server.log.read_text()[before:]
    lines = added.splitlines()
    assert len(lines) == 8 and all(len(line) < 200 for line in lines), [len(line) for line in lines]
    assert sum(line.count(" /" + "x" * 63 + "… ") for line in lines) == 6


def test_quiet_logs_no_request(tmp_path):
    with Server(log=tmp_path / "serve.log") as quiet:  # the helper's default: --quiet
        assert httpx.get(f"{quiet.url}/health", timeout=30).status_code == 200
        assert httpx.get(f"{quiet.url}/nowhere", timeout=30).status_code == 404
        code, rest = quiet.stop()
    assert code == 0 and "HTTP/1.1" not in rest


def test_a_bad_log_level_is_one_line():
    result = CliRunner().invoke(app, ["serve", "--log-level", "loud"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: --log-level takes one of critical, error, warning, info, debug, "
                                     "not 'loud'")


def test_a_proxys_500_is_retried_with_the_same_id_and_specdecs_own_is_not():
    """A proxy in front (Ray Serve's) answers 500/502 with its own text when the replica under a
    request died: the client retries it like a dropped connection, every try carrying the clip's
    id in the header and in the body (so the retry lands where the session will be rebuilt). A
    500 that is specdec's one-line JSON error is a server bug: reported at once, as before."""
    from fake_cloud import FakeCloud, Reply, consistent_verdict, json_reply, msgpack_reply, remote_cloud

    from specdec_cli.remote.client import CloudError

    proxy = iter([Reply(500, b"Internal Server Error", {"content-type": "text/plain"}), Reply(502, b"Bad Gateway")])

    def answer(request):
        if request.method == "DELETE":
            return Reply(204)
        return next(proxy, None) or msgpack_reply(consistent_verdict(request.verify()))
    with FakeCloud(answer) as fake:
        client, cloud, sequence, proposal, generator = remote_cloud(fake.url, sample=False)
        client.retry_s = 10.0
        verdict, fed = cloud.verify(sequence, proposal, None, generator)
        client.close()
    assert (verdict.accepted, fed) == (0, 1 + 3)
    verifies = [r for r in fake.requests if r.path == "/v1/verify"]
    assert len(verifies) == 3
    assert re.fullmatch(wire.SESSION_ID_PATTERN, cloud.session_id)
    assert {r.headers[wire.SESSION_HEADER.lower()] for r in verifies} == {cloud.session_id}
    assert all(r.verify().session == cloud.session_id and r.verify().clip is not None for r in verifies)

    bug = json_reply({"error": "internal error (KeyError); the server goes on", "code": "internal"}, 500)
    with FakeCloud(lambda request: bug) as fake:
        client, cloud, sequence, proposal, generator = remote_cloud(fake.url, sample=False)
        client.retry_s = 10.0
        with pytest.raises(CloudError, match="answered 500: internal error"):
            cloud.verify(sequence, proposal, None, generator)
        client.close()
    assert len([r for r in fake.requests if r.path == "/v1/verify"]) == 1
