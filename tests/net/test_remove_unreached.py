"""`swarm remove` rotates the secret and hands it to the members linked now. Run on a node that is
linked to no other member while it knows some (they are away), the new secret reaches no one: this
node is the one cut off (every other member keeps the old secret, and the removed node with it).
That must be refused with a clear error, not reported as done ("went to 0 linked member(s)")."""

from __future__ import annotations

import pytest

from node.errors import InvalidRequest

from .util import addr, wait_until


def linked(x, y) -> bool:
    return x.link(y.node_id) is not None and y.link(x.node_id) is not None


async def test_a_removal_that_reaches_no_member_is_refused(make_manager, fast_net):
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    c = await make_manager("c", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b) and linked(a, c) and linked(b, c), what="a full mesh of three")
    await b.async_stop()  # b is away (asleep, offline); a still knows it
    await wait_until(lambda: a.link(b.node_id) is None, what="a's link to b gone")
    with pytest.raises(InvalidRequest, match="no other member"):
        await a.swarm_ops.async_remove(c.node_id)
    assert a.membership.swarm.epoch == 0 and c.node_id not in a.membership.state.removed


async def test_the_last_other_member_can_still_be_removed(make_manager, fast_net):
    a = await make_manager("a")
    c = await make_manager("c", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, c), what="a and c linked")
    assert await a.swarm_ops.async_remove(c.node_id) == 0  # a swarm of two: a is alone afterwards, as asked
    assert a.membership.swarm.epoch == 1
    await wait_until(lambda: a.link(c.node_id) is None, what="c's link closed")
