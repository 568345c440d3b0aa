"""A whole file overwritten in place (`cp other.gguf models/x.gguf`, another tool downloading it
again) is not handed out under its old sha256 (found in review, 2026-12-06): before, the folder watch
never looked at a catalogued file again, the HELLO's `files` kept the old sha, and MODEL_PART hashed
and read the NEW file's tensors, answering them under the old model id. Now the part server refuses
a file whose size/mtime are not those the catalog hashed (`model_not_found`), and the watch takes the
file as a drop and an add (a loaded model is not unloaded: it is marked, not handed out, and leaves
once unloaded). A real node; a real peer over TLS on 127.0.0.1 asks for the parts."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os

import aiohttp
import pytest

from node.datadir import MODELS_DIR
from node.inference.synth import write_gguf
from node.models.catalog import HASH_CACHE_FILE, HashCache
from node.models.partial.layout import part_of
from node.net import Frame, FrameType
from node.net._frames import frame_bytes
from tests.net.rawclient import RawPeer, read_frame
from tests.support.nodes import TINY, node_config, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama]

OTHER = dataclasses.replace(TINY, seed=7)  # the same tensors' names and sizes, other bytes
ORIGIN = "https://huggingface.co/org/tiny/resolve/main/tiny.gguf"


def _downloaded(data_dir, spec=TINY):
    """models/tiny.gguf as a download from a public origin leaves it (its hash, origin and the
    origin's check recorded): (path, sha256)."""
    (data_dir / MODELS_DIR).mkdir(parents=True, exist_ok=True)
    path = write_gguf(data_dir / MODELS_DIR / "tiny.gguf", spec)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    cache = HashCache(data_dir / HASH_CACHE_FILE)
    cache.remember(path, sha, ORIGIN)
    assert cache.set_public(path, sha, True)
    return path, sha


def _overwrite(path, spec) -> str:
    """Write another model's bytes over the file in place (same size, no truncation: a loaded model's
    mapping stays valid), its mtime a second later; the new sha256."""
    new = write_gguf(path.with_name("other.tmp"), spec).read_bytes()
    new_path = path.with_name("other.tmp")
    assert len(new) == path.stat().st_size
    mtime = path.stat().st_mtime_ns
    with open(path, "r+b") as fh:
        fh.write(new)
    os.utime(path, ns=(mtime + 10**9, mtime + 10**9))
    new_path.unlink()
    return hashlib.sha256(new).hexdigest()


def _files(peer: RawPeer) -> tuple[str, ...]:
    sock, hello = peer.linked()
    sock.close()
    return hello.files


def _ask(peer: RawPeer, header: dict) -> Frame:
    """One MODEL_PART request on a fresh link; the node's answer."""
    sock, _hello = peer.linked()
    try:
        sock.sendall(frame_bytes(Frame(FrameType.MODEL_PART, header, b"", 77)))
        while True:
            frame = read_frame(sock)
            if frame.is_response and frame.request_id == 77:
                return frame
    finally:
        sock.close()


def _tensor_sha(path, entry, name: str) -> str:
    t = next(t for t in entry.header.tensors if t.name == name)
    with open(path, "rb") as fh:
        fh.seek(entry.header.data_offset + t.offset)
        return hashlib.sha256(fh.read(t.n_bytes)).hexdigest()


async def _admin(node, method: str, path: str) -> int:
    async with aiohttp.ClientSession() as s, s.request(method, f"http://127.0.0.1:{node.api.port}{path}",
                                                       headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status


def _refused_or_not_the_new_bytes(reply: Frame, new_sha_of_tensor: str) -> None:
    assert reply.type == FrameType.ERROR and reply.header.get("code") == "model_not_found", \
        (reply.type, reply.header, reply.payload[:200])
    assert new_sha_of_tensor.encode() not in bytes(reply.payload)


async def test_a_file_overwritten_in_place_is_not_handed_out_under_its_old_id(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    data_dir = tmp_path / "data"
    path, old_sha = _downloaded(data_dir)
    async with running_node(node_config(data_dir, models_watch_s=0.05)) as node:
        [entry] = [e for e in node.catalog.entries.values() if e.sha256 == old_sha]
        assert await _admin(node, "POST", f"/api/admin/models/{entry.id}/unload") == 200  # on disk only
        peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
        assert old_sha in await asyncio.to_thread(_files, peer)
        name = next(t.name for t in entry.header.tensors if t.name.startswith("blk.0."))
        hashes = {"sha256": old_sha, "op": "hashes", "parts": [part_of(name)]}
        ok = await asyncio.to_thread(_ask, peer, hashes)
        assert ok.type == FrameType.MODEL_PART and _tensor_sha(path, entry, name).encode() in bytes(ok.payload)
        looks = node.model_files.watcher.looks
        node.model_files.watcher.interval_s = 3600.0  # (its next look waits: the part server alone first)
        await wait_until(lambda: node.model_files.watcher.looks > looks, 30.0, 0.02, "the watch's sleep")
        new_sha = _overwrite(path, OTHER)
        new_tensor = _tensor_sha(path, entry, name)
        # before the watch looks again: the part server sees the file is not the one hashed
        for header in (hashes,
                       {"sha256": old_sha, "op": "read", "tensor": name, "offset": 0, "n": 64}):
            _refused_or_not_the_new_bytes(await asyncio.to_thread(_ask, peer, header), new_tensor)
        # the watch's look: the old model leaves the catalog and the advert, the file is taken as new
        await node.model_files.watcher.async_look()
        await node.model_files.watcher.async_look()
        await node.model_files.watcher.async_look()
        assert old_sha not in {e.sha256 for e in node.catalog.entries.values()}
        assert [e.sha256 for e in node.catalog.entries.values() if e.path == path.resolve()] == [new_sha]
        assert old_sha not in await asyncio.to_thread(_files, peer)
        _refused_or_not_the_new_bytes(await asyncio.to_thread(_ask, peer, hashes), new_tensor)
        assert "model file changed on disk, the model is removed and the file read again" in caplog.text


async def test_a_loaded_model_whose_file_is_overwritten_keeps_running_and_is_not_handed_out(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    data_dir = tmp_path / "data"
    path, old_sha = _downloaded(data_dir)
    async with running_node(node_config(data_dir, models_watch_s=0.05)) as node:
        [entry] = [e for e in node.catalog.entries.values() if e.sha256 == old_sha]
        assert node.models.get(entry.id).state == "loaded"  # (a node loads its whole models at start)
        peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
        assert old_sha in await asyncio.to_thread(_files, peer)
        new_sha = _overwrite(path, OTHER)
        name = next(t.name for t in entry.header.tensors if t.name.startswith("blk.0."))
        new_tensor = _tensor_sha(path, entry, name)
        await wait_until(lambda: "model file changed on disk since it was hashed" in caplog.text, 30.0, 0.02,
                         "the watch to see the file changed")
        assert node.models.get(entry.id).state == "loaded"  # not unloaded behind the user's back
        assert old_sha not in await asyncio.to_thread(_files, peer)
        _refused_or_not_the_new_bytes(await asyncio.to_thread(
            _ask, peer, {"sha256": old_sha, "op": "hashes", "parts": [part_of(name)]}), new_tensor)
        assert await _admin(node, "POST", f"/api/admin/models/{entry.id}/unload") == 200
        await wait_until(lambda: any(e.sha256 == new_sha for e in node.catalog.entries.values()), 30.0, 0.05,
                         "the unloaded model to leave and its file to be read again")
        assert entry.id not in node.catalog.entries
