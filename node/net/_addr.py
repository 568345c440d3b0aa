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


def dialable(addr: str, from_loopback: bool) -> bool:
    """An address a peer (or an mDNS announcement) may have this node dial: an IP literal (a name resolves to whatever its
    owner likes, and `127.1` or `2130706433` are loopback to the resolver), not this machine's
    loopback unless the peer is on this machine too (a remote member had the node dial its own
    local services), never 0.0.0.0 / :: or a multicast or broadcast address."""
    try:
        ip = ipaddress.ip_address(parse_addr(addr)[0])
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return from_loopback
    return not (ip.is_unspecified or ip.is_multicast or (ip.version == 4 and str(ip) == "255.255.255.255"))


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
