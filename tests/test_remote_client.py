"""The session client's waiting rules, against a stand-in server that answers 503 on purpose (a
real `specdec serve` is full only while every session is mid-verification, which no test can hold
still): it honours Retry-After, retries within its bound and then says what to do; and what it
counts as crossing the link is what the stand-in received and sent."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specdec_cli.errors import InputError
from specdec_cli.remote import wire
from specdec_cli.remote.client import CloudError, LinkStats, RemoteClient, check_url

ANSWER = wire.VerifyResponse(session="s", accepted=1, token=7, kind="bonus", held=10, fed=1, prefilled=0,
                             forwards=1, all_forwards=1)


class StandIn:
    """/busy: 503 (Retry-After 0) for the first `busy` requests, then a verdict. /full: always 503."""

    def __init__(self, busy: int) -> None:
        self.busy, self.seen, self.received, self.sent = busy, 0, 0, 0

        async def verify(request: Request) -> Response:
            body = await request.body()
            self.seen += 1
            self.received += len(body)
            if self.seen <= self.busy:
                return JSONResponse({"error": "all 1 sessions are busy", "code": "full"}, status_code=503,
                                    headers={"Retry-After": "0"})
            content = wire.encode(ANSWER)
            self.sent += len(content)
            return Response(content, media_type=wire.MSGPACK)

        async def full(request: Request) -> Response:
            await request.body()
            return JSONResponse({"error": "all 1 sessions are busy", "code": "full"}, status_code=503,
                                headers={"Retry-After": "1"})

        app = Starlette(routes=[Route("/busy", verify, methods=["POST"]), Route("/full", full, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_a_busy_server_is_waited_for_and_every_attempt_counted():
    stand_in = StandIn(busy=2)
    with stand_in as url:
        client = RemoteClient(url, retry_s=10)
        link = LinkStats()
        message = wire.VerifyRequest([1, 2, 3], session="s", held=9, pending=[4])
        answer = client.call("POST", "/busy", message, wire.VerifyResponse, link)
        client.close()
    assert answer == ANSWER and stand_in.seen == 3 and link.round_trips == 3
    body = len(wire.encode(message))
    assert stand_in.received == 3 * body
    # Up: three requests (line, headers, body); down: two 503s and the verdict.
    assert 3 * body < link.uplink_bytes < 3 * (body + 400)
    assert stand_in.sent < link.downlink_bytes < stand_in.sent + 3 * 400


def test_a_server_that_stays_full_is_reported_after_the_bound():
    with StandIn(busy=0) as url:
        client = RemoteClient(url, retry_s=2.5)
        link = LinkStats()
        started = time.monotonic()
        with pytest.raises(CloudError) as full:
            client.call("POST", "/full", wire.VerifyRequest([1]), wire.VerifyResponse, link)
        client.close()
    # Retry-After: 1 honoured: about one try per second until the next wait would pass 2.5 s.
    assert 1.5 < time.monotonic() - started < 6 and link.round_trips in (2, 3)
    assert "stayed full for 2.5 s" in full.value.message and "--max-sessions" in full.value.message


@pytest.mark.parametrize("url", ["http://", "ftp://127.0.0.1:8765", "http://127.0.0.1:99999", "127.0.0.1:8765"])
def test_a_cloud_url_that_names_no_server_is_refused(url):
    with pytest.raises(InputError) as bad:
        check_url(url)
    assert bad.value.message == f"--cloud {url} is not a server address; give http://HOST:PORT of a `specdec serve`"


def test_messages_round_trip_through_msgpack_and_json():
    clip = wire.Clip(b"\x00\x01", "f32", 16000, [1, 2])
    request = wire.VerifyRequest([5, 6], clip=clip, config=wire.DecodingSettings(k=4), pending=[3])
    assert msgspec.msgpack.decode(wire.encode(request), type=wire.VerifyRequest) == request
    assert wire.decoder(wire.VerifyRequest, "application/json").decode(msgspec.json.encode(request)) == request


def test_probability_rows_cross_exactly_in_the_smaller_form():
    import numpy as np

    rng = np.random.default_rng(0)
    full = rng.dirichlet(np.ones(1000)).astype(np.float32)            # nothing is zero: all values
    truncated = np.where(full > np.quantile(full, 0.99), full, 0).astype(np.float32)  # top 1%: pairs
    for row, size in ((full, 4000), (truncated, 8 * np.count_nonzero(truncated))):
        packed = wire.sparse_row(row)
        assert len(packed.index) + len(packed.value) == size
        assert np.array_equal(wire.dense_row(packed), row)
