"""A member's rekey frames listing made-up removed node ids (2026-12-07). Ids cost nothing to make
up, and a rekey that was not adopted (the sender's own current swarm sent back) still adds every id
it lists (a rotation merged after a tie-break is passed on so): two frames of 4,096 had this node hold
8,192 removals and pass them on, which every other member refused as malformed (a rekey carries at
most 4,096), closing its links to them; from then on none of this node's removals reached anyone, and
the set grew with every such frame. At most REMOVED_MAX removals are kept now (the lowest ids, an
order every member shares, so the members converge)."""

from __future__ import annotations

import secrets

from node.net import Frame, FrameType
from node.net._membership import REMOVED_MAX, bounded_removed
from tests.support.waiting import wait_until

from .util import addr


async def test_made_up_removals_neither_pile_up_nor_cut_honest_links(make_manager, fast_net, caplog):
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    c = await make_manager("c", bootstrap=[addr(a)])  # the member who turns hostile
    await wait_until(lambda: a.link(b.node_id) and a.link(c.node_id) and b.link(a.node_id), what="linked")
    ab = a.link(b.node_id)
    current = c.membership.swarm.to_json()  # not a rotation: the swarm as it is
    for _ in range(2):
        ids = [secrets.token_hex(32) for _ in range(REMOVED_MAX)]
        await c.link(a.node_id).async_send(Frame(FrameType.MEMBER, {"op": "rekey", "swarm": current, "removed": ids}))
    # a PING round trip after the two frames: a has handled them (frames on a link are handled in order)
    await c.link(a.node_id).async_request(Frame(FrameType.PING, {}), timeout_s=10)
    assert len(a.membership.state.removed) == REMOVED_MAX  # (the lowest ids kept; a member may remove anyone)
    assert not ab.closed.done() and a.link(b.node_id) is ab
    assert "malformed frame" not in caplog.text
    assert caplog.text.count("refusing a peer that is not in this swarm") == 0  # (made-up ids: never met)
    # rotations (a member may remove: each one is adopted) listing made-up ids: at most REMOVED_MAX kept,
    # and what this node passes on every member still accepts
    swarm = c.membership.swarm
    for _ in range(2):
        swarm = swarm.rotated()
        ids = [secrets.token_hex(32) for _ in range(REMOVED_MAX)]
        await c.link(a.node_id).async_send(Frame(FrameType.MEMBER, {"op": "rekey", "swarm": swarm.to_json(),
                                                                  "removed": ids}))
    await wait_until(lambda: a.membership.swarm.epoch == swarm.epoch and b.membership.swarm.epoch == swarm.epoch,
                     what="a and b on the last rotation")
    assert all(len(m.membership.state.removed) <= REMOVED_MAX for m in (a, b, c))
    await a.async_request(b.node_id, Frame(FrameType.PING, {}), timeout_s=10)  # a's link to b still carries
    assert not ab.closed.done() and "malformed frame" not in caplog.text


def test_removals_kept_are_bounded_the_same_on_every_member():
    old = {f"{i:064x}" for i in range(REMOVED_MAX)}
    new = {f"{i:064x}" for i in range(REMOVED_MAX, REMOVED_MAX + 10)}
    assert bounded_removed(old, new) == old  # the lowest ids, whoever merges them
    assert bounded_removed(new, old) == old
    kept = bounded_removed(old, {"f" * 64}, keep=frozenset({"f" * 64}))  # a removal made here holds
    assert len(kept) == REMOVED_MAX and "f" * 64 in kept
    assert bounded_removed(set(), {"a" * 64}) == {"a" * 64}


async def test_a_member_flooding_low_made_up_ids_can_still_be_removed(make_manager, fast_net):
    """Review r61: made-up ids lower than any real one filled every member's removed set; the user then
    removed the flooder, and the members the rotation was passed on to cut its id (not among the
    lowest REMOVED_MAX), kept its links and passed it the new secret. Ids a node knows go last now."""
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    c = await make_manager("c", bootstrap=[addr(a)])  # the member who turns hostile
    await wait_until(lambda: a.link(b.node_id) and a.link(c.node_id) and b.link(c.node_id) and c.link(b.node_id),
                     what="a full mesh")
    ids = [f"{i:064x}" for i in range(1, REMOVED_MAX + 1)]  # lower than any real id
    current = c.membership.swarm.to_json()
    for member in (a, b):
        await c.link(member.node_id).async_send(Frame(FrameType.MEMBER, {"op": "rekey", "swarm": current,
                                                                       "removed": ids}))
        await c.link(member.node_id).async_request(Frame(FrameType.PING, {}), timeout_s=10)
    assert len(b.membership.state.removed) == REMOVED_MAX
    await a.swarm_ops.async_remove(c.node_id)
    await wait_until(lambda: b.membership.swarm.epoch == a.membership.swarm.epoch, what="b on a's rotation")
    assert c.node_id in b.membership.state.removed and c.node_id in a.membership.state.removed
    await wait_until(lambda: b.link(c.node_id) is None, what="b's link to the removed member closed")
    assert c.membership.swarm.secret != a.membership.swarm.secret, "the removed member got the new secret"
