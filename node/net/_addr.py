"""Peer addresses as text ("host:port" / "[v6]:port"), and where the peer listener binds."""

from __future__ import annotations

import ipaddress
import socket

from node.config import NodeConfig


def parse_addr(addr: str) -> tuple[str, int]:
    """Split "host:port" / "[v6]:port"; ValueError on a malformed address."""
    if addr.startswith("["):
        host, _, rest = addr[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, sep, port = addr.rpartition(":")
        if not sep:
            raise ValueError(f"address {addr!r} has no port")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"malformed address {addr!r}")
    return host, int(port)


def format_addr(host: str, port: int) -> str:
    """"host:port", bracketing IPv6 literals."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_where(config: NodeConfig) -> dict:
    """create_server's arguments for the peer listener. `::` is one dual-stack socket: asyncio makes
    an IPv6 socket IPv6-only, and a node with `peer_host = "::"` announced its IPv4 addresses (mDNS,
    HELLO, invites) while refusing every IPv4 connection (2026-12-06). SO_REUSEADDR is asyncio's
    (and create_server's) choice: POSIX only; on Windows it would let a second node bind the same
    port (no "cannot listen for peers" error; connections reach either)."""
    if config.peer_host != "::" or not socket.has_dualstack_ipv6():
        return {"host": config.peer_host or None, "port": config.effective_peer_port}
    return {"sock": socket.create_server(("::", config.effective_peer_port), family=socket.AF_INET6,
                                         dualstack_ipv6=True, reuse_port=False)}
