"""Blocks sent ahead that arrive early are held, not refused (issue 55, finding 5): a client at
depth > 1 sends a session's blocks on different connections, so block i+1 may reach the server
before block i. The server refused it (409 out_of_sync: a round trip and a resend); now it waits,
in no turn, until the session holds the prefix it assumes, and is verified then. It waits no
longer than the chain it assumes can still come true (a verdict that did not keep its whole draft,
a block in turn refused, the session closed: then it is refused or unknown, at once), than
--hold-ahead-ms, and no more than MAX_AHEAD of a session wait (more: refused at once, as before).

Oracles: the in-process cloud-only answer of the clip (greedy: every verdict on a draft of it is
known in advance), and the server's own counters: verdicts, out-of-sync refusals, and the held
verifications by how their wait ended (`specdec_verifications_held`), with the gauge of those
waiting now (`specdec_verifications_ahead`) telling the test that block i+1 is there before it
sends block i. Counts, never times."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from remote_helpers import ROOT, Server, post_verify, verdict, wire_clip

from specdec_cli.decoding import DecodingConfig
from specdec_cli.remote import wire
from specdec_cli.remote.client import config_dict
from specdec_cli.remote.sessions import MAX_AHEAD

SAMPLE = sorted((ROOT / "samples").glob("*.wav"))[0]
K = 3

pytestmark = pytest.mark.spawns


@pytest.fixture(scope="module")
def server():
    # A hold far longer than any verdict here takes, so that only the chain ends a wait.
    with Server("--max-batch", "1", "--hold-ahead-ms", "120000") as s:
        yield s


@pytest.fixture(scope="module")
def clip():
    """(the wire clip, the in-process cloud-only answer's tokens)."""
    return wire_clip(SAMPLE, 3 * (K + 1) + 2)  # room for the blocks below


def metric(server: Server, name: str, **labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=60).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name in (name, name + "_total") and all(s.labels.get(k) == v for k, v in labels.items()))


def counts(server: Server) -> dict[str, float]:
    return {"verified": metric(server, "specdec_verifications"),
            "out_of_sync": metric(server, "specdec_verifications_out_of_sync"),
            **{end: metric(server, "specdec_verifications_held", end=end) for end in ("in_turn", "broke", "late")}}


def grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in before if after[key] != before[key]}


def wait_for(condition, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def post(server: Server, request: wire.VerifyRequest) -> httpx.Response:
    """One verification on a connection of its own."""
    return post_verify(server.url, request, timeout=300)


def opened(server: Server, clip) -> tuple[str, int]:
    """A session opened with the clip and the answer's first K tokens (all kept): (id, held)."""
    message, truth = clip
    first = verdict(post(server, wire.VerifyRequest(list(truth[:K]), clip=message, config=config_dict(DecodingConfig()))))
    assert (first["accepted"], first["token"]) == (K, truth[K])
    return first["session"], first["held"]


def block(truth: list[int], sid: str, held: int, i: int, wrong_at: int | None = None) -> wire.VerifyRequest:
    """Block i (1, 2, …) after the opening one, as a client drafting ahead with perfect drafts sends
    it: every block before it kept whole, its bonus token guessed right. `wrong_at`: that draft
    token changed (its verdict keeps `wrong_at` tokens)."""
    start = i * (K + 1) - 1  # the answer tokens the session holds when block i's turn comes
    draft = list(truth[start + 1:start + 1 + K])
    if wrong_at is not None:
        draft[wrong_at] = (draft[wrong_at] + 7) % 1000
    return wire.VerifyRequest(draft, session=sid, held=held + (i - 1) * (K + 1), pending=[truth[start]],
                              prefix=wire.prefix_digest(list(truth[:start])))


def ahead_now(server: Server, n: int, sent: list[concurrent.futures.Future]) -> None:
    """Wait until `n` verifications wait ahead; none of `sent` may be answered meanwhile."""
    wait_for(lambda: any(f.done() for f in sent) or metric(server, "specdec_verifications_ahead") == n)
    answered = [f.result().text for f in sent if f.done()]
    assert not answered, answered  # (before the fix: refused at once)
    assert metric(server, "specdec_verifications_ahead") == n


def test_a_block_that_arrives_before_the_one_it_follows_waits_and_is_verified(server, clip):
    """Block 2 sent first (and seen waiting), then block 1 on another connection: both verified, in
    order, nothing refused. Before: block 2 was answered 409 out_of_sync at once. Then a duplicate
    of block 2 (behind the session now) is refused at once and runs nothing."""
    _, truth = clip
    sid, held = opened(server, clip)
    before = counts(server)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        second = pool.submit(post, server, block(truth, sid, held, 2))
        ahead_now(server, 1, [second])
        first = verdict(post(server, block(truth, sid, held, 1)))
        later = verdict(second.result())
    assert (first["accepted"], first["token"]) == (K, truth[2 * (K + 1) - 1])
    assert (later["accepted"], later["token"], later["held"]) == (K, truth[3 * (K + 1) - 1], held + 2 * (K + 1))
    assert grew(before, counts(server)) == {"verified": 2, "in_turn": 1}

    again = post(server, block(truth, sid, held, 2))  # the same block again: behind the session
    assert again.status_code == 409 and again.json()["code"] == "out_of_sync", again.text
    assert grew(before, counts(server)) == {"verified": 2, "in_turn": 1, "out_of_sync": 1}
    assert metric(server, "specdec_verifications_ahead") == 0


def test_a_verdict_that_breaks_the_chain_refuses_the_blocks_waiting_at_once(server, clip):
    """Block 2 waits; block 1's draft is wrong at its second token, so its verdict keeps 1 and the
    session never holds what block 2 assumed: block 2 is refused when that verdict lands (counted
    as `broke`), not when the (two-minute) hold runs out."""
    _, truth = clip
    sid, held = opened(server, clip)
    before = counts(server)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        second = pool.submit(post, server, block(truth, sid, held, 2))
        ahead_now(server, 1, [second])
        first = verdict(post(server, block(truth, sid, held, 1, wrong_at=1)))
        refused = second.result()
    assert first["accepted"] == 1
    assert refused.status_code == 409 and refused.json()["code"] == "out_of_sync", refused.text
    assert grew(before, counts(server)) == {"verified": 1, "broke": 1, "out_of_sync": 1}


def test_at_most_max_ahead_wait_and_closing_the_session_answers_them(server, clip):
    """MAX_AHEAD blocks ahead wait; one more is refused at once (while they still wait); closing the
    session answers every waiting one as an unknown session, and none of them ran."""
    _, truth = clip
    sid, held = opened(server, clip)
    before = counts(server)
    with concurrent.futures.ThreadPoolExecutor(MAX_AHEAD) as pool:
        waiting = [pool.submit(post, server, block(truth, sid, held, 2)) for _ in range(MAX_AHEAD)]
        ahead_now(server, MAX_AHEAD, waiting)
        extra = post(server, block(truth, sid, held, 2))
        assert extra.status_code == 409 and extra.json()["code"] == "out_of_sync", extra.text
        assert not any(f.done() for f in waiting)
        assert httpx.delete(f"{server.url}/v1/sessions/{sid}", timeout=60).status_code == 200
        answers = [f.result() for f in waiting]
    assert [(a.status_code, a.json()["code"]) for a in answers] == [(404, "unknown_session")] * MAX_AHEAD
    assert grew(before, counts(server)) == {"out_of_sync": 1, "broke": MAX_AHEAD}
    assert metric(server, "specdec_verifications_ahead") == 0


def test_a_block_whose_predecessor_never_comes_is_refused_after_the_hold(clip):
    """--hold-ahead-ms bounds the wait: block 2 alone, block 1 never sent, is refused out of sync
    once the hold is over (counted as `late`), and the session is unchanged: block 1 then goes on."""
    _, truth = clip
    with Server("--max-batch", "1", "--hold-ahead-ms", "200") as short:
        sid, held = opened(short, clip)
        before = counts(short)
        late = post(short, block(truth, sid, held, 2))
        assert late.status_code == 409 and late.json()["code"] == "out_of_sync", late.text
        assert verdict(post(short, block(truth, sid, held, 1)))["accepted"] == K
        assert grew(before, counts(short)) == {"late": 1, "out_of_sync": 1, "verified": 1}


# The server's speech check (the first step of decoding a clip, after its session id is claimed)
# says it started, in the file $HOLD_STARTED, then waits for the file $HOLD_GO: the test knows the
# clip's session is being opened, and keeps it so until it lets go.
OPENING_WAITS = """
import os, time
from specdec_cli import speech as _speech
_check = _speech.check_speech
def _waiting(*args, **kwargs):
    open(os.environ["HOLD_STARTED"], "w").close()
    while not os.path.exists(os.environ["HOLD_GO"]):
        time.sleep(0.05)
    return _check(*args, **kwargs)
_speech.check_speech = _waiting
"""


def test_a_block_sent_while_its_session_is_being_opened_waits_for_the_open(clip, tmp_path):
    """Block 1 sent while the verification that opens its session (carrying the clip, under the
    client's id) is still decoding the clip: it waits for the open and then for that verdict, and
    is verified. Before: 404 unknown_session at once (the client then sent it again in turn)."""
    import secrets

    message, truth = clip
    started, go = tmp_path / "started", tmp_path / "go"
    env = {"HOLD_STARTED": str(started), "HOLD_GO": str(go)}
    with Server("--max-batch", "1", "--hold-ahead-ms", "120000", prelude=OPENING_WAITS, env=env) as server:
        sid = secrets.token_urlsafe(16)
        opening = wire.VerifyRequest(list(truth[:K]), session=sid, clip=message, config=config_dict(DecodingConfig()))
        held = len(message.prompt_ids) + K
        before = counts(server)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(post, server, opening)
            assert wait_for(lambda: started.exists() or first.done()), "the clip was never decoded"
            second = pool.submit(post, server, block(truth, sid, held, 1))
            ahead_now(server, 1, [first, second])
            go.touch()
            opened, later = verdict(first.result()), verdict(second.result())
        assert (opened["session"], opened["accepted"], opened["held"]) == (sid, K, held)
        assert (later["accepted"], later["token"]) == (K, truth[2 * (K + 1) - 1])
        assert grew(before, counts(server)) == {"verified": 2, "in_turn": 1}
