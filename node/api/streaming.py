"""Server-sent events for streaming completions, in whichever dialect's events.

One writer for the three APIs: a dialect supplies the events (`StreamEvents`: OpenAI chunks,
Anthropic message events, Responses typed events); this module owns the response, the order of
writes, the seed-000 DIAG lines and what a failure mid-stream becomes. Headers go out once the
route is assembled (queue and sched are known); token-level timings ride on the dialect's last
event. The stream's outcome (ok, cancelled, stalled, error) is returned to the driver, which
closes the trace with it. `stalled`: the node cut off a client that took nothing for
STREAM_WRITE_STALL_S (a hung app, a buffering proxy): the node's decision, not the client's close,
so it enters the diagnostics' failure ring (2026-12-07, review r25: it was `cancelled`, which
does not).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from node import const
from node.errors import NodeError, ShuttingDown
from node.inference.generate import CompletionRun
from node.inference.request import Delta

log = logging.getLogger(__name__)


class StreamEvents(Protocol):
    """The encoded SSE events of one streamed reply, in one API dialect."""

    def opening(self) -> list[bytes]:
        """Events before the first token (role chunk, message_start, response.created, ...)."""

    def delta(self, delta: Delta) -> list[bytes]:
        """Events for one piece of the reply (may be none)."""

    def closing(self) -> list[bytes]:
        """Events after the last token; the run's trace holds the finish reason and timings."""

    def error(self, exc: NodeError) -> list[bytes]:
        """Events that end the stream with an error (the headers are gone: no status to set)."""


@dataclass(frozen=True)
class StreamResult:
    """What became of a stream: the response, and ok / cancelled / stalled / error (with the error)."""

    response: web.StreamResponse
    outcome: str
    error: NodeError | None = None


SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"


async def stream_completion(request: web.Request, run: CompletionRun, events: StreamEvents,
                            content_type: str = SSE_CONTENT_TYPE) -> StreamResult:
    """Write the stream of a prepared run: SSE, or the dialect's own (Ollama's NDJSON)."""
    trace = run.trace
    started = time.monotonic()
    resp = web.StreamResponse(headers={
        "Content-Type": content_type,
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
        **trace.headers(streaming=True),
    })
    stage = "role"

    async def write(event: bytes) -> None:
        # a client that stopped reading (the socket's buffers full) must not hold the model's seat
        # for ever: a write that cannot go on for STREAM_WRITE_STALL_S ends the stream. Only a write
        # behind unsent bytes, or one big enough to fill the transport's buffer by itself, can wait:
        # the usual one (a small event, nothing queued) skips the timer.
        transport = request.transport
        small = len(event) <= _UNTIMED_WRITE_MAX
        if small and transport is not None and not transport.get_write_buffer_size():
            await resp.write(event)
            return
        await _bounded(resp.write(event))

    try:
        await resp.prepare(request)
        for event in events.opening():
            await write(event)
        stage = "token"
        async for delta in run.deltas():
            for event in events.delta(delta):
                await write(event)
        trace.finished = time.monotonic()
        stage = "finish"
        for event in events.closing():
            await write(event)
        await _bounded(resp.write_eof())  # it drains: a client that stopped reading holds it too
        log.info("DIAG: %s stream completed request_id=%s elapsed_ms=%d token_count=%d",
                 "local" if trace.route == "local" else "SSE distributed", trace.request_id,
                 (time.monotonic() - started) * 1000, trace.completion_tokens)
        return StreamResult(resp, "ok")
    except ConnectionResetError:
        what = {"role": "role delta send failed — client disconnected early",
                "token": "token send failed — channel full or client disconnected",
                "finish": "finish delta send failed — client disconnected at finish"}[stage]
        # DEBUG, as the driver's: the summary line says outcome=cancelled (a client closing is routine)
        log.debug("DIAG: local stream %s request_id=%s token_count=%d elapsed_ms=%d", what,
                    trace.request_id, trace.completion_tokens, (time.monotonic() - started) * 1000)
        return StreamResult(resp, "cancelled")
    except _ClientStalled:  # the client takes nothing (its connection is closed under it)
        log.warning("DIAG: stream cut off, the client stopped reading request_id=%s token_count=%d stalled_s=%d",
                    trace.request_id, trace.completion_tokens, const.STREAM_WRITE_STALL_S)
        if request.transport is not None:
            request.transport.abort()
        return StreamResult(resp, "stalled")
    except NodeError as exc:
        # seed-000 marker, kept word for word (users grep it); "generate_stream" is the seed's name
        # for the engine loop, here CompletionRun.deltas()
        # the request's own fault (a grammar that cannot go on) is not the node's error, nor is a stop's
        # drain ending it (one ERROR line per stream made a planned stop look like a failure)
        log.log(logging.ERROR if exc.http_status >= 500 and not isinstance(exc, ShuttingDown) else logging.WARNING,
                "DIAG: local stream generate_stream error — executor error request_id=%s error=%s",
                trace.request_id, exc.message)
        await _close_with_error(request, resp, events, exc)
        return StreamResult(resp, "error", exc)
    except Exception as exc:  # a bug must still end the client's stream with an error, never a hang
        log.exception("DIAG: stream failed unexpectedly request_id=%s", trace.request_id)
        err = NodeError(f"internal error while streaming: {type(exc).__name__}; see the node log")
        await _close_with_error(request, resp, events, err)
        return StreamResult(resp, "error", err)


async def _close_with_error(request: web.Request, resp: web.StreamResponse, events: StreamEvents,
                            exc: NodeError) -> None:
    """The dialect's error events, end of stream (best effort: the client may be gone, or take nothing)."""
    try:
        if not resp.prepared:
            return
        for event in events.error(exc):
            await _bounded(resp.write(event))
        await _bounded(resp.write_eof())
    except ConnectionResetError:
        pass
    except _ClientStalled:
        if request.transport is not None:
            request.transport.abort()


@web.middleware
async def bounded_send_middleware(request: web.Request, handler):
    """Send a handler's whole response (a JSON reply, an error) here, its write timed as a stream's.
    aiohttp writes it after the handler returns and its drain waits on the client untimed: a client
    that sent a request and read nothing back (a non-stream reply of megabytes: logprobs, embeddings)
    held its connection and the reply's bytes for as long as its socket stayed open. The run's seat
    and trace are released before (the handler has returned)."""
    resp = await handler(request)
    if not isinstance(resp, web.StreamResponse) or resp.prepared:  # a stream has sent itself
        return resp
    try:
        await resp.prepare(request)
        await _drained(resp)
    except ConnectionError:  # the client went away: aiohttp's own write_eof meets it again, quietly
        pass
    except _ClientStalled:
        log.warning("DIAG: response cut off, the client stopped reading path=%s status=%d stalled_s=%d",
                    request.path, resp.status, const.STREAM_WRITE_STALL_S)
        if request.transport is not None:
            request.transport.abort()  # aiohttp's own write_eof then meets a closed connection, quietly
    return resp


async def _drained(resp: web.StreamResponse) -> None:
    """A whole body written and drained within STREAM_WRITE_STALL_S plus its length at
    REPLY_MIN_RATE_BYTES_S; past that, _ClientStalled. Progress cannot be watched from here: the
    kernel's socket buffers take megabytes on their own (a slow reader drains them for seconds while
    nothing leaves the transport's buffer), so a slow client that keeps reading is given the time a
    slow link needs (found in review: the first version timed the whole send at 60 s, so a reply of
    megabytes over a slow link was cut off and logged as a stall)."""
    size = resp.content_length or 0
    allowed = const.STREAM_WRITE_STALL_S + size / const.REPLY_MIN_RATE_BYTES_S
    timer = asyncio.timeout(allowed)
    try:
        async with timer:
            await resp.write_eof()
    except TimeoutError:
        if timer.expired():
            raise _ClientStalled from None
        raise


# a write of at most this much into an empty transport buffer cannot pause the protocol (asyncio's
# high-water mark is 64 KiB), so it cannot wait on a client that stopped reading
_UNTIMED_WRITE_MAX = 16 * 1024


class _ClientStalled(Exception):
    """A write waited STREAM_WRITE_STALL_S on a client that reads nothing."""


async def _bounded(write: Awaitable[None]) -> None:
    """A write (or the end of the stream, which drains) that waits at most STREAM_WRITE_STALL_S.
    Only its own timeout becomes _ClientStalled: a TimeoutError from elsewhere stays what it is."""
    timer = asyncio.timeout(const.STREAM_WRITE_STALL_S)
    try:
        async with timer:
            await write
    except TimeoutError:
        if timer.expired():
            raise _ClientStalled from None
        raise
