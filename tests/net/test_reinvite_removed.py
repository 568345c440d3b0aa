"""A removed member stays out by its node id, even with a fresh invite (the removal list travels with
the swarm and never shrinks). Trying anyway must say so, not blame the code ("used, expired, or for
another swarm") that is in fact fresh and stays open for another device."""

from __future__ import annotations

import pytest

from node.errors import InvalidRequest

from .util import addr, wait_until


async def test_a_removed_member_trying_a_fresh_invite_is_told_it_was_removed(make_manager, fast_net):
    a = await make_manager("a")
    c = await make_manager("c", bootstrap=[addr(a)])
    await wait_until(lambda: a.link(c.node_id) is not None, what="a and c linked")
    await a.swarm_ops.async_remove(c.node_id)
    code, _ = await a.swarm_ops.async_invite()  # the owner changes their mind: a fresh code for c
    with pytest.raises(InvalidRequest) as err:
        await c.swarm_ops.async_join(code)
    message = err.value.message
    assert "removed" in message, message
    assert "used, expired" not in message, message  # the code is fresh and still open
    assert a.swarm_ops.status()["invites_open"] == 1
