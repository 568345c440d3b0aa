"""`peer_host = "::"` listens on IPv4 and IPv6 (real managers on loopback, real TLS).

asyncio makes an IPv6 listening socket IPv6-only, so a node configured with "::" refused every
IPv4 connection while mDNS, HELLO and invites announced only IPv4 addresses: nobody could dial it
(2026-12-06)."""

from __future__ import annotations

import socket

import pytest

from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no dual-stack IPv6 here")


def _linked(x, y) -> bool:
    peer = x.peer(y.node_id)
    return bool(peer and peer.state == "connected")


async def test_a_node_listening_on_v6_any_is_reached_over_ipv4_and_ipv6(make_manager, fast_net):
    a = await make_manager("a", peer_host="::")
    assert f"127.0.0.1:{a.listen_port}" in a.listen_addrs  # what it tells peers is IPv4
    b = await make_manager("b", bootstrap=[f"127.0.0.1:{a.listen_port}"])
    await wait_until(lambda: _linked(a, b) and _linked(b, a), 20, 0.05, "b to reach a over IPv4")
    c = await make_manager("c", peer_host="::1", bootstrap=[f"[::1]:{a.listen_port}"])
    await wait_until(lambda: _linked(a, c) and _linked(c, a), 20, 0.05, "c to reach a over IPv6")


async def test_an_ipv4_peer_of_a_dual_stack_node_is_recorded_as_ipv4(make_manager, fast_net):
    """A dual-stack socket sees an IPv4 peer as ::ffff:a.b.c.d: that spelling went into the peer's
    addresses, peers.json and PEX, and loopback checks missed it (found in review)."""
    a = await make_manager("a", peer_host="::")
    b = await make_manager("b", bootstrap=[f"127.0.0.1:{a.listen_port}"])
    await wait_until(lambda: _linked(a, b) and _linked(b, a), 20, 0.05, "b to reach a over IPv4")
    rec = a.table.get(b.node_id)
    assert rec.link.address.startswith("127.0.0.1:"), rec.link.address
    await wait_until(lambda: rec.addrs, 20, 0.05, "b's announced address")
    assert not any("ffff" in addr for addr in rec.addrs), rec.addrs
