"""Loopback ports for nodes under test."""

from __future__ import annotations

import socket

from node import const


def free_port() -> int:
    """An API port free on 127.0.0.1 right now whose peer port (port + PEER_PORT_OFFSET, what a node
    listens on when no --peer-port is given) is free too."""
    for _ in range(100):
        with socket.socket() as s1:
            s1.bind(("127.0.0.1", 0))
            port = s1.getsockname()[1]
        if port + const.PEER_PORT_OFFSET > 65535:
            continue
        if port_is_free(port + const.PEER_PORT_OFFSET):
            return port
    raise RuntimeError("no free port pair found")


def port_is_free(port: int) -> bool:
    """True when a new listener can bind the port on 127.0.0.1 (as the next node start would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
