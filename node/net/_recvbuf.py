"""The receive buffer of a stream: a queue of immutable chunks, never resized in place.

A `bytearray` that is trimmed as frames are taken (`del buf[:n]`, `buf.clear()`) raises
`BufferError` while any view into it is alive — and views outlive their code in ways no reviewer
sees: a sampled Python frame (the loop watchdog reads the loop thread's stack), a profiler, a
traceback kept by a log record. One such view killed healthy links under load (issue 12). Here the
chunks are `bytes`, which cannot be resized, so a view that someone keeps pins memory at worst;
every consumer gets fresh `bytes` (one copy at most, none when a read is exactly one chunk).
"""

from __future__ import annotations

import collections


class RecvBuffer:
    """Bytes received and not yet consumed."""

    __slots__ = ("_chunks", "_offset", "_len")

    def __init__(self) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._offset = 0  # consumed bytes of the first chunk
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes (copied unless they already are immutable `bytes`)."""
        if not data:
            return
        if type(data) is not bytes:
            data = bytes(data)
        self._chunks.append(data)
        self._len += len(data)

    def peek(self, n: int) -> bytes:
        """The first n bytes (n <= len), left in the buffer."""
        first = self._chunks[0]
        off = self._offset
        if len(first) - off >= n:
            return first[off:off + n]
        return self._gather(n)

    def take(self, n: int) -> bytes:
        """Remove and return the first n bytes (n <= len)."""
        if n <= 0:
            return b""
        if n > self._len:
            raise ValueError(f"take({n}) from a buffer of {self._len} bytes")
        first = self._chunks[0]
        off = self._offset
        avail = len(first) - off
        if n > avail:
            out = self._gather(n)
            self.skip(n)
            return out
        if n == avail:
            out = first if off == 0 else first[off:]
            self._chunks.popleft()
            self._offset = 0
        else:
            out = first[off:off + n]
            self._offset = off + n
        self._len -= n
        return out

    def take_all(self) -> bytes:
        """Everything buffered."""
        return self.take(self._len)

    def skip(self, n: int) -> None:
        """Drop the first n bytes (n <= len)."""
        while n > 0:
            first = self._chunks[0]
            avail = len(first) - self._offset
            if n < avail:
                self._offset += n
                self._len -= n
                return
            self._chunks.popleft()
            self._offset = 0
            self._len -= avail
            n -= avail

    def clear(self) -> None:
        """Drop everything."""
        self._chunks.clear()
        self._offset = 0
        self._len = 0

    def _gather(self, n: int) -> bytes:
        """The first n bytes when they span several chunks: one copy, through views of the
        (immutable) chunks, released at once."""
        parts: list[memoryview] = []
        need, off = n, self._offset
        for chunk in self._chunks:
            piece = memoryview(chunk)[off:off + need]
            parts.append(piece)
            need -= len(piece)
            off = 0
            if need == 0:
                break
        out = b"".join(parts)
        for piece in parts:
            piece.release()
        return out
