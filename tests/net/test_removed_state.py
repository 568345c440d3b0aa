"""A member removed while linked is shown as refused, not gone, when it does not dial in again to be
refused afresh (switched off, out of reach, reached only through a relay that dropped it). Until
2026-12-07 the closing link turned the removed peer's row into "gone" with the link's close cause:
the Peers tab and `swarmllm peers` showed it as a member away for a while, and a request with no
route waited for it to come back (`LayerHolders.regain` skips refused peers, not gone ones)."""

from __future__ import annotations

from .util import addr, wait_until


async def test_a_removed_member_that_does_not_dial_again_stays_refused(make_manager):
    b = await make_manager("b", no_direct=True)  # dials no one: a device that cannot reach a
    a = await make_manager("a", bootstrap=[addr(b)])
    await wait_until(lambda: a.link(b.node_id) is not None and b.link(a.node_id) is not None, what="a and b linked")
    await a.swarm_ops.async_remove(b.node_id)
    await wait_until(lambda: a.link(b.node_id) is None and not any(x.node_id == b.node_id for x in a.links),
                     what="b's links closed at a")
    snap = a.peer(b.node_id)
    assert snap.state == "refused", snap
    assert "removed" in snap.last_error, snap
