"""A member that runs `swarmllm join` with a code that no longer works (used, expired) gets an error
and stays where it is. The failed invite says nothing about membership: it must not leave the two
members refusing each other, so that after the next link drop neither dials the other again."""

from __future__ import annotations

import pytest

from node.errors import InvalidRequest
from node.net import Swarm
from tests.support.swarm import join_test_swarm

from .util import addr, wait_until


def linked(x, y) -> bool:
    return x.link(y.node_id) is not None and y.link(x.node_id) is not None


async def test_a_used_code_tried_again_by_a_member_does_not_split_it_from_the_inviter(make_manager, fast_net,
                                                                                     tmp_path):
    join_test_swarm(tmp_path / "a", Swarm.create())  # a swarm of its own (b and c: the test swarm)
    a = await make_manager("a")
    c = await make_manager("c")
    code, _ = await a.swarm_ops.async_invite()
    b = await make_manager("b", bootstrap=[addr(c)])
    await b.swarm_ops.async_join(code)  # b joins a's swarm with the code (b and c: the test swarm)
    await wait_until(lambda: linked(a, b), what="b linked to a")
    with pytest.raises(InvalidRequest, match="swarm already"):  # (2026-12-07: b no longer presents it)
        await b.swarm_ops.async_join(code)  # the same code again (say, pasted twice): refused
    assert linked(a, b) and b.membership.swarm.public_id == a.membership.swarm.public_id
    b.link(a.node_id).close("test: the network dropped")  # a blip on the link
    await wait_until(lambda: linked(a, b), timeout_s=15, what="a and b linked again after the drop")
