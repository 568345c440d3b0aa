"""What a node keeps of peers' `unsupported_frame_type` ERRORs is bounded (2026-12-07, review r27).

Seen: any peer could name any frame type 0-255 in such an ERROR and each was kept, per node id, until
the peer table forgot the peer (an hour): a client churning identities left ~8 KiB each. Only the
types this node sends that an older peer may refuse (`REFUSABLE`: GENERATE, EMBED and their cancels) are kept now,
for at most PEER_LACKS_MAX peer processes.

A real node on 127.0.0.1; the peers are raw TLS clients linked as swarm members."""

from __future__ import annotations

import asyncio

import pytest

from node import const
from node.net import Frame, FrameType
from node.net._frames import frame_bytes
from node.net._lacks import REFUSABLE
from tests.net.rawclient import RawPeer
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio


def refuse(frame_type: int) -> bytes:
    return frame_bytes(Frame(FrameType.ERROR, {"code": "unsupported_frame_type", "message": "no",
                                               "frame_type": frame_type}))


def link_and_refuse(workdir, port: int, types: list[int]):
    peer = RawPeer(workdir, "127.0.0.1", port)
    sock, _ = peer.linked()
    sock.sendall(b"".join(refuse(t) for t in types))
    return peer.identity.node_id, sock


async def test_only_refusable_types_are_kept_for_at_most_peer_lacks_max_peers(tmp_path, monkeypatch):
    monkeypatch.setattr(const, "PEER_LACKS_MAX", 3, raising=False)
    async with running_node(node_config(tmp_path / "data")) as node:
        lacks, port, socks = node.peers.lacks, node.peers.listen_port, []
        try:
            workdir = tmp_path / "every-type"
            workdir.mkdir()
            # every type it could name, EMBED last: once EMBED is kept, all before it were read
            noisy, sock = await asyncio.to_thread(link_and_refuse, workdir, port,
                                                  [t for t in range(256) if t != FrameType.EMBED] + [FrameType.EMBED])
            socks.append(sock)
            await wait_until(lambda: lacks.lacks(noisy, FrameType.EMBED), 20, what="the EMBED refusal to be kept")
            assert lacks._lacks[noisy][1] == set(REFUSABLE), lacks._lacks[noisy]
            ids = [noisy]
            for i in range(5):  # churned identities, each refusing EMBED
                workdir = tmp_path / f"peer{i}"
                workdir.mkdir()
                node_id, sock = await asyncio.to_thread(link_and_refuse, workdir, port, [FrameType.EMBED])
                socks.append(sock)
                ids.append(node_id)
                await wait_until(lambda node_id=node_id: lacks.lacks(node_id, FrameType.EMBED), 20,
                                 what="the EMBED refusal to be kept")
                assert len(lacks._lacks) <= const.PEER_LACKS_MAX
            assert list(lacks._lacks) == ids[-3:]  # the least recently noted went first
        finally:
            for sock in socks:
                sock.close()
