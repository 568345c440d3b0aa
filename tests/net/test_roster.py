"""The roster: the members a node has linked with, kept in swarm.json. A device lost long ago has
left the peer table (PEER_FORGET_S after it went); `swarm remove` still finds it by its short id in
the roster, and `swarmllm swarm` lists the members with when they were last linked (before, the
full id appeared nowhere, and only a forced rotation by a made-up id could lock such a device out)."""

from __future__ import annotations

import json

import pytest

from node import const
from node.net import PeerManager, load_or_create_identity
from node.net._membership import SWARM_FILE, MembershipState

from .util import addr, wait_until


def linked(x, y) -> bool:
    return x.link(y.node_id) is not None and y.link(x.node_id) is not None


def on_disk(manager: PeerManager) -> MembershipState:
    return MembershipState.from_json(json.loads((manager.config.data_dir / SWARM_FILE).read_text()))


async def test_a_member_gone_from_the_peer_table_is_removed_by_its_short_id(make_manager, fast_net, monkeypatch):
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    lost = await make_manager("lost", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b) and linked(a, lost), what="a linked with b and the soon lost device")
    await wait_until(lambda: lost.node_id in on_disk(a).members, what="the roster written to swarm.json")
    members = {m["node_id"]: m for m in a.swarm_ops.status()["members"]}
    assert members[lost.node_id]["connected"] and members[lost.node_id]["peer"] == lost.node_id[:8]
    assert b.node_id in members
    await lost.async_stop()  # the laptop is stolen: it never comes back
    monkeypatch.setattr(const, "PEER_FORGET_S", 0.2)
    await wait_until(lambda: a.table.get(lost.node_id) is None, what="the peer table forgot it")
    status = {m["node_id"]: m for m in a.swarm_ops.status()["members"]}
    assert not status[lost.node_id]["connected"] and status[lost.node_id]["last_linked_s_ago"] >= 0
    assert await a.swarm_ops.async_remove(lost.node_id[:8]) == 1  # b got the new secret
    assert lost.node_id in a.membership.state.removed and a.membership.swarm.epoch == 1
    await wait_until(lambda: b.membership.swarm.epoch == 1, what="b adopted the rotation")
    # gone from the roster (on disk too), kept as removed
    assert lost.node_id not in {m["node_id"] for m in a.swarm_ops.status()["members"]}
    await wait_until(lambda: lost.node_id not in on_disk(a).members and lost.node_id in on_disk(a).removed,
                     what="swarm.json updated")


async def test_the_roster_survives_a_restart_and_a_join_elsewhere_clears_it(make_manager, fast_net):
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b), what="a and b linked")
    await wait_until(lambda: b.node_id in on_disk(a).members, what="the roster written")
    await a.async_stop()
    again = PeerManager(a.config, load_or_create_identity(a.config.data_dir))
    await again.async_start()
    try:
        assert b.node_id in {m["node_id"] for m in again.swarm_ops.status()["members"]}
        await again.swarm_ops.async_leave()  # another swarm: its members are not ours
        assert again.swarm_ops.status()["members"] == []
        assert on_disk(again).members == {}
    finally:
        await again.async_stop()


async def _both_away_and_forgotten(make_manager, monkeypatch, linked_since: float | None = None):
    """a linked with b and c (in a's roster since `linked_since`, if given), then b and c gone and
    a's peer table past forgetting them: only the roster knows them."""
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    c = await make_manager("c", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b) and linked(a, c), what="a linked with b and c")
    if linked_since is not None:
        for member in (b, c):
            a.membership.state.members[member.node_id] = linked_since
    await b.async_stop()
    await c.async_stop()
    monkeypatch.setattr(const, "PEER_FORGET_S", 0.2)
    await wait_until(lambda: a.table.get(b.node_id) is None and a.table.get(c.node_id) is None,
                     what="the peer table forgot both")
    return a, b, c


async def test_a_removal_is_refused_while_only_the_roster_knows_the_members_away(make_manager, fast_net, monkeypatch):
    """The self-cut-off guard counts the roster's recent members too: with b and c away long enough
    for the peer table to forget them, removing c would hand the new secret to no one and leave a
    (not c) outside the swarm when b comes back."""
    from node.errors import InvalidRequest

    a, b, c = await _both_away_and_forgotten(make_manager, monkeypatch)
    with pytest.raises(InvalidRequest) as refused:  # no member to hand the new secret to
        await a.swarm_ops.async_remove(c.node_id[:8])
    message = refused.value.message
    assert "no other member is connected" in message and b.node_id[:8] in message, message
    assert a.membership.swarm.epoch == 0
    # a roster member not linked for ROSTER_AWAY_S is long gone: it no longer blocks the removal
    monkeypatch.setattr(const, "ROSTER_AWAY_S", 0.0)
    assert await a.swarm_ops.async_remove(c.node_id[:8]) == 0 and a.membership.swarm.epoch == 1


async def test_a_member_linked_for_weeks_then_gone_counts_as_away(make_manager, fast_net, monkeypatch):
    """The roster's time is when a member was last linked, not when its link came up: b, linked for
    8 days (an always-on desktop), then gone, still blocks a removal that would cut a off (review)."""
    import time

    from node.errors import InvalidRequest

    a, b, c = await _both_away_and_forgotten(make_manager, monkeypatch, linked_since=time.time() - 8 * 86400)
    with pytest.raises(InvalidRequest) as refused:  # b, gone minutes ago, is not gone for a week
        await a.swarm_ops.async_remove(c.node_id[:8])
    assert b.node_id[:8] in refused.value.message, refused.value.message
