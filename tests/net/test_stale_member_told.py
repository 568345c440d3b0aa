"""A member back after a rotation it missed is refused everywhere (its secret is old). What it shows
its owner (swarm status, the Peers tab's tooltip, the report) must say that this node is the one out
of date and needs a new invite, not the same words as for a stranger with an old secret."""

from __future__ import annotations

import shutil

from node.config import NodeConfig
from node.net import PeerManager, load_or_create_identity
from node.net._membership import SWARM_FILE

from .util import addr, wait_until


async def test_a_member_that_missed_a_rotation_is_told_it_needs_a_new_invite(tmp_path, fast_net):
    made: list[PeerManager] = []

    async def node(name: str, **fields) -> PeerManager:
        cfg = NodeConfig(data_dir=tmp_path / name, port=0, peer_port=0, peer_host="127.0.0.1", mdns=False, **fields)
        manager = PeerManager(cfg, load_or_create_identity(tmp_path / name))
        made.append(manager)
        await manager.async_start()
        return manager

    try:
        a = await node("a")
        (tmp_path / "m").mkdir()
        shutil.copy(tmp_path / "a" / SWARM_FILE, tmp_path / "m" / SWARM_FILE)
        m = await node("m", bootstrap=[addr(a)])
        await wait_until(lambda: m.link(a.node_id) is not None, what="m linked to a")
        await m.async_stop()
        b = await node("b")  # a second member joins while m is away ...
        code, _ = await a.swarm_ops.async_invite()
        await b.swarm_ops.async_join(code)
        await wait_until(lambda: a.link(b.node_id) is not None, what="b linked to a")
        await a.swarm_ops.async_remove("ab" * 32)  # ... and a rotation happens
        m2 = await node("m", bootstrap=[addr(a)])
        await wait_until(lambda: a.node_id in m2.membership.refusals, what="m refusing a / refused by a")
        reason = m2.membership.refusals[a.node_id].reason
        assert "new invite" in reason, reason
        # a notes its own refusal of m2 on its side of the exchange, not necessarily before m2 notes its own
        await wait_until(lambda: m2.node_id in a.membership.refusals, what="a refusing m2")
        assert "new invite" not in a.membership.refusals[m2.node_id].reason  # a holds the newer secret
    finally:
        for manager in reversed(made):
            await manager.async_stop()
