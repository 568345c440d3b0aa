"""A join admitted while a rotation reaches the inviter (another member removes someone) hands the
joiner the secret of after the rotation. Until 2026-12-07 the inviter sent the swarm as it was when
the join began: the joiner adopted the old secret, every member then refused it as a member that had
missed a rotation, and its invite was used up."""

from __future__ import annotations

from node.net import Swarm
from tests.support.swarm import join_test_swarm

from .util import addr, wait_until


async def test_a_rotation_during_a_join_reaches_the_joiner(make_manager, fast_net, tmp_path):
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: a.link(b.node_id) is not None and b.link(a.node_id) is not None, what="a and b linked")
    join_test_swarm(tmp_path / "j", Swarm.create())  # the device to add: a swarm of its own
    j = await make_manager("j")
    code, _ = await a.swarm_ops.async_invite()

    save = a.membership.async_save
    rotated: list[int] = []

    async def save_then_rotation_arrives():
        await save()
        if not rotated and not a.membership.state.invites:  # the save that uses the invite up
            rotated.append(1)
            await b.swarm_ops.async_remove("ab" * 32)  # b removes someone: the rekey reaches a now
            await wait_until(lambda: a.membership.swarm.epoch == 1, what="a rotated by b's rekey")

    a.membership.async_save = save_then_rotation_arrives
    await j.swarm_ops.async_join(code)
    assert rotated, "the join's save never ran"
    assert j.membership.swarm.epoch == 1  # the secret of after the rotation
    await wait_until(lambda: a.link(j.node_id) is not None and b.link(j.node_id) is not None, timeout_s=15,
                     what="the joiner linked to both members")
    assert not j.membership.refusals
