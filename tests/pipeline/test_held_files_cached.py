"""The part server asks whether this node hands out a whole file unloaded (Node._shares_whole) for
every MODEL_PART request: it made a pass over the catalog (wholeparts.held_files) each time, for
every tensor a peer fetched. The set is kept now, rebuilt when the catalog changes (its generation:
a file added or removed, its origin found public, its file found changed), and used by the HELLO's
`files` and the part server alike. A real node; a real peer over TLS on 127.0.0.1 asks."""

from __future__ import annotations

import asyncio

import pytest

import node.hello as node_module
from node.models.partial.layout import part_of
from node.net import Frame, FrameType
from node.net._frames import frame_bytes
from tests.net.rawclient import RawPeer, read_frame
from tests.pipeline.test_held_file_changed import _admin, _downloaded, _files
from tests.support.nodes import node_config, running_node

pytestmark = [pytest.mark.llama]


def _ask_many(peer: RawPeer, headers: list[dict]) -> list[Frame]:
    """MODEL_PART requests one after another on one link; the node's answers."""
    sock, _hello = peer.linked()
    answers = []
    try:
        for i, header in enumerate(headers, start=100):
            sock.sendall(frame_bytes(Frame(FrameType.MODEL_PART, header, b"", i)))
            while True:
                frame = read_frame(sock)
                if frame.is_response and frame.request_id == i:
                    answers.append(frame)
                    break
    finally:
        sock.close()
    return answers


async def test_the_held_files_are_not_computed_again_per_part_request(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    path, public = _downloaded(data_dir)
    passes = []
    real = node_module.held_files
    monkeypatch.setattr(node_module, "held_files", lambda catalog: passes.append(1) or real(catalog))
    async with running_node(node_config(data_dir)) as node:
        [entry] = node.catalog.entries.values()
        assert await _admin(node, "POST", f"/api/admin/models/{entry.id}/unload") == 200  # on disk only
        parts = sorted({part_of(t.name) for t in entry.header.tensors if t.name.startswith("blk.")})
        peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
        assert await asyncio.to_thread(_files, peer) == (public,)
        before = len(passes)
        asks = [{"sha256": public, "op": "hashes", "parts": [p]} for p in parts] * 3
        answers = await asyncio.to_thread(_ask_many, peer, asks)
        assert all(a.type == FrameType.MODEL_PART for a in answers), [a.header for a in answers]
        assert len(passes) - before <= 1, f"{len(passes) - before} passes over the catalog for {len(asks)} requests"
        # the catalog changes (the origin check's record, no announce): the kept set follows at once
        assert await asyncio.to_thread(node.catalog.set_origin_public, path, public, False) is not None
        [refused] = await asyncio.to_thread(_ask_many, peer, asks[:1])
        assert refused.type == FrameType.ERROR and refused.header.get("code") == "model_not_found", refused.header
        assert await asyncio.to_thread(_files, peer) == ()
        assert await asyncio.to_thread(node.catalog.set_origin_public, path, public, True) is not None
        [served] = await asyncio.to_thread(_ask_many, peer, asks[:1])
        assert served.type == FrameType.MODEL_PART, served.header
        assert await asyncio.to_thread(_files, peer) == (public,)


async def test_a_read_between_the_generations_bump_and_the_change_is_not_kept(tmp_path):
    """The origin check's record (an executor thread) bumped the catalog's generation BEFORE it set the
    entry's origin_public: the loop reading the held files in between kept the old list under the new
    generation, and the HELLO sent right after the check (and every one until an unrelated change) left
    the file out. Here the loop reads at the moment the generation is set, every time."""
    data_dir = tmp_path / "data"
    path, public = _downloaded(data_dir)
    async with running_node(node_config(data_dir)) as node:
        assert await asyncio.to_thread(node.catalog.set_origin_public, path, public, False) is not None
        peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
        assert await asyncio.to_thread(_files, peer) == ()
        loop = asyncio.get_running_loop()

        async def read() -> None:
            node._held_files()

        class Watched(type(node.catalog)):  # the loop reads the held files as soon as the generation moves
            def __setattr__(self, name, value):
                super().__setattr__(name, value)
                if name == "generation":
                    asyncio.run_coroutine_threadsafe(read(), loop).result(10)

        node.catalog.__class__ = Watched
        assert await asyncio.to_thread(node.catalog.set_origin_public, path, public, True) is not None
        assert await asyncio.to_thread(_files, peer) == (public,)
