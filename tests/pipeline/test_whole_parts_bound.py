"""A whole-file holder's MODEL_PART answers are bounded per request: one `hashes` request hashes at
most PARTIAL_WHOLE_HASH_BYTES of tensors (the parts not reached are left out), and the fetching
node asks the same holder again until it has every part; every tensor then equals the file's.
In-process: the node's PartServer over a catalog holding the file, a PartialModels whose peer
requests go to that server."""

from __future__ import annotations

import hashlib

import pytest

from node import const
from node.errors import InvalidRequest, ModelNotFound
from node.inference.pipeline import wholeparts
from node.inference.pipeline.partials import PartialModels, PartServer
from node.inference.synth import write_gguf
from node.models.catalog import HashCache, scan_entry
from node.models.partial.fromheader import create_from_header
from node.net import Frame, FrameType
from tests.pipeline.test_autoserve import AUTO8


class _Catalog:
    def __init__(self, entry):
        self.entry = entry

    def by_sha(self, sha):
        return self.entry if self.entry.sha256 == sha else None


class _Link:
    short_id = "asker"
    unsent = 0


class _Peers:
    """PeerManager.async_request, answered by the holder's PartServer (what crosses the link)."""

    def __init__(self, server: PartServer):
        self.server, self.asked = server, []

    async def async_request(self, node_id, frame, timeout_s):
        self.asked.append(dict(frame.header))
        return await self.server.async_handle(_Link(), frame)


@pytest.fixture
def whole(tmp_path):
    path = write_gguf(tmp_path / "auto8.gguf", AUTO8)
    return path, scan_entry(path, "cli", HashCache(None))


async def test_a_whole_holder_hashes_a_bounded_amount_per_request_and_is_asked_again(tmp_path, whole, monkeypatch):
    path, entry = whole
    layer = sum(t.n_bytes for t in entry.header.tensors if t.name.startswith("blk.0."))
    monkeypatch.setattr(const, "PARTIAL_WHOLE_HASH_BYTES", layer)
    server = PartServer(_Catalog(entry))
    hashed = []
    real = wholeparts._hash_tensor
    monkeypatch.setattr(wholeparts, "_hash_tensor", lambda p, at, n: hashed.append(n) or real(p, at, n))

    # the newcomer: a partial model of the same header and id, fetching every layer
    directory = create_from_header(tmp_path / "b.partial", path.read_bytes()[:entry.header.data_offset],
                                   entry.header, sha256=entry.sha256, header_sha256=hashlib.sha256(
                                       path.read_bytes()[:entry.header.data_offset]).hexdigest(),
                                   size_bytes=entry.size_bytes, origin_url=None)
    newcomer = scan_entry(directory, "data_dir", HashCache(None))
    peers = _Peers(server)
    partials = PartialModels(tmp_path)
    partials.attach(peers, lambda _sha: [], lambda _sha: ["a" * 64])
    await partials.async_fetch(newcomer, 0, AUTO8.n_layers)

    asks = [h for h in peers.asked if h["op"] == "hashes"]
    assert len(asks) >= AUTO8.n_layers // 2, asks  # several requests, each within the bound
    assert max(hashed) <= layer and sum(hashed) == sum(t.n_bytes for t in entry.header.tensors)  # each tensor once
    manifest = newcomer.partial
    assert manifest.covers([p for p in {t.part for t in manifest.tensors.values()}])
    data = path.read_bytes()
    for t in manifest.tensors.values():
        held = (directory / "parts" / f"{t.part}.bin").read_bytes()
        assert held[t.local:t.local + t.n_bytes] == data[t.offset:t.offset + t.n_bytes], t.name


async def test_a_whole_holder_refuses_reads_outside_its_bounds(whole):
    _path, entry = whole
    server = PartServer(_Catalog(entry))
    t = entry.header.tensors[0]

    async def read(**h):
        return await server.async_handle(_Link(), Frame(FrameType.MODEL_PART, {"sha256": entry.sha256, "op": "read", **h}))
    with pytest.raises(InvalidRequest):
        await read(tensor=t.name, offset=0, n=const.PARTIAL_PEER_CHUNK + 1)
    with pytest.raises(InvalidRequest):
        await read(tensor=t.name, offset=t.n_bytes, n=1)
    with pytest.raises(ModelNotFound):
        await read(tensor="blk.99.nothing", offset=0, n=1)
    reply = await read(tensor=t.name, offset=0, n=min(16, t.n_bytes))
    assert bytes(reply.payload) == _path.read_bytes()[entry.header.data_offset + t.offset:][:min(16, t.n_bytes)]


async def test_a_split_models_part_is_not_handed_out(whole):
    """Its id hashes part 1 only and its tensors lie in the other files: nothing is served from it."""
    _path, entry = whole
    entry.header.metadata["split.count"] = 3  # (as part 1 of a gguf-split set says)
    server = PartServer(_Catalog(entry))
    for h in ({"op": "hashes", "parts": ["layer-0000"]},
              {"op": "read", "tensor": entry.header.tensors[0].name, "offset": 0, "n": 1}):
        with pytest.raises(ModelNotFound):
            await server.async_handle(_Link(), Frame(FrameType.MODEL_PART, {"sha256": entry.sha256, **h}))
