"""A member that was offline while the secret rotated is refused when it comes back (its epoch is
old) and, as the docs say, needs a new invite. After it joins again it must link with every member
again, not only with the one that invited it: the refusals of the old epoch must not outlive the join."""

from __future__ import annotations

import shutil

import pytest

from node.config import NodeConfig
from node.net import PeerManager, load_or_create_identity
from node.net._membership import SWARM_FILE

from .util import addr, wait_until


@pytest.fixture
async def nodes(tmp_path, fast_net):
    made: list[PeerManager] = []

    async def make(name: str, swarm_from: PeerManager | None = None, **fields) -> PeerManager:
        data_dir = tmp_path / name
        data_dir.mkdir(exist_ok=True)
        if swarm_from is not None:
            shutil.copy(swarm_from.config.data_dir / SWARM_FILE, data_dir / SWARM_FILE)
        cfg = NodeConfig(data_dir=data_dir, port=0, peer_port=0, peer_host="127.0.0.1", mdns=False, **fields)
        manager = PeerManager(cfg, load_or_create_identity(data_dir))
        made.append(manager)
        await manager.async_start()
        return manager

    yield make
    for manager in reversed(made):
        await manager.async_stop()


def linked(x, y) -> bool:
    return x.link(y.node_id) is not None and y.link(x.node_id) is not None


async def test_a_member_back_after_a_missed_rotation_links_with_everyone_once_it_joins_again(nodes):
    a = await nodes("a")
    b = await nodes("b", a, bootstrap=[addr(a)])
    m = await nodes("m", a, bootstrap=[addr(a), addr(b)])
    await wait_until(lambda: linked(a, b) and linked(a, m) and linked(b, m), what="a full mesh of three")
    await m.async_stop()  # m is away ...
    await a.swarm_ops.async_remove("ab" * 32)  # ... while a removes someone: the secret rotates
    await wait_until(lambda: b.membership.swarm.epoch == 1, what="b got the new secret")
    m2 = await nodes("m", bootstrap=[addr(a), addr(b)])  # m back, with the old epoch: refused
    await wait_until(lambda: m2.node_id in a.membership.refusals and m2.node_id in b.membership.refusals,
                     what="m refused by both members")
    code, _ = await a.swarm_ops.async_invite()  # the documented way back: a new invite
    await m2.swarm_ops.async_join(code)
    await wait_until(lambda: linked(a, m2), what="m linked to the inviter")
    await wait_until(lambda: linked(b, m2), timeout_s=15, what="m linked to the other member again")
