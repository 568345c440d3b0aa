"""A relay that goes away and comes back, or has no room: its nodes use it again by themselves."""

from __future__ import annotations

import logging

from node import const
from tests.support.waiting import wait_until

from .util import addr


async def test_a_node_a_full_relay_refused_registers_once_there_is_room(make_manager, fast_net,
                                                                       monkeypatch, caplog):
    """A relay at RELAY_MAX_REGISTRATIONS refuses A with a reason A logs (WARNING, relay_full);
    A asks again while its link to the relay lasts and registers once a place is free. Before,
    A asked once and stayed unregistered (unreachable through that relay) until its link to the
    relay happened to drop."""
    caplog.set_level(logging.INFO, logger="node.net")
    monkeypatch.setattr(const, "RELAY_MAX_REGISTRATIONS", 1)
    monkeypatch.setattr(const, "RELAY_REGISTER_RETRY_S", 0.2, raising=False)
    r = await make_manager("r", relay=True)
    b = await make_manager("b", relays=[addr(r)], no_direct=True)
    await wait_until(lambda: b.node_id in r.relay.registrations, what="b registered")
    a = await make_manager("a", relays=[addr(r)], no_direct=True)
    refusals = lambda: [rec for rec in caplog.records  # noqa: E731
                        if "relay registration failed" in rec.getMessage() and "relay_full" in rec.getMessage()]
    await wait_until(refusals, what="a told the relay is full")
    assert addr(r) not in a.discovery.registered_relays()
    await b.async_stop()
    await wait_until(lambda: a.node_id in r.relay.registrations and addr(r) in a.discovery.registered_relays(),
                     timeout_s=10, what="a registered once b left")
    assert a.link(r.node_id) is not None
    assert refusals()[0].levelno == logging.WARNING  # a user sees why, once; the retries are DEBUG
