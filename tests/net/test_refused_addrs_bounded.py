"""The addresses a node dialled and was refused at are bounded (2026-12-07).

Seen: `Membership.refused_addrs` kept every address this node dialled and was refused by (another
swarm's node on a LAN with churn, a relay listing stale peers) for the whole run. It keeps the
REFUSED_ADDRS_MAX most recently refused now; a bootstrap at a recently refused address is still
left alone, one whose refusal was forgotten is dialled again.

Real PeerManagers on 127.0.0.1: one in the test swarm, strangers each in a swarm of its own."""

from __future__ import annotations

import pytest

from node import const
from node.errors import NotAMember
from node.net import Swarm, write_swarm_file

from .util import addr, wait_until


async def test_refused_addresses_stay_bounded_and_a_recent_refusal_is_still_honoured(
        make_manager, fast_net, tmp_path, monkeypatch):
    monkeypatch.setattr(const, "REFUSED_ADDRS_MAX", 2)
    node = await make_manager("node")
    strangers = []
    for i in range(4):
        data_dir = tmp_path / f"stranger{i}"
        data_dir.mkdir()
        write_swarm_file(data_dir, Swarm.create())  # a swarm of its own: it and `node` refuse each other
        strangers.append(await make_manager(data_dir.name))
    refused = node.membership.refused_addrs
    for stranger in strangers:
        with pytest.raises(NotAMember):
            await node.async_connect(addr(stranger))
        assert addr(stranger) in refused
        assert len(refused) <= 2
    assert list(refused) == [addr(s) for s in strangers[-2:]]  # the least recently refused went first
    # the most recent refusal still holds: as a bootstrap it is not dialled; the forgotten one is
    recent, forgotten = strangers[-1], strangers[0]
    assert node.membership.refusals[recent.node_id].count == 1
    node.discovery.dialer.add_target(addr(recent), "bootstrap")
    rounds = node.discovery.dialer.rounds
    await wait_until(lambda: node.discovery.dialer.rounds >= rounds + 10, what="ten dial rounds")
    assert node.membership.refusals[recent.node_id].count == 1  # not dialled again
    node.discovery.dialer.add_target(addr(forgotten), "bootstrap")
    await wait_until(lambda: node.membership.refusals[forgotten.node_id].count >= 2,
                     what="the forgotten address dialled (and refused) again")
    assert len(refused) <= 2
