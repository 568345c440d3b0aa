"""One member cannot take a relay's circuits from the others (real relay and managers on loopback).

Until 2026-12-06 tickets were free and only the relay-wide cap (RELAY_MAX_CIRCUITS) counted, so a
single member could open every circuit (to itself, even) and each other member's dial through that
relay failed with `too_many_circuits`.
"""

from __future__ import annotations

import pytest

from node import const
from node.errors import PeerError
from node.net._connect import async_dial_relayed
from tests.support.waiting import wait_until

from .util import addr

PER_MEMBER = 4  # more than a member's own links to its two peers need


async def test_one_member_cannot_hold_all_circuits(make_manager, fast_net, monkeypatch):
    monkeypatch.setattr(const, "RELAY_MAX_CIRCUITS_PER_MEMBER", PER_MEMBER, raising=False)
    r = await make_manager("r", relay=True)
    a = await make_manager("a", relays=[addr(r)])  # the greedy member
    b = await make_manager("b", relays=[addr(r)])
    c = await make_manager("c", relays=[addr(r)])
    await wait_until(lambda: all(r.relay.registrations.get(m.node_id) is not None for m in (a, b, c))
                     and all(addr(r) in m.discovery.registered_relays() for m in (a, b, c)),
                     what="a, b and c registered at the relay")
    with pytest.raises(PeerError, match="self_circuit"):  # a ticket to oneself is refused
        await a.discovery.relays.async_ticket(addr(r), a.node_id)
    # a takes tickets until the relay refuses it: no more than its share
    tickets: list[str] = []
    refused = None
    for _ in range(const.RELAY_MAX_CIRCUITS + 1):
        try:
            tickets.append(await a.discovery.relays.async_ticket(addr(r), b.node_id))
        except PeerError as exc:
            refused = exc
            break
    assert refused is not None and "too_many_circuits" in str(refused), (len(tickets), refused)
    assert len(tickets) <= PER_MEMBER
    # the tickets a did get open circuits (a ticket counts until used, then its circuit counts)
    for ticket in tickets:
        stream = await async_dial_relayed(a.tls, addr(r), b.node_id, a.node_id, ticket)
        stream.close()
    # c still gets a circuit to b through the relay
    ticket = await c.discovery.relays.async_ticket(addr(r), b.node_id)
    stream = await async_dial_relayed(c.tls, addr(r), b.node_id, c.node_id, ticket)
    stream.close()
