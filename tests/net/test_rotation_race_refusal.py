"""Two members whose link is redialled across a rotation (one side holding the new secret, the other
not yet) refuse each other. Review r77 (2026-12-07): those refusals stayed once both held the new
secret, so the dialers skipped each other for good (the Peers rows "refused", a request with no route
not waiting for the member), and the new invite the status advised was refused as "a member of that
swarm already". A rotation now gives the members it refused, and that refused it, a try again."""

from __future__ import annotations

from tests.net.util import addr, linked, wait_until


async def test_members_refused_across_a_rotation_link_again_once_both_hold_the_new_secret(make_manager, fast_net):
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    c = await make_manager("c", bootstrap=[addr(a), addr(b)])
    await wait_until(lambda: linked(a, b) and linked(a, c) and linked(b, c), what="the three linked")
    before = c.membership.state
    await a.swarm_ops.async_remove("ab" * 32)  # a rotates (epoch 1); b and c get the rekey
    await wait_until(lambda: b.membership.swarm.epoch == c.membership.swarm.epoch == 1, what="b and c rotated")
    # as if c's link to a had dropped just before the rekey reached c: c holds epoch 0, and the
    # redials cross the rotation (its link to b stays up, untouched by admission)
    c.membership.state = before
    c.link(a.node_id).close("test: a blip just before the rekey")
    await wait_until(lambda: a.membership.is_refused(c.node_id) or c.membership.is_refused(a.node_id),
                     what="a and c refusing each other across the epochs")
    # the rekey reaches c through b, as it would have
    b.swarm_ops._send_rekey(b.membership.swarm, set(b.membership.state.removed), skip=None)  # noqa: SLF001
    await wait_until(lambda: c.membership.swarm.epoch == 1, what="c rotated through b")
    await wait_until(lambda: linked(a, c), what="a and c linked again")
    assert a.peer(c.node_id).state == c.peer(a.node_id).state == "connected"
