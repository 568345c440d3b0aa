"""A node that runs for weeks meets peers that link once and never come back (a member's laptop
reinstalled, a test node, a new identity after a data-dir wipe). Found in the leak hunt
(2026-12-07): once the peer table forgot such a peer (PEER_FORGET_S unreachable), the node still
kept something of it for the rest of the run: its id in the segment worker's set of unlinked
peers, in the clock's set of agreeing peers (or of peers warned about) and in the coordinator's
measured performance. One entry per peer ever met, never dropped. Now the table's `removed` event
drops each.

A real node on 127.0.0.1; the peers are raw TLS clients that link as swarm members (HELLO with
their time, admission both ways) and close."""

from __future__ import annotations

import asyncio
import time

import pytest

from node import const
from node.net._messages import Hello
from tests.net.rawclient import RawPeer
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio

N_PEERS = 12


class TimedPeer(RawPeer):
    """A raw member whose HELLO carries its clock, `skew_s` off ours."""

    def __init__(self, *args, skew_s: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.skew_s = skew_s

    def hello_frame(self, nonce: str = "0" * 32):
        hello = Hello.from_frame(super().hello_frame(nonce))
        return Hello(**{**hello.__dict__, "time": time.time() + self.skew_s}).to_frame()


def link_and_leave(workdir, port: int, skew_s: float) -> str:
    peer = TimedPeer(workdir, "127.0.0.1", port, skew_s=skew_s)
    sock, _ = peer.linked()
    sock.close()
    return peer.identity.node_id


async def test_peers_forgotten_by_the_table_leave_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(const, "PEER_FORGET_S", 0.2)
    monkeypatch.setattr(const, "DIAL_MAINTENANCE_INTERVAL_S", 0.1)
    async with running_node(node_config(tmp_path / "data")) as node:
        port = node.peers.listen_port
        ids = []
        for i in range(N_PEERS):
            workdir = tmp_path / f"peer{i}"
            workdir.mkdir()
            skew_s = 3 * const.CLOCK_SKEW_WARN_S if i % 3 == 0 else 0.0  # some warned about, most agreeing
            ids.append(await asyncio.to_thread(link_and_leave, workdir, port, skew_s))
        clock = node.peers.clock
        assert set(ids) & clock.agreeing and set(ids) & clock._warned  # the HELLOs were taken
        await wait_until(lambda: not any(node.peers.table.get(i) for i in ids), timeout_s=20,
                         what="the table forgets the peers that left")
        left = {"worker._unlinked": node.worker._unlinked, "worker._boots": set(node.worker._boots),
                "clock.agreeing": clock.agreeing, "clock._warned": clock._warned,
                "clock.skews_s": set(clock.skews_s), "lacks._lacks": set(node.peers.lacks._lacks),
                "lacks._knows": set(node.peers.lacks._knows),
                "pipeline.performance.peers": set(node.pipeline.performance.peers)}
        assert {name: len(held & set(ids)) for name, held in left.items()} == dict.fromkeys(left, 0)
