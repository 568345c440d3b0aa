"""The plaintext preamble that opens every connection to a peer port.

    "SWARMLLM"  8 bytes   tells our connections from anything else on the port (HTTP, scanners)
    kind        1 byte    T = TLS peer link, C = relay: connect me to a node, A = relay: I accept
                          circuit X, k = reply
    length      u32       JSON body length (≤ const.PREAMBLE_MAX_BYTES)
    body        JSON object

Every preamble is answered by a `k` reply ({"ok": true} or {"ok": false, "error": ...}) before
anything else is sent, so the bytes after it (the TLS ClientHello, or a spliced relay stream)
never sit in a buffer that the next stage cannot see. A first byte that diverges from the magic
is rejected at once (`NotSwarmPeer`), without waiting for more.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from typing import Any

from node import const
from node.errors import PeerError, ProtocolError
from node.values import PEER_JSON_DEPTH, loads_bounded

from ._messages import NotSwarmPeer
from ._stream import Stream

MAGIC = b"SWARMLLM"
_HEAD = struct.Struct("!8scI")
HEAD_LEN = _HEAD.size  # 13
KIND_TLS = b"T"
KIND_CONNECT = b"C"
KIND_ACCEPT = b"A"
KIND_REPLY = b"k"
KINDS = (KIND_TLS, KIND_CONNECT, KIND_ACCEPT, KIND_REPLY)
PREAMBLE_VERSION = 1


def encode_preamble(kind: bytes, body: dict[str, Any]) -> bytes:
    """Wire bytes of one preamble."""
    data = json.dumps(body, separators=(",", ":")).encode()
    return _HEAD.pack(MAGIC, kind, len(data)) + data


def _describe(first: bytes) -> str:
    """A short printable view of unexpected first bytes (what spoke: HTTP, TLS, garbage)."""
    if first[:1] == b"\x16":
        return "tls"
    if first[:4] in (b"GET ", b"POST", b"HEAD", b"PUT ", b"HTTP", b"OPTI", b"DELE", b"PATC"):
        return "http"
    return repr(first[:16])


async def read_preamble(stream: Stream) -> tuple[bytes, dict[str, Any]]:
    """Read and validate one preamble; NotSwarmPeer as soon as the magic diverges."""
    got = b""
    while len(got) < HEAD_LEN:
        chunk = await stream.read_some(HEAD_LEN - len(got))
        if not chunk:
            if got and not MAGIC.startswith(got[: len(MAGIC)]):
                raise NotSwarmPeer(f"first bytes {_describe(got)} are not a SwarmLLM preamble",
                                   agent=_describe(got))
            raise asyncio.IncompleteReadError(got, HEAD_LEN)
        got += chunk
        if not MAGIC.startswith(got[: len(MAGIC)]):
            raise NotSwarmPeer(f"first bytes {_describe(got)} are not a SwarmLLM preamble",
                               agent=_describe(got))
    _, kind, length = _HEAD.unpack(got)
    if kind not in KINDS:
        raise ProtocolError(f"unknown preamble kind {kind!r}")
    if length > const.PREAMBLE_MAX_BYTES:
        raise ProtocolError(f"preamble body too large: {length} bytes")
    raw = await stream.read_exactly(length)
    try:
        body = loads_bounded(raw, PEER_JSON_DEPTH)
    except ValueError as exc:  # not UTF-8 or not JSON, nested too deeply, an integer past 4300 digits
        raise ProtocolError(f"preamble body is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(body, dict):
        raise ProtocolError("preamble body is not a JSON object")
    return kind, body


def send_reply(stream: Stream, ok: bool = True, error: str | None = None, **extra: Any) -> None:
    """Answer a preamble."""
    body: dict[str, Any] = {"ok": ok, **extra}
    if error:
        body["error"] = error
    stream.write(encode_preamble(KIND_REPLY, body))


async def read_reply(stream: Stream) -> dict[str, Any]:
    """Read the answer to our preamble; PeerError when it says no."""
    kind, body = await read_preamble(stream)
    if kind != KIND_REPLY:
        raise ProtocolError(f"expected a preamble reply, got kind {kind!r}")
    if body.get("ok") is not True:
        raise PeerError(f"peer refused: {body.get('error', 'no reason given')}",
                        code=str(body.get("error") or "refused")[:64])
    return body


def tls_preamble(cert_der: bytes) -> bytes:
    """Preamble of a TLS peer link: announces the certificate the dialler will present."""
    return encode_preamble(KIND_TLS, {"v": PREAMBLE_VERSION, "cert": base64.b64encode(cert_der).decode()})


def announced_cert(body: dict[str, Any]) -> bytes:
    """The certificate a TLS preamble announces."""
    cert = body.get("cert")
    if not isinstance(cert, str) or len(cert) > const.PREAMBLE_MAX_BYTES:
        raise ProtocolError("TLS preamble carries no certificate")
    try:
        der = base64.b64decode(cert, validate=True)
    except ValueError as exc:
        raise ProtocolError("TLS preamble certificate is not base64") from exc
    if len(der) < 64:
        raise ProtocolError("TLS preamble certificate is too short")
    return der
