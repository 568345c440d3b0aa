"""A whole-file holder's MODEL_PART answers are bounded per request: one `hashes` request hashes at
most PARTIAL_WHOLE_HASH_BYTES of tensors (the parts not reached are left out), and the fetching
node asks the same holder again until it has every part; every tensor then equals the file's.
In-process: the node's PartServer over a catalog holding the file, a PartialModels whose peer
requests go to that server."""

from __future__ import annotations

import asyncio
import hashlib
import json
from types import SimpleNamespace

import pytest

from node import const
from node.errors import InvalidRequest, ModelNotFound, ModelUnavailable
from node.inference.pipeline import wholeparts
from node.inference.pipeline.part_server import PartServer
from node.inference.pipeline.partials import PartialModels
from node.inference.synth import write_gguf
from node.models.catalog import HashCache, scan_entry
from node.models.partial.fromheader import create_from_header
from node.net import Frame, FrameType
from node.node import Node
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


async def test_each_hashes_request_hashes_at_most_the_bound_and_a_cached_answer_waits_for_no_hashing(
        tmp_path, whole, monkeypatch):
    """Bytes hashed per request (not per tensor) stay within PARTIAL_WHOLE_HASH_BYTES (plus one part
    larger than it alone); once every tensor asked is hashed, the answer does not wait on another
    request's hashing (the node-wide lock)."""
    path, entry = whole
    layer = sum(t.n_bytes for t in entry.header.tensors if t.name.startswith("blk.0."))
    monkeypatch.setattr(const, "PARTIAL_WHOLE_HASH_BYTES", layer)
    server = PartServer(_Catalog(entry))
    per_request, real = [], wholeparts._hash_tensor
    monkeypatch.setattr(wholeparts, "_hash_tensor", lambda p, at, n: per_request.__setitem__(-1, per_request[-1] + n)
                        or real(p, at, n))
    manifest = create_from_header_manifest(tmp_path, path, entry)
    parts = sorted({t.part for t in manifest.tensors.values()})
    answered: set[str] = set()
    while set(parts) - answered:
        per_request.append(0)
        reply = await server.async_handle(_Link(), Frame(FrameType.MODEL_PART, {
            "sha256": entry.sha256, "op": "hashes", "parts": sorted(set(parts) - answered)}))
        names = set(json.loads(bytes(reply.payload))["tensors"])
        answered |= {t.part for t in manifest.tensors.values() if t.name in names}
        biggest = max(sum(t.n_bytes for t in entry.header.tensors if wholeparts.part_of(t.name) == p) for p in parts)
        assert 0 < per_request[-1] <= max(layer, biggest), per_request
    async with server.whole._hashing:  # another request hashing: a fully cached one still answers
        reply = await asyncio.wait_for(server.async_handle(_Link(), Frame(FrameType.MODEL_PART, {
            "sha256": entry.sha256, "op": "hashes", "parts": parts})), 10)
    assert len(json.loads(bytes(reply.payload))["tensors"]) == len(entry.header.tensors)


async def test_a_whole_file_gone_while_listed_is_model_not_found(whole):
    path, entry = whole
    server = PartServer(_Catalog(entry))
    path.unlink()  # deleted or moved by its owner; still in the catalog until the next scan
    with pytest.raises(ModelNotFound):
        await server.async_handle(_Link(), Frame(FrameType.MODEL_PART, {
            "sha256": entry.sha256, "op": "hashes", "parts": ["layer-0000"]}))


async def test_a_paused_node_or_one_not_running_the_model_hands_out_no_whole_file(whole):
    """Contributing off ("Pause contributing"): its whole files are refused `not_contributing`; a
    file it does not run (not loaded, so not advertised) is not handed out."""
    _path, entry = whole
    asks = ({"op": "hashes", "parts": ["layer-0000"]},
            {"op": "read", "tensor": entry.header.tensors[0].name, "offset": 0, "n": 1})
    paused = PartServer(_Catalog(entry), contributing=lambda: False)
    for h in asks:
        with pytest.raises(ModelUnavailable) as err:
            await paused.async_handle(_Link(), Frame(FrameType.MODEL_PART, {"sha256": entry.sha256, **h}))
        assert err.value.code == "not_contributing"
    not_run = PartServer(_Catalog(entry), shares_whole=lambda _sha: False)
    for h in asks:
        with pytest.raises(ModelNotFound):
            await not_run.async_handle(_Link(), Frame(FrameType.MODEL_PART, {"sha256": entry.sha256, **h}))


def test_a_paused_peer_is_not_counted_as_a_whole_holder(whole):
    """Its advert says `paused` (it refuses): the fetching node does not ask it."""
    _path, entry = whole
    advert = {"sha256": entry.sha256, "name": "auto8", "n_layers": AUTO8.n_layers, "whole": True}
    peers = [SimpleNamespace(node_id="a" * 64, state="connected", models=({**advert, "paused": True},)),
             SimpleNamespace(node_id="c" * 64, state="connected", models=(advert,))]
    me = SimpleNamespace(node_id="b" * 64, peers=SimpleNamespace(peers=lambda: peers))
    assert Node._whole_holders(me, entry.sha256) == ["c" * 64]


def create_from_header_manifest(tmp_path, path, entry):
    """The manifest a newcomer makes from this file's header (its parts and tensors)."""
    header = path.read_bytes()[:entry.header.data_offset]
    directory = create_from_header(tmp_path / "m.partial", header, entry.header, sha256=entry.sha256,
                                   header_sha256=hashlib.sha256(header).hexdigest(),
                                   size_bytes=entry.size_bytes, origin_url=None)
    return scan_entry(directory, "data_dir", HashCache(None)).partial
