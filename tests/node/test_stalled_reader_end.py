"""A streaming client that stops reading is cut off whichever write waits on it: not only a token's
write behind unsent bytes, but also one big event written into an empty buffer (a Responses
`response.completed` carries the whole reply) and the end of the stream (write_eof drains). Either
of those waited for as long as the socket stayed open, and the driver's run.close(), which frees
the model's seat, never came."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest
from aiohttp import web

from node import const
from node.api import streaming
from node.errors import NodeError
from node.trace import RequestTrace, TraceHub


class _Trace:
    request_id = "req-stall"
    completion_tokens = 0
    route = "local"
    finished = None

    def headers(self, streaming: bool = False) -> dict[str, str]:
        return {}


class _Events:
    def __init__(self, deltas: list[bytes], closing: list[bytes]):
        self._deltas, self._closing = deltas, closing

    def opening(self) -> list[bytes]:
        return []

    def delta(self, delta: bytes) -> list[bytes]:
        return [delta]

    def closing(self) -> list[bytes]:
        return self._closing

    def error(self, exc: NodeError) -> list[bytes]:
        return [b"data: error\n\n"]


def _run(deltas: list[bytes], fail: NodeError | None = None, trace=None) -> SimpleNamespace:
    async def gen():
        for d in deltas:
            yield d
        if fail is not None:
            raise fail
    return SimpleNamespace(trace=trace or _Trace(), deltas=gen)


CASES = {
    # one event bigger than any buffer, written with nothing queued (the untimed path before)
    "a big closing event": ([b"data: a\n\n"], [b"data: " + b"x" * (8 << 20) + b"\n\n"], None),
    # the transport's buffer over its high-water mark with no drain due: write_eof's drain waits
    "the end of the stream": ([b"x" * (64 * 1024 + 1), b"y" * (60 * 1024)], [], None),
    # the same, ended by an error: its events and write_eof wait too
    "an error at the end": ([b"x" * (64 * 1024 + 1), b"y" * (60 * 1024)], [], NodeError("boom")),
}


@pytest.mark.parametrize("case", CASES)
async def test_a_client_that_stops_reading_is_cut_off_at_any_write(case, monkeypatch):
    monkeypatch.setattr(const, "STREAM_WRITE_STALL_S", 0.5)
    deltas, closing, fail = CASES[case]
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handler(request: web.Request) -> web.StreamResponse:
        request.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        try:
            result = await streaming.stream_completion(request, _run(deltas, fail), _Events(deltas, closing))
            outcome.set_result(result.outcome)
            return result.response
        except BaseException as exc:
            if not outcome.done():
                outcome.set_exception(exc)
            raise

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        # ... and reads nothing
        got = await asyncio.wait_for(asyncio.shield(outcome), 10)
        assert got == ("error" if fail is not None else "stalled")
    finally:
        sock.close()
        await runner.cleanup()


async def test_a_stream_cut_off_for_a_client_that_took_nothing_enters_the_failure_ring(monkeypatch):
    """Review r25 finding 3: such a stream ended `cancelled`, and since the cancel-storm change only
    `error` enters the diagnostics' failure ring, so a buffering proxy cutting every stream showed
    nothing there. Its own outcome, `stalled`, does; a client's own close (`cancelled`) still does not."""
    monkeypatch.setattr(const, "STREAM_WRITE_STALL_S", 0.5)
    hub = TraceHub()
    trace = hub.start(RequestTrace(model="m", stream=True, operation="chat.completions"))
    deltas = [b"x" * (64 * 1024 + 1), b"y" * (60 * 1024)]
    finished: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handler(request: web.Request) -> web.StreamResponse:
        request.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        result = await streaming.stream_completion(request, _run(deltas, trace=trace), _Events(deltas, []))
        hub.finish(trace, result.outcome, error=result.error)  # as the driver closes it
        finished.set_result(result.outcome)
        return result.response

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await asyncio.wait_for(asyncio.shield(finished), 10)  # ... and reads nothing
        assert list(hub.failures) == [trace], trace.summary_line()
        assert "outcome=stalled" in trace.summary_line()
        closed = hub.start(RequestTrace(model="m", stream=True, operation="chat.completions"))
        hub.finish(closed, "cancelled")  # a client that closed its request: no failure
        assert list(hub.failures) == [trace]
    finally:
        sock.close()
        await runner.cleanup()
