"""Invite codes: a short text that lets one device join this node's swarm, once.

    swarmllm1-<base32 of: version | token (16 B) | inviter node id prefix (8 B) | addresses | crc>

It carries a one-time token (not the swarm secret: the inviter hands the secret over the TLS link
to whoever presents the token first, before it expires) and how to reach the inviter: up to four
IPv4 "host:port" peer addresses, and the first 8 bytes of its node id, which the joiner checks
against the certificate it is shown (an address that now belongs to someone else gets nothing).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import struct
from dataclasses import dataclass

from node.errors import InvalidRequest

PREFIX = "swarmllm1-"
_VERSION = 1
_MAX_ADDRS = 4


@dataclass(frozen=True)
class InviteCode:
    token: bytes  # 16 bytes
    inviter_prefix: str  # 16 hex digits: the start of the inviter's node id
    addrs: tuple[str, ...]  # "a.b.c.d:port"

    def encode(self) -> str:
        """The code as text (lower-case base32, no padding)."""
        body = bytearray([_VERSION]) + self.token + bytes.fromhex(self.inviter_prefix)
        addrs = [a for a in self.addrs if _ipv4(a)][:_MAX_ADDRS]
        body.append(len(addrs))
        for addr in addrs:
            host, port = addr.rsplit(":", 1)
            body += ipaddress.IPv4Address(host).packed + struct.pack("!H", int(port))
        body += hashlib.sha256(body).digest()[:2]  # a mistyped code is refused here, not at the inviter
        return PREFIX + base64.b32encode(bytes(body)).decode().rstrip("=").lower()

    @classmethod
    def decode(cls, text: str) -> InviteCode:
        """Parse a code; InvalidRequest (naming the problem) if it is not one."""
        text = "".join(text.split()).lower()
        if not text.startswith(PREFIX):
            raise InvalidRequest(f"an invite code starts with {PREFIX}", param="code")
        payload = text[len(PREFIX):].upper()
        try:
            body = base64.b32decode(payload + "=" * (-len(payload) % 8))
        except ValueError as exc:
            raise InvalidRequest("the invite code is garbled (not base32)", param="code") from exc
        if len(body) < 1 + 16 + 8 + 1 + 2 or hashlib.sha256(body[:-2]).digest()[:2] != body[-2:]:
            raise InvalidRequest("the invite code is garbled (checksum)", param="code")
        if body[0] != _VERSION:
            raise InvalidRequest(f"invite code version {body[0]} is not supported here", param="code")
        token, prefix, n = body[1:17], body[17:25].hex(), body[25]
        rest = body[26:-2]
        if n > _MAX_ADDRS or len(rest) != 6 * n:
            raise InvalidRequest("the invite code is garbled (addresses)", param="code")
        addrs = tuple(f"{ipaddress.IPv4Address(rest[i:i + 4])}:{struct.unpack('!H', rest[i + 4:i + 6])[0]}"
                      for i in range(0, len(rest), 6))
        return cls(bytes(token), prefix, addrs)


def _ipv4(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    try:
        ipaddress.IPv4Address(host)
        return port.isdigit() and 0 < int(port) < 65536
    except ValueError:
        return False
