"""The client trusts nothing a server sends (issue 25). Against stand-ins on loopback (fake_cloud.py)
that answer what no `specdec serve` does — a verdict accepting more than the draft, a probability
row wider than the vocabulary, a 50 MB session id, a /health that is not JSON, nothing at all, a
byte at a time, an error line full of terminal escapes, Retry-After as an HTTP date — through a
real `specdec` process: exit 1 (2 for bad usage), one line on stderr saying which of three things
happened (could not connect; no answer within N s; an answer specdec cannot use, and what was
wrong), no traceback, and never a description made from a bad answer. In a batch, that clip gets
an error record and the others are described.

Each of these failed before the client checked its answers (what it did then is in each test's
docstring); test_client_answers_fuzz.py throws random answers at the same checks."""

from __future__ import annotations

import email.utils
import json
import os
import re
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import numpy as np
import pytest
from cli_helpers import FAST, run_specdec
from fake_cloud import (
    VOCAB,
    FakeCloud,
    Reply,
    consistent_verdict,
    identity,
    json_reply,
    msgpack_reply,
    remote_cloud,
)

from specdec_cli.errors import InputError, one_line, printable
from specdec_cli.remote import wire
from specdec_cli.remote.client import (
    CloudAnswerError,
    CloudTimeout,
    CloudUnreachable,
    LinkStats,
    RemoteClient,
)
from specdec_cli.remote.exchange import cloud_timeout, retry_after

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "f_mid_mid_loud.wav"
CANNOT_USE = "sent an answer specdec cannot use ("


def serving(verify=None, health=None):
    """An answer function: /health as a specdec serve's (or `health(request)`), verifications by
    `verify(request, VerifyRequest)` (default: a consistent verdict), closes with 204."""
    def answer(request):
        if request.path == "/health":
            return health(request) if health is not None else json_reply(identity())
        if request.method == "DELETE":
            return Reply(204)
        req = request.verify()
        return verify(request, req) if verify is not None else msgpack_reply(consistent_verdict(req))
    return answer


def describe(url: str, *args: str, env: dict[str, str] | None = None, timeout: float = 180):
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        # --on-cloud-failure fail: these tests are of the failure itself (the edge's fallback has
        # its own tests, test_cloud_fallback.py).
        return run_specdec("--threads", "1", "describe", str(SAMPLE), "--cloud", url, *FAST, "--no-live",
                           "--on-cloud-failure", "fail", *args,
                           timeout=timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def one_error_line(done, exit_code: int = 1) -> str:
    assert done.returncode == exit_code, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""  # no description from a bad answer
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr and "unexpected" not in done.stderr
    return done.stderr


# -- verdicts -----------------------------------------------------------------------------------

@pytest.mark.spawns
def test_a_verdict_accepting_more_than_the_draft_fails_the_clip():
    """Before: rc 0, the description '说话人是女声，语速较慢lK' (the fake's token after 20 'accepted'
    tokens of a 10-token draft), acceptance shown as 282%."""
    def verify(_, req):
        return msgpack_reply(consistent_verdict(req, accepted=len(req.draft) + 10, kind="bonus", token=75))
    with FakeCloud(serving(verify)) as fake:
        err = one_error_line(describe(fake.url))
    # the draft's length is the edge's and the presets' (10 with the v2 pair, 6 with v3's): the
    # message must name it and the 10 more the fake claimed
    m = re.search(re.escape(CANNOT_USE) + r"the verdict accepts (\d+) tokens of a (\d+)-token draft\)", err)
    assert m and int(m[2]) >= 1 and int(m[1]) == int(m[2]) + 10, err
    assert err.startswith(f"error: the cloud at {fake.url} ")


@pytest.mark.spawns
def test_a_redirect_whose_body_is_a_verdict_is_not_taken_for_one():
    """Issue 42: a 307 carrying a well-formed verdict was accepted as the verdict (61 round trips,
    `$$$…`, no fallback mark): the client read any status under 400 as an answer. A redirect is
    not followed and its body is never a verdict: the clip fails in one line saying so."""
    def verify(_, req):
        reply = msgpack_reply(consistent_verdict(req))
        return Reply(307, reply.body, {**reply.headers, "location": "http://127.0.0.1:9/v1/verify"})
    with FakeCloud(serving(verify)) as fake:
        err = one_error_line(describe(fake.url))
    assert CANNOT_USE in err and "a 307 answer (a redirect" in err, err


@pytest.mark.spawns
def test_a_401_in_the_middle_of_a_run_is_the_cloud_refusing_the_clip():
    """Issue 42: docs/serve.md counts a 4xx as the cloud refusing (`refused`: the edge finishes the
    clip); a 401 after start-up (a token revoked, a server restarted with other tokens) was a usage
    error instead: exit 2, and a batch recorded an error for every clip. Now it is a cloud failure
    (exit 1 with --on-cloud-failure fail; the edge's description by default, marked refused), while
    a 401 to the start-up /health stays the usage error it is (the control)."""
    def verify(_, req):
        return json_reply({"error": "missing or wrong token: send Authorization: Bearer <token>",
                           "code": "unauthorized"}, 401, {"www-authenticate": "Bearer"})
    with FakeCloud(serving(verify)) as fake:
        err = one_error_line(describe(fake.url))
        assert "answered 401: missing or wrong token" in err, err
        done = run_specdec("--threads", "1", "describe", str(SAMPLE), "--cloud", fake.url, *FAST, "--no-live",
                           "--json", timeout=180)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["fallback"] == "refused", done.stdout

    def health(_):
        return json_reply({"error": "missing or wrong token", "code": "unauthorized"}, 401)
    with FakeCloud(serving(health=health)) as fake:
        assert "set SPECDEC_TOKEN" in one_error_line(describe(fake.url), exit_code=2)


@pytest.mark.spawns
def test_a_probability_row_wider_than_the_vocabulary_is_refused_before_it_is_built():
    """Before: a 60-byte answer claiming a 2^27-wide row: rc 0, '!!!!!!!!!!!!', client peak RSS
    3.5 GB, 76 s (here 2^20 wide, so the test stays cheap on the code before: rc 0 as well)."""
    vocab = identity()["vocab"]

    def verify(_, req):
        row = {"width": 2**20, "index": np.array([0], "<i4").tobytes(), "value": np.array([1.0], "<f4").tobytes()}
        if req.sampling is None:
            return msgpack_reply(consistent_verdict(req))
        return msgpack_reply(consistent_verdict(req, token=-1, target_row=row))
    with FakeCloud(serving(verify)) as fake:
        err = one_error_line(describe(fake.url, "--sample", "--seed", "0"))
    assert CANNOT_USE + f"a probability row {2**20} wide for a vocabulary of {vocab})" in err


@pytest.mark.spawns
def test_a_huge_session_id_is_refused_before_it_is_read():
    """Before: the 50 MB answer read whole (client peak RSS 1.1 GB), then 'unexpected InvalidURL:
    URL too long'. Now the declared length is over the cap: refused without reading the body."""
    def verify(_, req):
        return msgpack_reply(consistent_verdict(req, session="s" * 50_000_000))
    with FakeCloud(serving(verify)) as fake:
        err = one_error_line(describe(fake.url))
    assert CANNOT_USE + "an answer of 50,000,1" in err and "bytes, over the" in err


@pytest.mark.spawns
def test_a_batch_records_the_bad_answer_for_its_clip_and_goes_on(tmp_path):
    """The second clip's session gets a verdict that accepts too much. Before: 3 of 3 described
    (one with garbage text), exit 0."""
    clips = tmp_path / "clips"
    clips.mkdir()
    for i in range(3):
        shutil.copy(SAMPLE, clips / f"{i}.wav")
    opened = []

    def verify(_, req):
        if req.clip is not None:
            opened.append(1)
        if len(opened) == 2:
            return msgpack_reply(consistent_verdict(req, accepted=len(req.draft) + 1, kind="bonus"))
        return msgpack_reply(consistent_verdict(req))
    out = tmp_path / "r.jsonl"
    with FakeCloud(serving(verify)) as fake:
        done = run_specdec("--threads", "1", "batch", str(clips), "--out", str(out), "--cloud", fake.url, *FAST,
                           "--on-cloud-failure", "fail",
                           timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    failed = [r for r in records if r["error"] is not None]
    assert len(records) == 3 and len(failed) == 1
    m = re.search(re.escape(CANNOT_USE) + r"the verdict accepts (\d+) tokens of a (\d+)-token draft\)",
                  failed[0]["error"])
    assert m and int(m[2]) >= 1 and int(m[1]) == int(m[2]) + 1, failed[0]["error"]
    assert failed[0]["description"] is None
    assert all(r["description"] for r in records if r["error"] is None)


# -- /health ------------------------------------------------------------------------------------

@pytest.mark.spawns
@pytest.mark.parametrize(("health", "wrong"), [
    (Reply(200, b"<html>hello</html>", {"content-type": "text/html"}), "its /health is not JSON"),
    (json_reply({"status": "ok"}), "its /health is not a specdec server's: Object missing required field"),
    (json_reply({**identity(), "vocab": "many"}), "Expected `int`, got `str` - at `$.vocab`"),
    (json_reply([1, 2]), "its /health is a JSON list, not an object"),
    (json_reply({**identity(), "protocol": 99}), f"it speaks protocol 99, this specdec speaks {wire.PROTOCOL}"),
])
def test_a_health_that_is_not_a_specdec_servers_is_refused(health, wrong):
    """Before: 'unexpected JSONDecodeError' for the first; for the missing fields, 'the cloud … (None)
    has another tokenizer than edge …', which sends the user after the wrong problem."""
    with FakeCloud(serving(health=lambda _: health)) as fake:
        err = one_error_line(describe(fake.url))
    assert CANNOT_USE in err and wrong in err


# -- deadlines ----------------------------------------------------------------------------------

@pytest.mark.spawns
def test_a_server_that_never_answers_costs_the_deadline_not_300_s():
    """Before: 350 s, then exit 2 'cannot reach the cloud … (timed out); start it …' for a server
    that took the connection (and no --cloud-timeout flag). The flag sets the deadline."""
    with FakeCloud(serving(verify=lambda *_: Reply(hang=True))) as fake:
        err = one_error_line(describe(fake.url, "--cloud-timeout", "2"))
    assert f"error: the cloud at {fake.url} did not answer within 2 s; " in err
    assert "--cloud-timeout" in err and "cannot reach" not in err


@pytest.mark.spawns
def test_a_server_that_drips_a_byte_at_a_time_is_cut_off_at_the_deadline():
    """Before: held indefinitely (still waiting after 420 s: each byte arrives within httpx's per-read
    timeout). The deadline is the environment's here; the subprocess timeout guards the code before."""
    drip = Reply(drip_s=0.05, raw=b"HTTP/1.1 200 OK\r\nX-Slow: ", endless=True)
    with FakeCloud(serving(verify=lambda *_: drip)) as fake:
        err = one_error_line(describe(fake.url, env={"SPECDEC_CLOUD_TIMEOUT": "2"}, timeout=120))
    assert "did not answer within 2 s" in err


@pytest.mark.spawns
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_deadline_that_is_not_a_positive_number_is_bad_usage(value):
    done = run_specdec("describe", str(SAMPLE), "--cloud", "http://127.0.0.1:9", f"--cloud-timeout={value}")
    err = one_error_line(done, exit_code=2)
    assert err == "error: --cloud-timeout must be a positive number of seconds (the default is 60)\n"


def test_the_deadline_comes_from_the_flag_else_the_environment_else_60(monkeypatch):
    monkeypatch.delenv("SPECDEC_CLOUD_TIMEOUT", raising=False)
    assert cloud_timeout() == 60.0 and cloud_timeout(2.5) == 2.5
    monkeypatch.setenv("SPECDEC_CLOUD_TIMEOUT", "7")
    assert cloud_timeout() == 7.0 and cloud_timeout(3.0) == 3.0
    monkeypatch.setenv("SPECDEC_CLOUD_TIMEOUT", "soon")
    with pytest.raises(InputError) as bad:
        cloud_timeout()
    assert bad.value.message == "SPECDEC_CLOUD_TIMEOUT must be a positive number of seconds (the default is 60)"


def test_each_failure_says_which_of_three_things_happened():
    """In process, quickly: nothing listening (could not connect, exit 2); a hang (no answer within
    N s); a body with no length that never ends (an answer over the cap, read no further)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CloudUnreachable) as down:
        RemoteClient(f"http://127.0.0.1:{port}", retry_s=0, timeout_s=5).health()
    assert down.value.exit_code == 2 and down.value.message.startswith(f"cannot reach the cloud at http://127.0.0.1:{port} (")

    endless = b"HTTP/1.1 200 OK\r\ncontent-type: application/msgpack\r\nconnection: close\r\n\r\n" + b"\x00" * 20_000_000
    replies = {"/hang": Reply(hang=True), "/endless": Reply(raw=endless)}
    with FakeCloud(lambda r: replies[r.path]) as fake:
        client = RemoteClient(fake.url, retry_s=0, timeout_s=1)
        link = LinkStats()
        with pytest.raises(CloudTimeout) as hung:
            client.call("POST", "/hang", wire.VerifyRequest([1]), wire.VerifyResponse, link)
        assert hung.value.message.startswith(f"the cloud at {fake.url} did not answer within 1 s; ")
        client = RemoteClient(fake.url, retry_s=0, timeout_s=30)
        with pytest.raises(CloudAnswerError) as big:
            client.call("POST", "/endless", wire.VerifyRequest([1]), wire.VerifyResponse, link)
        assert CANNOT_USE + "an answer over the 65,536 bytes it can be)" in big.value.message
        # what came down before the read stopped: the cap and at most one more network read
        assert link.downlink_bytes < 65_536 + 2 * 65_536 + 200
        client.close()


# -- Retry-After --------------------------------------------------------------------------------

def _http_date(seconds_from_now: float) -> str:
    return email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=seconds_from_now), usegmt=True)


def test_retry_after_is_read_in_both_forms_and_bounded():
    assert retry_after(None) == 1.0 and retry_after("") == 1.0 and retry_after("soon") == 1.0
    assert retry_after("0") == 0.0 and retry_after("2") == 2.0 and retry_after("3600") == 5.0
    assert retry_after("-3") == 0.0 and retry_after("nan") == 1.0 and retry_after("inf") == 1.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # RFC 9110's example: in the past
    assert 1.0 < retry_after(_http_date(3)) <= 3.0
    assert retry_after(_http_date(86400)) == 5.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 -0000") == 0.0  # no zone: taken as UTC


@pytest.mark.spawns
def test_a_full_server_giving_retry_after_as_a_date_is_waited_for_then_reported():
    """Before: 'unexpected ValueError: could not convert string to float: …GMT'."""
    full = json_reply({"error": "all 1 sessions are busy", "code": "full"}, status=503,
                      headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})
    with FakeCloud(serving(verify=lambda *_: full)) as fake:
        err = one_error_line(describe(fake.url, env={"SPECDEC_CLOUD_RETRY_S": "1"}))
    assert err == (f"error: the cloud at {fake.url} stayed full for 1 s (503: all 1 sessions are busy); retry later, "
                   "or start it with a larger --max-sessions\n")


def test_a_date_retry_after_is_honoured_between_attempts():
    seen = []

    def answer(request):
        seen.append(time.monotonic())
        if len(seen) == 1:
            return json_reply({"error": "busy", "code": "full"}, status=503, headers={"retry-after": _http_date(2)})
        return Reply(200, b"\xc0", {"content-type": wire.MSGPACK})  # nil: what a DELETE-like call ignores
    with FakeCloud(answer) as fake:
        client = RemoteClient(fake.url, retry_s=10, timeout_s=5)
        client.call("POST", "/x", wire.VerifyRequest([1]), None, LinkStats())
        client.close()
    assert len(seen) == 2 and seen[1] - seen[0] >= 0.9  # the date was 1-2 s ahead when it was read


# -- text from a server -------------------------------------------------------------------------

@pytest.mark.spawns
def test_a_servers_error_text_reaches_the_terminal_escaped_on_one_line():
    """Before: the line split in two, and ESC [2J (clear screen), ESC ]0;…BEL (set title) written raw."""
    nasty = "line one\nline two \x1b[2J\x1b]0;pwned\x07 \u202eevil"
    with FakeCloud(serving(verify=lambda *_: json_reply({"error": nasty, "code": "bad_request"}, status=400))) as fake:
        err = one_error_line(describe(fake.url))
    assert "\x1b" not in err and "\x07" not in err and "\u202e" not in err
    assert err == (f"error: the cloud at {fake.url} answered 400: line one\\nline two \\x1b[2J\\x1b]0;pwned\\x07 "
                   "\\u202eevil\n")


def test_every_error_line_is_printable_whoever_made_it():
    assert InputError("a\nb\x1b[31m").message == "a\\nb\\x1b[31m"
    assert one_line(ValueError("\x1b]0;title\x07 first\nsecond")) == "ValueError: \\x1b]0;title\\x07 first"
    assert printable("说话人是女声，语速较慢。") == "说话人是女声，语速较慢。"  # text stays text
    assert printable("tab\tcr\rdel\x7fc1\x85ls\u2028") == "tab\\tcr\\rdel\\x7fc1\\x85ls\\u2028"


# -- the client's own view of a verdict, in process -------------------------------------------------

def test_a_consistent_verdict_is_taken_as_sent():
    """The checks refuse nothing a correct server sends: every accepted count, both kinds."""
    for accepted in range(4):
        kind = "bonus" if accepted == 3 else "recovered"

        def verify(_, req, accepted=accepted, kind=kind):
            return msgpack_reply(consistent_verdict(req, accepted=accepted, kind=kind, token=VOCAB - 1,
                                                    held=5 + accepted))
        with FakeCloud(serving(verify)) as fake:
            client, cloud, sequence, proposal, generator = remote_cloud(fake.url, sample=False)
            verdict, fed = cloud.verify(sequence, proposal, None, generator)
            client.close()
        assert (verdict.accepted, verdict.token, verdict.kind, fed) == (accepted, VOCAB - 1, kind, 1 + 3)
        assert cloud.held == 5 + accepted and cloud.prefill_tokens == 4


def test_a_sampled_rejection_draws_from_a_checked_row():
    row = np.zeros(VOCAB, np.float32)
    row[[10, 20]] = 0.5
    sparse = msgspec.structs.asdict(wire.sparse_row(row))

    def verify(_, req):
        return msgpack_reply(consistent_verdict(req, accepted=1, token=-1, held=6, target_row=sparse))
    with FakeCloud(serving(verify)) as fake:
        client, cloud, sequence, proposal, generator = remote_cloud(fake.url, sample=True)
        verdict, _ = cloud.verify(sequence, proposal, None, generator)
        client.close()
    assert verdict.accepted == 1 and verdict.kind == "recovered" and verdict.token in (10, 20)


@pytest.mark.parametrize(("change", "wrong"), [
    ({"accepted": 4, "kind": "bonus"}, "the verdict accepts 4 tokens of a 3-token draft"),
    ({"accepted": -1}, "the verdict accepts -1 tokens of a 3-token draft"),
    ({"accepted": 3}, "a 'recovered' token after 3 of 3 draft tokens accepted"),
    ({"kind": "bonus"}, "a 'bonus' token after 0 of 3 draft tokens accepted"),
    ({"kind": "sideways"}, "Invalid enum value 'sideways' - at `$.kind`"),
    ({"token": VOCAB}, f"token {VOCAB}, outside the vocabulary of {VOCAB} it reported"),
    ({"token": -1}, f"token -1, outside the vocabulary of {VOCAB} it reported"),
    ({"held": 99}, "held = 99 where the request implies 5"),
    ({"fed": 0}, "fed = 0 where the request implies 4"),
    ({"prefilled": 0}, "prefilled = 0 where the request implies 4"),
    ({"forwards": -1}, "-1 forwards of 1 for 8 tokens"),
    ({"all_forwards": 10**6}, "1 forwards of 1000000 for 8 tokens"),
    ({"session": "../../v1/sessions/other"}, "a session id of 23 characters, not the URL-safe id it mints"),
    ({"session": ""}, "a session id of 0 characters, not the URL-safe id it mints"),
    ({"target_row": {"width": VOCAB, "index": b"", "value": b"\x00" * 4 * VOCAB}}, "a probability row where none was due"),
    ({"accepted": "1"}, "Expected `int`, got `str` - at `$.accepted`"),
])
def test_each_inconsistent_verdict_is_refused_saying_what_is_wrong(change, wrong):
    def verify(_, req):
        return msgpack_reply(consistent_verdict(req, **change))
    with FakeCloud(serving(verify)) as fake:
        client, cloud, sequence, proposal, generator = remote_cloud(fake.url, sample=False)
        with pytest.raises(CloudAnswerError) as bad:
            cloud.verify(sequence, proposal, None, generator)
        client.close()
    assert bad.value.message == (f"the cloud at {fake.url} sent an answer specdec cannot use ({wrong}); check that "
                                 "--cloud names a `specdec serve` of specdec 0.3.0")
    assert cloud.held == 0 and cloud.session is None  # nothing of the bad answer was taken


def _row(width: int, index: list[int] | None, values: list[float]) -> dict:
    return {"width": width, "index": b"" if index is None else np.array(index, "<i4").tobytes(),
            "value": np.array(values, "<f4").tobytes()}


@pytest.mark.parametrize(("row", "wrong"), [
    (_row(2**27, [0], [1.0]), f"a probability row {2**27} wide for a vocabulary of {VOCAB}"),
    (_row(VOCAB, None, [1.0]), f"a dense row of 4 bytes for {VOCAB} entries"),
    (_row(VOCAB, [3, 1], [0.5, 0.5]), "a sparse row whose indices are not increasing within the vocabulary"),
    (_row(VOCAB, [1, 1], [0.5, 0.5]), "a sparse row whose indices are not increasing within the vocabulary"),
    (_row(VOCAB, [0, VOCAB], [0.5, 0.5]), "a sparse row whose indices are not increasing within the vocabulary"),
    (_row(VOCAB, [0, 1], [0.5]), "a sparse row of 8 index and 4 value bytes"),
    (_row(VOCAB, [0, 1], [float("nan"), 1.0]), "a probability row with negative or non-finite entries"),
    (_row(VOCAB, [0, 1], [-0.5, 1.5]), "a probability row with negative or non-finite entries"),
    (_row(VOCAB, [0, 1], [0.5, 0.6]), "a probability row summing to 1.1, not 1"),
])
def test_each_bad_probability_row_is_refused(row, wrong):
    def verify(_, req):
        return msgpack_reply(consistent_verdict(req, token=-1, target_row=row))
    with FakeCloud(serving(verify)) as fake:
        client, cloud, sequence, proposal, generator = remote_cloud(fake.url, sample=True)
        with pytest.raises(CloudAnswerError) as bad:
            cloud.verify(sequence, proposal, None, generator)
        client.close()
    assert f"({wrong});" in bad.value.message
