"""A request body's Content-Encoding undone here, off the loop and bounded, not by aiohttp.

aiohttp decompressed a body on the loop as it arrived (`auto_decompress`) in chunks of up to the
body limit: a 1 MB gzip body of 1 GB of spaces (a "zip bomb", or an SDK compressing a large prompt)
stalled the node's loop ~0.6 s per chunk, 2.5 s in all, before the 413, even on a request refused for
its Host. The API's server now takes bodies as sent (`auto_decompress=False`); read_json reads the
compressed bytes (at most max_request_body_bytes) and calls `decode_content` in an executor, which
stops at the limit."""

from __future__ import annotations

import zlib

from node.errors import InvalidRequest, PayloadTooLarge

# gzip and zlib-wrapped deflate: wbits 32 + 15 reads either header; deflate also as raw (some clients)
_WBITS = {"gzip": (47,), "x-gzip": (47,), "deflate": (47, -zlib.MAX_WBITS)}
IDENTITY = ("", "identity")
MAX_MEMBERS = 64  # gzip members in one body (a real client writes one)
_CHUNK = 64 * 1024


def decode_content(raw: bytes, encoding: str, limit_bytes: int) -> bytes:
    """The body decoded from `encoding` (gzip, x-gzip, deflate); PayloadTooLarge past `limit_bytes`,
    InvalidRequest when it is not in that encoding or the encoding is another one."""
    tries = _WBITS.get(encoding)
    if tries is None:
        raise InvalidRequest(f"request body could not be read: Content-Encoding {encoding[:40]!r} is not "
                             "supported (gzip, deflate or none)")
    error: zlib.error | None = None
    for wbits in tries:
        try:
            return _members(memoryview(raw), wbits, encoding, limit_bytes)
        except zlib.error as exc:
            error = exc
    raise InvalidRequest(f"request body could not be read: not {encoding} ({error})")


def _members(raw: memoryview, wbits: int, encoding: str, limit_bytes: int) -> bytes:
    """Decode gzip members one after another (RFC 1952; aiohttp took them), at most MAX_MEMBERS,
    the input fed in chunks so that what follows a member is never copied (a body of many tiny
    members cost time growing with the square of its size: 47 s for 8 MiB; found in review)."""
    out = bytearray()
    pos = 0
    for _ in range(MAX_MEMBERS):
        decoder = zlib.decompressobj(wbits)
        while not decoder.eof:
            if pos >= len(raw):
                raise InvalidRequest(f"request body could not be read: it is not one complete {encoding} stream")
            chunk = raw[pos:pos + _CHUNK]
            pos += len(chunk)
            out += decoder.decompress(chunk, limit_bytes + 1 - len(out))
            if len(out) > limit_bytes:  # (input left unread only when the output was cut here)
                raise PayloadTooLarge(f"request body is larger than {limit_bytes} bytes once decompressed")
        pos -= len(decoder.unused_data)  # the part of the last chunk after this member
        if pos >= len(raw):
            return bytes(out)
        if wbits < 0 or raw[pos:pos + 2] != b"\x1f\x8b":
            raise InvalidRequest(f"request body could not be read: bytes follow the {encoding} stream")
    raise InvalidRequest(f"request body could not be read: more than {MAX_MEMBERS} {encoding} members")
