"""A TCP byte stream that can read exact counts, turn into TLS in either role, and be spliced.

asyncio's StreamReader/StreamWriter pick the TLS role from how the connection was made
(`start_server` → server); a relayed link is dialled out by both ends but one of them must be
the TLS server, so links use this small protocol instead. Flow control both ways: reading
pauses past a high-water mark (unless a pending read needs more), writers wait in `drain()` while
the transport is paused.

Once a link is established the stream switches to *frame mode* (`start_frames`): complete frames
are parsed in `data_received` and handed to a callback synchronously, so a reply or an inline
handler costs no extra loop iteration (the difference between a link and a bare socket). At most
`FRAMES_PER_TURN` frames per loop callback: past them reading pauses and the rest is parsed in a
later iteration, so one peer's burst of small frames (one read holds thousands) cannot hold the
loop while other links' replies and timers wait.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import Callable
from typing import Any

from node import const
from node.errors import ProtocolError

from ._frames import PREFIX_LEN, Frame, Prefix, decode_parts, decode_prefix
from ._recvbuf import RecvBuffer

_READ_HIGH_WATER = 4 * 1024 * 1024
FRAMES_PER_TURN = 64  # frames parsed in one loop callback before the rest waits for the next


class Stream(asyncio.Protocol):
    """Protocol + reader/writer over one transport (plain TCP, later possibly TLS)."""

    def __init__(self, on_connect: Callable[[Stream], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_connect = on_connect
        self.transport: asyncio.Transport | None = None
        self._buf = RecvBuffer()  # immutable chunks: no view anyone keeps can break a read
        self._waiter: asyncio.Future[None] | None = None
        self._wanted = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self.bytes_in = 0
        self.bytes_out = 0
        self._tls: ssl.SSLObject | None = None  # set by start_tls: TLS over memory BIOs
        self._tls_in = ssl.MemoryBIO()
        self._tls_out = ssl.MemoryBIO()
        self._handshake: asyncio.Future[None] | None = None
        self._on_frame: Callable[[Frame], None] | None = None
        self._on_end: Callable[[str, BaseException | None], None] | None = None
        self._prefix: Prefix | None = None
        self._frames_deferred = False  # frames left for a later loop iteration (reading paused)

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._on_connect is not None:
            self._on_connect(self)

    def data_received(self, data: bytes) -> None:  # noqa: D102
        self.bytes_in += len(data)
        if self._tls is not None:
            self._tls_in.write(data)
            if self._handshake is not None:
                self._step_handshake()
            else:
                self._read_tls()
            return
        self._plain_received(data)

    def _plain_received(self, data: bytes) -> None:
        self._buf.append(data)
        if self._on_frame is not None:
            if not self._frames_deferred:
                self._parse_frames()
            return
        if len(self._buf) >= self._wanted:
            self._wake()
        if not self._reading_paused and len(self._buf) > max(_READ_HIGH_WATER, self._wanted):
            self._reading_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def eof_received(self) -> bool:  # noqa: D102
        self._eof = True
        self._wake()
        self._fail_handshake(ConnectionResetError("connection closed during the TLS handshake"))
        self._frames_ended(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self._eof = True
        self._exc = exc
        self._wake()
        self._fail_handshake(ConnectionResetError("connection closed during the TLS handshake"))
        self._frames_ended(exc)
        while self._drain_waiters:
            waiter = self._drain_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("connection lost"))
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:  # noqa: D102
        self._writing_paused = True

    def resume_writing(self) -> None:  # noqa: D102
        self._writing_paused = False
        while self._drain_waiters:
            waiter = self._drain_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    # --- reading ------------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait_data(self, wanted: int) -> None:
        self._wanted = wanted
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
            self._wanted = 0

    def _consumed(self) -> None:
        if self._reading_paused and len(self._buf) <= _READ_HIGH_WATER // 2:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    async def read_exactly(self, n: int) -> bytes:
        """Exactly n bytes; IncompleteReadError if the stream ends first."""
        while len(self._buf) < n:
            if self._eof:
                raise asyncio.IncompleteReadError(self._buf.take_all(), n)
            await self._wait_data(n)
        data = self._buf.take(n)
        self._consumed()
        return data

    async def read_some(self, limit: int = 256 * 1024) -> bytes:
        """Whatever is buffered (up to limit), waiting for at least one byte; b"" at EOF."""
        while not self._buf:
            if self._eof:
                return b""
            await self._wait_data(1)
        data = self._buf.take(min(limit, len(self._buf)))
        self._consumed()
        return data

    @property
    def writing_paused(self) -> bool:
        """True while the transport's write buffer is over its high-water mark."""
        return self._writing_paused

    @property
    def buffered(self) -> int:
        """Bytes received and not yet read."""
        return len(self._buf)

    @property
    def unsent(self) -> int:
        """Bytes written and still in the transport's buffer (not yet taken by the kernel)."""
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    @property
    def at_eof(self) -> bool:
        """True once the other side closed and the buffer is drained."""
        return self._eof and not self._buf

    # --- frame mode ---------------------------------------------------------------------------

    def start_frames(self, on_frame: Callable[[Frame], None],
                     on_end: Callable[[str, BaseException | None], None]) -> None:
        """Deliver each complete frame to on_frame(frame) as it arrives; on_end(cause, exc) once
        when the stream ends ("eof", "truncated frame", "malformed frame", or the error)."""
        self._on_frame, self._on_end = on_frame, on_end
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        self._parse_frames()  # frames that arrived with the handshake's last read
        if self._eof:
            self._frames_ended(self._exc)

    def stop_frames(self) -> None:
        """Stop delivering frames (the link is closing)."""
        self._on_frame = None
        self._on_end = None

    def _parse_frames(self, budget: int | None = FRAMES_PER_TURN) -> None:
        """Deliver the complete frames in the buffer, at most `budget` of them now (None: all)."""
        buf = self._buf
        try:
            while self._on_frame is not None and len(buf) >= PREFIX_LEN:
                if budget is not None:
                    if budget == 0:
                        self._defer_frames()
                        return
                    budget -= 1
                prefix = self._prefix
                if prefix is None:
                    prefix = self._prefix = decode_prefix(buf.peek(PREFIX_LEN))
                if len(buf) < PREFIX_LEN + prefix.header_len + prefix.payload_len:
                    return
                # The frame's bytes leave the buffer before they are decoded: a bad header closes
                # the link either way, and nothing decoded can refer back into the buffer.
                buf.skip(PREFIX_LEN)
                header = buf.take(prefix.header_len)
                payload = buf.take(prefix.payload_len)
                self._prefix = None
                frame = decode_parts(prefix, header, payload)
                self._on_frame(frame)
        except ProtocolError as exc:
            self._end_frames("malformed frame", exc)

    def _defer_frames(self) -> None:
        """Leave the rest of the buffer to the next loop iteration; read nothing more until then."""
        if self._frames_deferred:
            return
        self._frames_deferred = True
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        self._loop.call_soon(self._deferred_frames)

    def _deferred_frames(self) -> None:
        self._frames_deferred = False
        self._parse_frames()
        if not self._frames_deferred and self._reading_paused and self._on_frame is not None:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    def _frames_ended(self, exc: BaseException | None) -> None:
        if self._on_end is None:
            return
        self._parse_frames(None)  # complete frames that were waiting for their turn come first
        if self._on_end is None:
            return  # a frame closed the link
        if self._buf:
            self._end_frames("truncated frame", ProtocolError(
                f"truncated frame ({len(self._buf)} bytes of an incomplete frame before the end)"))
        else:
            self._end_frames("eof" if exc is None else f"{type(exc).__name__}: {exc}", exc)

    def _end_frames(self, cause: str, exc: BaseException | None) -> None:
        on_end = self._on_end
        self.stop_frames()
        if on_end is not None:
            on_end(cause, exc)

    # --- writing ------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue bytes (never blocks); call drain() to respect back-pressure."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("connection is closed")
        self.bytes_out += len(data)
        if self._tls is not None:
            self._tls_write((data,))
        else:
            self.transport.write(data)

    def writelines(self, parts: list[bytes]) -> None:
        """Queue several buffers as one write (a frame is never interleaved with another)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("connection is closed")
        self.bytes_out += sum(len(p) for p in parts)
        if self._tls is not None:
            self._tls_write(parts)
        else:
            self.transport.writelines(parts)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("connection is closed")
        if self._writing_paused:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    # --- lifecycle ----------------------------------------------------------------------------

    # --- TLS ----------------------------------------------------------------------------------
    # OpenSSL over memory BIOs, driven from data_received: the same crypto as asyncio's
    # start_tls, without its general-purpose state machine on every record (that machinery was
    # most of what a TLS link cost over plain TCP per round trip). Records are length-delimited
    # frames, so a truncated stream shows as a truncated frame; close() still sends close_notify.

    async def start_tls(self, ctx: ssl.SSLContext, *, server_side: bool,
                        server_hostname: str | None = None) -> None:
        """Run the TLS handshake in the given role over this stream (the buffer must be empty)."""
        if self._buf:
            raise ConnectionError("unexpected bytes before the TLS handshake")
        if self.transport is None or self.transport.is_closing() or self._eof:
            raise ConnectionResetError("connection closed before the TLS handshake")
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        self._tls = ctx.wrap_bio(self._tls_in, self._tls_out, server_side=server_side,
                                 server_hostname=None if server_side else server_hostname)
        self._handshake = self._loop.create_future()
        self._step_handshake()
        try:
            async with asyncio.timeout(const.HANDSHAKE_TIMEOUT_S):
                await self._handshake
        except BaseException:
            self.abort()
            raise
        finally:
            self._handshake = None
        self._read_tls()  # application data that arrived with the handshake's last flight

    def _step_handshake(self) -> None:
        assert self._tls is not None and self._handshake is not None
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._flush_tls()
            return
        except ssl.SSLError as exc:
            self._flush_tls()  # the alert tells the peer why
            self._fail_handshake(exc)
            return
        self._flush_tls()
        if not self._handshake.done():
            self._handshake.set_result(None)

    def _fail_handshake(self, exc: BaseException) -> None:
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(exc)

    def _flush_tls(self) -> None:
        data = self._tls_out.read()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _tls_write(self, parts: list[bytes] | tuple[bytes, ...]) -> None:
        assert self._tls is not None
        try:
            for part in parts:
                self._tls.write(part)
        except ssl.SSLError as exc:
            raise ConnectionResetError(f"TLS write failed: {exc}") from exc
        self._flush_tls()

    def _read_tls(self) -> None:
        tls = self._tls
        assert tls is not None
        chunks: list[bytes] = []
        ended: BaseException | None = None
        closed = False
        try:
            while True:
                chunk = tls.read(262144)
                if not chunk:
                    closed = True
                    break
                chunks.append(chunk)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            closed = True  # close_notify: a clean end
        except ssl.SSLError as exc:
            ended = exc
        if self._tls_out.pending:
            self._flush_tls()  # e.g. a KeyUpdate answer
        for chunk in chunks:
            self._plain_received(chunk)
        if ended is not None:
            self._exc = ended
            self._eof = True
            self._wake()
            self._frames_ended(ended)
            self.abort()
        elif closed and not self._eof:
            self.eof_received()

    def extra(self, name: str) -> Any:
        """Transport extra info (peername, sockname, ssl_object)."""
        if name == "ssl_object":
            return self._tls
        return None if self.transport is None else self.transport.get_extra_info(name)

    def close(self) -> None:
        """Close gracefully (flushes what is queued; TLS sends close_notify first)."""
        if self.transport is None or self.transport.is_closing():
            return
        if self._tls is not None and self._handshake is None:
            try:
                self._tls.unwrap()
            except (ssl.SSLError, ValueError):
                pass  # SSLWantReadError: our close_notify is written; we do not wait for theirs
            self._flush_tls()
        self.transport.close()

    def abort(self) -> None:
        """Close now, dropping what is queued."""
        if self.transport is not None:
            self.transport.abort()


async def open_stream(host: str, port: int, *, timeout_s: float | None = None) -> Stream:
    """Dial a TCP stream."""
    loop = asyncio.get_running_loop()
    _, protocol = await asyncio.wait_for(
        loop.create_connection(Stream, host, port), timeout_s or const.CONNECT_TIMEOUT_S
    )
    return protocol
