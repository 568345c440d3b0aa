"""Announcements a stranger on the LAN makes up. The swarm's mDNS tag is public on the LAN (every
member announces it), so anyone there can copy it into announcements under made-up node ids with
addresses of its choosing: until 2026-12-07 each one became a peer record and a dial, without bound
(thousands of multicast packets, thousands of records and sockets, as PEX floods were before
PEX_MAX_UNLINKED), and a loopback address was dialled too: this machine's own services sent the
peer preamble, at a stranger's word (PEX learns loopback only from peers on this machine).
`Discovery._on_mdns_found` is what an announcement carrying our tag reaches (`_mdns.py`)."""

from __future__ import annotations

import secrets

from node import const
from tests.support.waiting import wait_until


async def test_a_stranger_s_announcements_never_make_this_node_dial_its_loopback(make_manager, fast_net):
    a = await make_manager("a")
    b = await make_manager("b")  # a member on this machine: its address is loopback
    fake = secrets.token_hex(32)
    a.discovery._on_mdns_found(fake, [f"127.0.0.1:{b.listen_port}"])  # noqa: SLF001
    a.discovery._on_mdns_found(b.node_id, [f"127.0.0.1:{b.listen_port}", "0.0.0.0:9", "224.0.0.251:9"])  # noqa: SLF001
    assert a.peer(fake) is None and a.peer(b.node_id) is None, [p.address for p in a.peers()]


async def test_made_up_announcements_hold_at_most_the_cap(make_manager, fast_net, monkeypatch):
    monkeypatch.setattr(const, "MDNS_MAX_UNLINKED", 16)
    a = await make_manager("a")
    b = await make_manager("b")
    for i in range(400):  # TEST-NET-1: connects hang, as a made-up LAN host's do
        a.discovery._on_mdns_found(secrets.token_hex(32), [f"192.0.2.{i % 250 + 1}:9"])  # noqa: SLF001
    assert len(a.peers()) <= 16, len(a.peers())
    # a member announcing itself later is still learnt and linked (a made-up one not being dialled
    # makes room), here at a LAN address standing in for its own: the link goes to where b listens
    monkeypatch.setattr(a.discovery.dialer, "dialing", lambda _node_id: False)
    a.discovery._on_mdns_found(b.node_id, [f"192.0.2.77:{b.listen_port}"])  # noqa: SLF001
    assert a.peer(b.node_id) is not None and len(a.peers()) <= 16
    await a.async_connect(f"127.0.0.1:{b.listen_port}", b.node_id)
    await wait_until(lambda: a.peer(b.node_id).state == "connected", 10, "b linked")
