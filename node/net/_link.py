"""One authenticated TLS link to a peer: frame I/O, request/response, PING/PONG liveness.

The link reads frames in its own task and hands everything that is not a response or a PING to
the manager's dispatcher. A malformed frame closes this link only (with a logged reason); the
ping loop marks the link dead when PEER_GONE_MISSED_PINGS consecutive pings miss, each waiting
the RTO (at least PING_TIMEOUT_MIN_S) and backing it off (RFC 6298 §5.5).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from node import const
from node.errors import PeerError, PeerUnreachable, ProtocolError, RequestTimeout
from node.logs import MESSAGE, TRACE, kv

from ._addr import format_addr, parse_addr
from ._frames import PREFIX_LEN, Frame, FrameType, decode_body, decode_prefix, encode_frame, type_name
from ._identity import short_id
from ._messages import ErrorInfo, Hello
from ._rto import RtoEstimator
from ._stream import Stream

log = logging.getLogger(__name__)

Transport = Literal["direct", "relayed"]
_connection_ids = itertools.count(1)
# The pipeline's frames (WORK, RESULT, ACK, ...), late replies among them: their rate is the
# work's. Everything else on a link (PING, HELLO, PEX, MEMBER, RELAY, ERROR, a PONG nobody waits
# for, types we do not know) comes a few times a minute from a peer that works: held to a budget.
_WORK_TYPES = frozenset(t for t in FrameType if t >= FrameType.WORK)


class _Expired(Exception):
    """A request's timer fired before its reply arrived."""


def _expire(future: asyncio.Future[Frame]) -> None:
    if not future.done():
        future.set_exception(_Expired())


async def async_read_frame(stream: Stream, max_bytes: int | None = None) -> Frame:
    """Read one frame: prefix (validated before the body is read), then header + payload.
    `max_bytes`: a smaller bound on the body than any frame's (before admission: a peer that has
    not proved anything must not make us buffer a 256 MiB body)."""
    prefix = decode_prefix(await stream.read_exactly(PREFIX_LEN))
    size = prefix.header_len + prefix.payload_len
    if max_bytes is not None and size > max_bytes:
        raise ProtocolError(f"{type_name(prefix.type)} frame of {size} bytes during the handshake (max {max_bytes})")
    body = await stream.read_exactly(size) if size else b""
    return decode_body(prefix, body)


class PeerLink:
    """An established, authenticated link. Use `async_send` / `async_request`; never the stream."""

    def __init__(
        self,
        stream: Stream,
        *,
        node_id: str,
        hello: Hello,
        link_nonce: str,
        transport: Transport,
        is_dialer: bool,
        address: str,
        rto: RtoEstimator,
        dispatch: Callable[[PeerLink, Frame], None],
        via_relay: str | None = None,
    ):
        self.stream = stream
        self.node_id = node_id
        self.short_id = short_id(node_id)
        self.hello = hello
        self.link_nonce = link_nonce  # the dialler's nonce: both ends rank duplicate links by it
        self.transport: Transport = transport
        self.is_dialer = is_dialer
        self.address = address  # "host:port" of the other end as this side sees it
        self.via_relay = via_relay  # relay "host:port" for relayed links
        self.rto = rto
        self.connection_id = next(_connection_ids)
        self.established_at = time.time()
        self.last_seen = time.monotonic()
        self.rtt_s: float | None = None
        self.retired = False  # lost a duplicate-link tie-break: closes once both ends are drained
        self._drained_sent = False  # this end said it has nothing of its own in flight (retired)
        self._peer_drained = False  # the peer said so
        self.close_cause: str | None = None
        self.frames_in = 0
        self.frames_out = 0
        self._control_tokens = float(const.CONTROL_FRAMES_BURST)  # a token bucket, refilled by time
        self._control_at = self.last_seen
        self.closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._dispatch = dispatch
        self._request_ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.order_tails: dict[int, asyncio.Task[None]] = {}  # ordered handlers, per frame type
        self.on_rtt: Callable[[PeerLink], None] | None = None  # the manager's "changed" hook

    def __repr__(self) -> str:
        return (f"PeerLink({self.short_id} #{self.connection_id} {self.transport} {self.address} "
                f"dialer={self.is_dialer})")

    @property
    def dial_address(self) -> str:
        """Where the peer can be dialled: the dialled address, or (it dialled us, directly) its
        observed host with the listen port it announced — not the port its connection came from."""
        if self.is_dialer or self.transport != "direct" or not self.hello.listen_port:
            return self.address
        try:
            return format_addr(parse_addr(self.address)[0], self.hello.listen_port)
        except ValueError:
            return self.address

    @property
    def is_open(self) -> bool:
        """False once closing started."""
        return self.close_cause is None

    @property
    def pending_requests(self) -> int:
        """Requests sent on this link still waiting for their reply."""
        return len(self._pending)

    def start(self) -> None:
        """Start delivering frames (from the stream's data_received) and the ping loop."""
        self._tasks.append(asyncio.create_task(self._async_ping_loop(), name=f"link-ping-{self.short_id}"))
        self.stream.start_frames(self._on_frame, self._on_end)

    # --- sending ------------------------------------------------------------------------------

    def send_nowait(self, frame: Frame, request_id: int | None = None) -> None:
        """Queue a frame without waiting for back-pressure (small control frames)."""
        self._write([frame], encode_frame(frame, request_id), request_id)

    def send_many_nowait(self, frames: list[Frame]) -> None:
        """Queue frames back to back as one write (one TLS pass, one syscall), in this order."""
        parts: list[bytes] = []
        for frame in frames:
            parts += encode_frame(frame)
        self._write(frames, parts, None)

    def _write(self, frames: list[Frame], parts: list[bytes], request_id: int | None) -> None:
        if self.close_cause is not None:
            raise PeerUnreachable(f"link to {self.short_id} is closed ({self.close_cause})")
        try:
            self.stream.writelines(parts)
        except (ConnectionError, RuntimeError) as exc:
            raise PeerUnreachable(f"link to {self.short_id} is closed: {exc}") from exc
        self.frames_out += len(frames)
        for frame in frames:
            level = TRACE if frame.type == FrameType.PING or frame.type == FrameType.PONG else MESSAGE
            if log.isEnabledFor(level):
                log.log(level, "DIAG: sent frame %s", kv(
                    peer_id=self.short_id, type=type_name(frame.type),
                    request_id=frame.request_id if request_id is None else request_id,
                    payload_bytes=len(frame.payload)))

    @property
    def unsent(self) -> int:
        """Bytes queued on this link that the kernel has not taken yet."""
        return self.stream.unsent

    async def async_send(self, frame: Frame) -> None:
        """Send a frame, waiting while the link's write buffer is full."""
        self.send_nowait(frame)
        if self.stream.writing_paused:
            await self._async_drain()

    async def _async_drain(self) -> None:
        try:
            await self.stream.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise PeerUnreachable(f"link to {self.short_id} closed while sending: {exc}") from exc

    async def async_request(self, frame: Frame, timeout_s: float | None = None) -> Frame:
        """Send a request and wait for its reply (same request id, FLAG_RESPONSE).

        Raises PeerError with the peer's code on an ERROR reply, RequestTimeout after timeout_s
        (default: the link's current RTO-based deadline is NOT applied; pass one), and
        PeerUnreachable if the link closes first.
        """
        if self._drained_sent:  # this end said it has nothing more to ask here: the peer may close it
            raise PeerUnreachable(f"link to {self.short_id} is retired (a duplicate): ask on the one kept")
        rid = next(self._request_ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Frame] = loop.create_future()
        self._pending[rid] = future
        # A timer on the future is cheaper than asyncio.timeout() on this hot path.
        timer = None if timeout_s is None else loop.call_later(timeout_s, _expire, future)
        try:
            self.send_nowait(frame, rid)
            if self.stream.writing_paused:
                await self._async_drain()
            reply = await future
        except _Expired as exc:
            raise RequestTimeout(
                f"{type_name(frame.type)} to {self.short_id} not answered within {timeout_s:.3f} s"
            ) from exc
        finally:
            if timer is not None:
                timer.cancel()
            if future.done() and not future.cancelled():
                future.exception()  # read: the timer may have failed it while a drain raised
            else:
                future.cancel()
            self._pending.pop(rid, None)
            if self.retired and not self._pending:
                self._maybe_drained()
        if reply.type == FrameType.ERROR:
            info = ErrorInfo.from_frame(reply)
            raise PeerError(f"peer {self.short_id} answered ERROR {info.code}: {info.message}",
                            code=info.code)
        return reply

    def send_error(self, request: Frame, code: str, message: str, extra: dict[str, Any] | None = None) -> None:
        """Answer a request with ERROR (best effort: the link may already be gone); `extra`: more
        header fields (code and message stay these)."""
        header: dict[str, Any] = {**(extra or {}), **ErrorInfo(code, message).to_header()}
        frame = Frame(FrameType.ERROR, header, b"", request.request_id, 1 if request.request_id else 0)
        try:
            self.send_nowait(frame)
        except PeerUnreachable:
            pass

    # --- receiving ----------------------------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        """Called by the stream for each complete frame, synchronously in data_received."""
        self.last_seen = now = time.monotonic()
        self.frames_in += 1
        if frame.is_response:
            future = self._pending.get(frame.request_id)
            if future is not None and not future.done():
                future.set_result(frame)
            elif (frame.type in _WORK_TYPES or self._control_frame(frame, now)) and log.isEnabledFor(logging.DEBUG):
                log.debug("DIAG: late or unknown reply dropped %s",
                          kv(peer_id=self.short_id, type=type_name(frame.type), request_id=frame.request_id))
            return
        if frame.type not in _WORK_TYPES and not self._control_frame(frame, now):
            return
        try:
            if frame.type == FrameType.PING and frame.header.get("drained") is True and not frame.request_id:
                self._peer_drained = True  # the peer retired this link and has nothing in flight on it
                self._maybe_drained()
                return
            if frame.type == FrameType.PING:
                # a peer that sends PINGs and reads nothing must not grow our send buffer without
                # bound: with a backlog to it, its PONGs are dropped (a live peer that is reading
                # sees our other frames arrive, which its ping loop counts as alive)
                if self.stream.unsent <= const.PONG_MAX_BACKLOG_BYTES:
                    self.send_nowait(frame.reply(FrameType.PONG))
                elif log.isEnabledFor(logging.DEBUG):
                    log.debug("DIAG: PONG dropped, the peer is not reading %s",
                              kv(peer_id=self.short_id, unsent_bytes=self.stream.unsent))
                return
            if log.isEnabledFor(MESSAGE):
                log.log(MESSAGE, "DIAG: received frame %s", kv(
                    peer_id=self.short_id, type=type_name(frame.type), request_id=frame.request_id,
                    payload_bytes=len(frame.payload)))
            self._dispatch(self, frame)
        except ProtocolError:
            raise  # the stream ends frame delivery and reports "malformed frame"
        except PeerUnreachable:
            pass  # the link is closing; its end is reported separately
        except Exception:  # a bug in a dispatcher must cost this link, not the transport's loop
            log.exception("frame dispatch failed on the link to %s", self.short_id)
            self.close("internal error")

    def _control_frame(self, frame: Frame, now: float) -> bool:
        """Charge a frame that is not the pipeline's work to the link's budget (CONTROL_FRAMES_BURST,
        refilled at CONTROL_FRAMES_PER_S); past it the peer is flooding and the link closes. A
        member sending tiny PINGs or unknown types back to back had this node answer each (and at
        -v log each) for seconds, while other links' replies and deadlines waited."""
        tokens = min(float(const.CONTROL_FRAMES_BURST),
                     self._control_tokens + (now - self._control_at) * const.CONTROL_FRAMES_PER_S)
        self._control_at = now
        if tokens >= 1.0:
            self._control_tokens = tokens - 1.0
            return True
        self._control_tokens = tokens
        if self.close_cause is None:
            log.warning("DIAG: peer flooding, closing link %s", kv(
                peer_id=self.short_id, connection_id=self.connection_id, type=type_name(frame.type),
                burst=const.CONTROL_FRAMES_BURST, per_s=const.CONTROL_FRAMES_PER_S, frames_in=self.frames_in))
            self.close("flooding")
        return False

    def _on_end(self, cause: str, exc: BaseException | None) -> None:
        """The stream ended (EOF, error) or delivered a malformed/truncated frame."""
        if cause in ("malformed frame", "truncated frame"):
            reason = exc.message if isinstance(exc, ProtocolError) else str(exc)
            log.warning("DIAG: malformed frame, closing link %s",
                        kv(peer_id=self.short_id, connection_id=self.connection_id, reason=reason))
            if cause == "malformed frame":
                try:
                    self.send_nowait(Frame(FrameType.ERROR, ErrorInfo("protocol_error", reason).to_header()))
                except PeerUnreachable:
                    pass
        if cause == "eof" and self.retired:
            cause = "duplicate"  # both ends retire the same link; the peer's grace ended first
        self.close(self.close_cause or cause)

    # --- liveness -----------------------------------------------------------------------------

    def liveness_deadline_s(self) -> float:
        """Longest silence before this link is declared dead: one ping interval plus
        PEER_GONE_MISSED_PINGS backed-off RTOs (each at least PING_TIMEOUT_MIN_S)."""
        return const.PING_INTERVAL_S + self.rto.deadline_s(
            const.PEER_GONE_MISSED_PINGS, floor_s=const.PING_TIMEOUT_MIN_S)

    async def _async_ping_loop(self) -> None:
        missed = 0
        while self.is_open and not self.retired:  # (a retired link's requests have their own deadlines)
            timeout = max(self.rto.rto_s, const.PING_TIMEOUT_MIN_S)
            started = time.monotonic()
            try:
                await self.async_request(Frame(FrameType.PING), timeout_s=timeout)
            except RequestTimeout:
                if self.last_seen > started:
                    missed = 0  # the pipe is busy (a PONG queued behind data) but alive
                    await asyncio.sleep(const.PING_INTERVAL_S)
                    continue
                missed += 1
                self.rto.backoff()
                log.debug("DIAG: ping missed %s", kv(peer_id=self.short_id, missed=missed,
                                                     timeout_ms=timeout * 1000, rto_ms=self.rto.rto_s * 1000))
                if missed >= const.PEER_GONE_MISSED_PINGS:
                    log.info("DIAG: peer missed pings, closing link %s",
                             kv(peer_id=self.short_id, connection_id=self.connection_id, missed=missed,
                                silent_s=round(time.monotonic() - self.last_seen, 2)))
                    self.close("ping_timeout")
                    return
                continue  # probe again at once with the backed-off RTO
            except (PeerError, ProtocolError):
                return  # link closed (or the peer refuses PING); the read loop reports why
            rtt = time.monotonic() - started
            self.rtt_s = rtt
            self.rto.observe(rtt)
            missed = 0
            if self.on_rtt is not None:
                self.on_rtt(self)
            await asyncio.sleep(const.PING_INTERVAL_S)

    # --- closing ------------------------------------------------------------------------------

    def retire(self) -> None:
        """Lost a duplicate-link tie-break: take no new work; close once both ends are drained.

        Each end, once retired with none of its own requests waiting for a reply, says so with a
        PING whose header is {"drained": true} (no request id: older versions answer it with a PONG
        this end drops). The link closes when this end has said it and heard it: every request
        either end sent on it has had its reply by then (a reply travels on its request's link, and
        frames keep their order), so nothing in flight is cut. Until 2026-12-07 each end closed on
        its own timer (DUPLICATE_LINK_GRACE_S, x4 with requests waiting): an end with nothing of
        its own waiting closed after one grace while the other's request was still on its way or
        being answered (a 512 KiB request through a busy relay, a partial model's chunk read), and
        that request failed "link closed (duplicate)". A peer that never says it (an older
        version, which closes on its timer: this end sees the EOF) or that ranked the links
        otherwise is bounded by DUPLICATE_LINK_DRAIN_MAX_S, past every request's own deadline, and
        the manager closes it sooner when the kept link goes, or a newer one to the peer retires.
        A request asked on it after this end said so is refused (the peer may close it meanwhile)."""
        if self.retired or not self.is_open:
            return
        self.retired = True
        asyncio.get_running_loop().call_later(const.DUPLICATE_LINK_DRAIN_MAX_S, self.close, "duplicate")
        self._maybe_drained()

    def _maybe_drained(self) -> None:
        """Retired with nothing of ours waiting: say so once; close when the peer has said so too."""
        if not self.retired or self._pending or not self.is_open:
            return
        if not self._drained_sent:
            self._drained_sent = True
            try:
                self.send_nowait(Frame(FrameType.PING, {"drained": True}))
            except PeerUnreachable:
                return
        if self._peer_drained:
            self.close("duplicate")

    def close(self, cause: str = "closed") -> None:
        """Close the link (idempotent); pending requests fail with PeerUnreachable."""
        if self.close_cause is not None:
            return
        self.close_cause = cause
        self.stream.stop_frames()
        self.stream.close()
        if cause in ("ping_timeout", "malformed frame", "truncated frame", "flooding"):
            self.stream.abort()
        for rid, future in list(self._pending.items()):
            if not future.done():
                future.set_exception(PeerUnreachable(f"link to {self.short_id} closed ({cause})"))
            self._pending.pop(rid, None)
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current and not task.done():
                task.cancel()
        if not self.closed.done():
            self.closed.set_result(cause)
