"""Property tests of the client's answer checks (issue 25), by hypothesis, against a stand-in server
on loopback that sends whatever hypothesis draws: a verdict as a correct server would give it, the
same with fields replaced by anything (wrong types, out of range, huge, missing), or random bytes;
a /health likewise. Whatever comes back, the client either hands the loop a verdict that satisfies
the verifier's invariants or fails the clip with a CloudAnswerError — never another exception,
never a verdict from a bad answer; and a correct answer is always taken as sent."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from fake_cloud import VOCAB, FakeCloud, Reply, identity, remote_cloud
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from specdec_cli.remote import wire
from specdec_cli.remote.answers import MAX_VOCAB
from specdec_cli.remote.client import CloudAnswerError, RemoteClient

FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
K, PROMPT, PENDING = 3, 4, 1  # remote_cloud's request: a new session, prompt of 4, one token pending

ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)


@st.composite
def probability_rows(draw: st.DrawFn) -> dict:
    """A correct target row: a distribution over VOCAB, sparse or dense as the server would pick."""
    support = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=VOCAB, unique=True))
    weights = draw(st.lists(st.floats(0.01, 1.0), min_size=len(support), max_size=len(support)))
    row = np.zeros(VOCAB, np.float32)
    row[support] = np.array(weights) / sum(weights)
    return msgspec.structs.asdict(wire.sparse_row(row))


@st.composite
def correct_verdicts(draw: st.DrawFn, sample: bool) -> dict:
    accepted = draw(st.integers(0, K))
    kind = "bonus" if accepted == K else "recovered"
    row = draw(probability_rows()) if sample and kind == "recovered" else None
    return {"session": draw(st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True)), "accepted": accepted,
            "token": -1 if row is not None else draw(st.integers(0, VOCAB - 1)), "kind": kind,
            "held": PROMPT + PENDING + accepted, "fed": PENDING + K, "prefilled": PROMPT,
            "forwards": 1, "all_forwards": draw(st.integers(1, 2)), "target_row": row, "ended": draw(st.booleans())}


@st.composite
def broken(draw: st.DrawFn, base: st.SearchStrategy[dict]) -> dict:
    answer = dict(draw(base))
    for name in draw(st.lists(st.sampled_from(sorted(answer)), min_size=1, max_size=3, unique=True)):
        if draw(st.booleans()):
            answer[name] = draw(ANY | st.integers(-5, 2 * VOCAB))
        else:
            del answer[name]
    return answer


def bodies(sample: bool) -> st.SearchStrategy[tuple[str, bytes]]:
    """(what the body is, the body): correct, broken, or not a verdict at all."""
    return st.one_of(
        correct_verdicts(sample).map(lambda a: ("correct", msgspec.msgpack.encode(a))),
        broken(correct_verdicts(sample)).map(lambda a: ("broken", msgspec.msgpack.encode(a))),
        ANY.map(lambda a: ("broken", msgspec.msgpack.encode(a))),
        st.binary(max_size=200).map(lambda b: ("broken", b)))


@pytest.fixture(scope="module")
def stand_in():
    current: dict[str, bytes] = {}

    def answer(request):
        if current.get("echo") and request.path == "/v1/verify":
            # Protocol 2: a correct verdict is under the session id the request named.
            verdict = msgspec.msgpack.decode(current["body"])
            verdict["session"] = request.verify().session
            current["body"] = msgspec.msgpack.encode(verdict)
        return Reply(200, current["body"], {"content-type": wire.MSGPACK if request.path != "/health" else wire.JSON})
    with FakeCloud(answer) as fake:
        yield fake, current


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@FUZZ
@given(drawn=st.data())
def test_a_verdict_is_valid_or_the_clip_fails(stand_in, sample, drawn):
    fake, current = stand_in
    what, current["body"] = drawn.draw(bodies(sample))
    current["echo"] = what == "correct"
    client, cloud, sequence, proposal, generator = remote_cloud(fake.url, sample)
    try:
        verdict, fed = cloud.verify(sequence, proposal, None, generator)
    except CloudAnswerError as exc:
        assert what == "broken", exc.message  # a correct answer is never refused
        assert "\n" not in exc.message and cloud.held == 0 and cloud.session is None
        return
    finally:
        client.close()
    # Taken: the verifier's invariants hold, and the client's state is the answer's.
    sent = msgspec.msgpack.decode(current["body"])
    assert 0 <= verdict.accepted <= K and (verdict.kind == "bonus") == (verdict.accepted == K)
    assert 0 <= verdict.token < VOCAB and fed == PENDING + K
    assert cloud.held == len(sequence) + verdict.accepted
    assert verdict.accepted == sent["accepted"] and verdict.kind == sent["kind"]
    if sent.get("target_row") is None:
        assert verdict.token == sent["token"]
    else:  # the recovered token is drawn here, from the row: within its support
        assert wire.dense_row(msgspec.convert(sent["target_row"], wire.SparseRow))[verdict.token] > 0


def identities() -> st.SearchStrategy[dict]:
    good = identity()
    return st.one_of(
        st.just(good),
        st.builds(lambda v, r: {**good, "vocab": v, "rate": r}, st.integers(1, MAX_VOCAB), st.integers(1, 10**6)),
        broken(st.just(good)))


@FUZZ
@given(drawn=st.data())
def test_a_health_is_an_identity_or_refused(stand_in, drawn):
    fake, current = stand_in
    body = drawn.draw(st.one_of(identities(), ANY))
    try:
        current["body"] = msgspec.json.encode(body)
    except (TypeError, msgspec.EncodeError):
        assume(False)  # bytes and non-string keys have no JSON form
    client = RemoteClient(fake.url, retry_s=0, timeout_s=10)
    try:
        info = client.health()
    except CloudAnswerError as exc:
        assert "\n" not in exc.message
        return
    finally:
        client.close()
    assert isinstance(info, dict) and info["protocol"] == wire.PROTOCOL
    assert type(info["vocab"]) is int and 1 <= info["vocab"] <= MAX_VOCAB
    assert type(info["rate"]) is int and info["rate"] >= 1 and isinstance(info["tokenizer"], str) and info["tokenizer"]
