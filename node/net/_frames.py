"""Wire frames: a fixed 24-byte prefix, a JSON header, raw payload bytes.

    magic  "SWRM"   4 bytes
    version         u8   (FRAME_VERSION)
    type            u8   (FrameType; unknown values decode fine and are answered with ERROR)
    flags           u16  (FLAG_RESPONSE marks a reply to the request with the same request id)
    request_id      u64  (0 = no reply expected)
    header_len      u32  (JSON object, UTF-8; 0 = empty header)
    payload_len     u32  (raw bytes: activations, token ids, ...)

All integers big-endian. Sizes are checked against `const.MAX_HEADER_BYTES` / `const.MAX_FRAME_BYTES`
before anything is allocated; a violation is a `ProtocolError`, which closes that link only.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from node import const
from node.errors import ProtocolError
from node.values import PEER_JSON_DEPTH, loads_bounded

MAGIC = b"SWRM"
FRAME_VERSION = 1
PREFIX = struct.Struct("!4sBBHQII")
PREFIX_LEN = PREFIX.size  # 24
FLAG_RESPONSE = 0x0001
MAX_REQUEST_ID = (1 << 64) - 1


class FrameType(enum.IntEnum):
    """Frame types. WORK..GENERATE_CANCEL belong to the distributed pipeline (node.inference)."""

    HELLO = 1
    ERROR = 2
    PING = 3
    PONG = 4
    PEX = 5
    RELAY = 6  # relay control: register / list / incoming circuit (see _relay.py)
    MEMBER = 7  # swarm membership: proof / join / welcome during set-up, rekey later (_admission.py)
    WORK = 16
    ACK = 17
    RESULT = 18
    CANCEL = 19
    SESSION_END = 20
    MODEL_HEADER = 21  # a model's GGUF header by sha256, in chunks (node.inference.swarm_models)
    GENERATE = 22  # remote generate: coordinator → a node holding the model whole (prompt ids + sampling)
    TOKENS = 23  # remote generate: holder → coordinator, token ids in batches, keepalives, the end
    GENERATE_CANCEL = 24  # remote generate: coordinator → holder, stop at the next token
    MODEL_PART = 25  # a partial model's tensor hashes and bytes, in chunks (node.inference.pipeline.partials)
    EMBED = 26  # remote embeddings: a node without the model → a holder of it whole (inputs' token ids)
    EMBEDDED = 27  # remote embeddings: holder → asker, keepalives, then the float32 vectors or an error
    EMBED_CANCEL = 28  # remote embeddings: asker → holder, the client went away


def type_name(frame_type: int) -> str:
    """Readable name of a frame type, including unknown ones."""
    try:
        return FrameType(frame_type).name
    except ValueError:
        return f"UNKNOWN({frame_type})"


@dataclass(frozen=True, slots=True)
class Frame:
    """One wire frame. `header` is a JSON object; `payload` is raw bytes."""

    type: int
    header: Mapping[str, Any] = field(default_factory=dict)
    payload: bytes = b""
    request_id: int = 0
    flags: int = 0

    def __post_init__(self) -> None:
        if not 0 <= int(self.type) <= 255:
            raise ValueError(f"frame type out of range: {self.type}")
        if not 0 <= self.request_id <= MAX_REQUEST_ID:
            raise ValueError(f"request id out of range: {self.request_id}")
        if not 0 <= self.flags <= 0xFFFF:
            raise ValueError(f"flags out of range: {self.flags}")
        if type(self.header) is not dict and not isinstance(self.header, Mapping):  # fast path first
            raise ValueError("frame header must be a mapping")
        if type(self.payload) is not bytes and not isinstance(self.payload, bytearray | memoryview):
            raise ValueError("frame payload must be bytes")

    @property
    def is_response(self) -> bool:
        """True for a reply to a request this side sent."""
        return bool(self.flags & FLAG_RESPONSE)

    def reply(self, frame_type: int, header: Mapping[str, Any] | None = None, payload: bytes = b"") -> Frame:
        """A response frame to this request (same request id, FLAG_RESPONSE)."""
        return Frame(frame_type, header or {}, payload, self.request_id, FLAG_RESPONSE)


_JOIN_BELOW_BYTES = 64 * 1024  # smaller payloads go out as one buffer: one TLS record, one write


def encode_frame(frame: Frame, request_id: int | None = None) -> list[bytes]:
    """Wire bytes of a frame: one buffer for small frames, [prefix+header, payload] for large ones
    (a large payload is not copied). request_id overrides the frame's (requests get fresh ids)."""
    header = json.dumps(frame.header, separators=(",", ":")).encode() if frame.header else b""
    payload = frame.payload
    if len(header) > const.MAX_HEADER_BYTES:
        raise ProtocolError(f"frame header too large: {len(header)} bytes")
    if len(payload) > const.MAX_FRAME_BYTES:
        raise ProtocolError(f"frame payload too large: {len(payload)} bytes")
    rid = frame.request_id if request_id is None else request_id
    prefix = PREFIX.pack(MAGIC, FRAME_VERSION, int(frame.type), frame.flags, rid, len(header), len(payload))
    if len(payload) < _JOIN_BELOW_BYTES:
        return [b"".join((prefix, header, payload))]
    return [prefix + header, payload]


def frame_bytes(frame: Frame) -> bytes:
    """The whole frame as one bytes object (tests, blocking clients)."""
    return b"".join(encode_frame(frame))


@dataclass(frozen=True, slots=True)
class Prefix:
    """The decoded fixed prefix of a frame."""

    type: int
    flags: int
    request_id: int
    header_len: int
    payload_len: int


def decode_prefix(data: bytes) -> Prefix:
    """Validate the 24-byte prefix (magic, version, sizes) before the body is read."""
    if len(data) != PREFIX_LEN:
        raise ProtocolError(f"truncated frame prefix ({len(data)} bytes)")
    magic, version, ftype, flags, rid, hlen, plen = PREFIX.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r}")
    if version != FRAME_VERSION:
        raise ProtocolError(f"unsupported frame version {version}")
    if hlen > const.MAX_HEADER_BYTES:
        raise ProtocolError(f"frame header too large: {hlen} bytes (max {const.MAX_HEADER_BYTES})")
    if plen > const.MAX_FRAME_BYTES:
        raise ProtocolError(f"frame payload too large: {plen} bytes (max {const.MAX_FRAME_BYTES})")
    return Prefix(ftype, flags, rid, hlen, plen)


def decode_body(prefix: Prefix, body: bytes) -> Frame:
    """Build the frame from its prefix and `header_len + payload_len` body bytes."""
    if len(body) != prefix.header_len + prefix.payload_len:
        raise ProtocolError("truncated frame body")
    body = bytes(body)  # no view into a caller's mutable buffer outlives this call
    return decode_parts(prefix, body[: prefix.header_len], body[prefix.header_len:])


def decode_parts(prefix: Prefix, header_bytes: bytes, payload: bytes) -> Frame:
    """Build the frame from its header and payload bytes. Both must be immutable `bytes` of
    their own (a Frame never refers into a receive buffer; see _recvbuf.py)."""
    header: Any = {}
    if prefix.header_len:
        try:
            header = loads_bounded(header_bytes, PEER_JSON_DEPTH)
        except ValueError as exc:  # not UTF-8 or not JSON, nested too deeply, an integer past 4300 digits
            raise ProtocolError(f"frame header is not JSON: {str(exc)[:200]}") from exc
        if not isinstance(header, dict):
            raise ProtocolError("frame header is not a JSON object")
    return Frame(prefix.type, header, payload if prefix.payload_len else b"", prefix.request_id, prefix.flags)


def decode_frame(data: bytes) -> Frame:
    """Decode one complete frame from bytes (tests, blocking clients)."""
    prefix = decode_prefix(data[:PREFIX_LEN])
    return decode_body(prefix, data[PREFIX_LEN:])
