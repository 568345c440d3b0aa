"""What a node's HELLO `files` lists and its part server hands out, unloaded (decision of the
2026-12-06 review): only whole files downloaded from a public origin (the catalog entry has an
origin_url: a peer could fetch it from there anyway). A file the user gave (`--model PATH`, the GUI's
Add, copied into models/: a private fine-tune) is neither listed nor handed out while unloaded;
loaded, it is handed out as before (the user chose to serve it). Before, every whole file in the
catalog was listed and handed out to any member. A real node; a real TLS peer on 127.0.0.1 asks."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import aiohttp
import pytest

from node.inference.synth import write_gguf
from node.models.partial.layout import part_of
from node.net import FrameType
from tests.net.rawclient import RawPeer
from tests.pipeline.test_held_file_changed import _admin, _ask, _downloaded, _files
from tests.support.nodes import TINY, node_config, running_node

pytestmark = [pytest.mark.llama]

MINE = dataclasses.replace(TINY, seed=21, name="mine")  # the user's own model


async def test_only_downloaded_files_are_listed_and_handed_out_unloaded(tmp_path):
    data_dir = tmp_path / "data"
    _path, public = _downloaded(data_dir)
    mine_path = write_gguf(tmp_path / "mine.gguf", MINE)
    mine = hashlib.sha256(mine_path.read_bytes()).hexdigest()
    async with running_node(node_config(data_dir, mine_path)) as node:
        ids = {e.sha256: e.id for e in node.catalog.entries.values()}
        for sha in (public, mine):
            assert await _admin(node, "POST", f"/api/admin/models/{ids[sha]}/unload") == 200  # on disk only
        entry = node.catalog.by_sha(mine)
        part = part_of(next(t.name for t in entry.header.tensors if t.name.startswith("blk.0.")))
        peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
        assert await asyncio.to_thread(_files, peer) == (public,)
        answer = await asyncio.to_thread(_ask, peer, {"sha256": public, "op": "hashes", "parts": [part]})
        assert answer.type == FrameType.MODEL_PART, answer.header
        refused = await asyncio.to_thread(_ask, peer, {"sha256": mine, "op": "hashes", "parts": [part]})
        assert refused.type == FrameType.ERROR and refused.header.get("code") == "model_not_found", refused.header
        # loaded: the user serves it, and peers may take its layers as before
        assert await _admin(node, "POST", f"/api/admin/models/{ids[mine]}/load") == 200
        served = await asyncio.to_thread(_ask, peer, {"sha256": mine, "op": "hashes", "parts": [part]})
        assert served.type == FrameType.MODEL_PART and b"blk.0." in bytes(served.payload), served.header
        assert await asyncio.to_thread(_files, peer) == (public,)  # (its advert is in `models`)


async def test_a_paused_node_answers_not_contributing_for_a_downloaded_files_parts(tmp_path):
    """Paused, a node lists no `files` and refuses their parts `not_contributing`, as the docs say
    (found in review, 2026-12-06: it answered `model_not_found`, its files list being empty while
    paused)."""
    data_dir = tmp_path / "data"
    path, public = _downloaded(data_dir)
    async with running_node(node_config(data_dir)) as node:
        [entry] = node.catalog.entries.values()
        assert await _admin(node, "POST", f"/api/admin/models/{entry.id}/unload") == 200
        part = part_of(next(t.name for t in entry.header.tensors if t.name.startswith("blk.0.")))
        async with aiohttp.ClientSession() as s, s.post(
                f"http://127.0.0.1:{node.api.port}/api/admin/contribute", json={"paused": True},
                headers={"Authorization": f"Bearer {node.api_key}"}) as r:
            assert r.status == 200, await r.text()
        peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
        assert await asyncio.to_thread(_files, peer) == ()
        refused = await asyncio.to_thread(_ask, peer, {"sha256": public, "op": "hashes", "parts": [part]})
        assert refused.type == FrameType.ERROR and refused.header.get("code") == "not_contributing", refused.header
