"""Peer addresses as text: "host:port" / "[v6]:port"."""

from __future__ import annotations

import ipaddress


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
