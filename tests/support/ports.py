"""Loopback ports for nodes under test."""

from __future__ import annotations

import os
import random
import socket

from node import const

_handed_out: set[int] = set()  # ports given to nodes of this process that may not be listening yet


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux; 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """An API port free on 127.0.0.1 right now whose peer port (port + PEER_PORT_OFFSET, what a node
    listens on, on every address, when no --peer-port is given) is free too.

    Chosen below the ephemeral range: a port the kernel may give any outgoing connection meanwhile
    (between this check and the node's bind) made a node fail to start with "address already in
    use" now and then. Ports handed out earlier in this process are not handed out again."""
    low = _ephemeral_low()
    top = max(low - const.PEER_PORT_OFFSET - 1, 12000)
    bottom, top = _band(10000, top)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(bottom, top)
        peer = port + const.PEER_PORT_OFFSET
        if port in _handed_out or peer in _handed_out:
            continue
        if port_is_free(port) and port_is_free(peer, "0.0.0.0"):
            _handed_out.update((port, peer))
            return port
    raise RuntimeError("no free port pair found")


def _band(bottom: int, top: int) -> tuple[int, int]:
    """This test process's share of [bottom, top): under pytest-xdist each worker draws from its own
    band, so two workers never hand out one port pair in the moment before either node binds it."""
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    except ValueError:
        return bottom, top
    if count <= 1 or not 0 <= index < count:
        return bottom, top
    width = (top - bottom) // count
    # (less the peer port's offset at the top: a pair drawn at a band's edge stays inside it)
    return bottom + index * width, bottom + (index + 1) * width - const.PEER_PORT_OFFSET


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a new listener can bind the port on `host` (as the next node start would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
