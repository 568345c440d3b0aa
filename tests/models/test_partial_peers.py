"""Layers of a partial model taken from a peer that holds them (node/models/partial/peers.py),
against a local origin that counts what it sends: an honest peer's bytes cost the origin one
spot-check range; a peer whose bytes do not hash to what it names has those parts refetched from
the origin; a peer that altered bytes and names together is caught by the spot check, and all it
gave is refetched; with the origin unreachable the bytes are kept as not checked until it is back.
Every case ends with the slice giving the whole file's output."""

from __future__ import annotations

import asyncio
import hashlib
import random

import pytest
import torch

from node import const
from node.errors import PeerUnreachable
from node.models.gguf_meta import read_header
from node.models.partial import (
    PartialStore,
    async_fetch_parts,
    async_fetch_parts_from,
    async_open_partial,
    async_spot_check_held,
    parts_for,
)
from tests.models.test_partial import SPEC, _hidden
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.rangeserver import ThreadedOrigin


class StoreSource:
    """A peer holding a partial model, in-process: names its tensors' hashes and reads its part
    files, optionally altering the bytes (`flip`: every 4096th byte of these parts' tensors) and,
    if `lie`, naming the altered bytes' hashes."""

    def __init__(self, store: PartialStore, flip: set[str] = frozenset(), lie: bool = False,
                 fail_on: str | None = None):
        self.store, self.manifest = store, store.load()
        self.flip, self.lie, self.label = flip, lie, "peer-a"
        self.fail_on = fail_on  # a tensor whose read fails (the peer went)
        self.reads = 0

    def _altered(self, name: str, offset: int, data: bytes) -> bytes:
        if self.manifest.tensors[name].part not in self.flip:
            return data
        out = bytearray(data)
        for i in range((-offset) % 4096, len(out), 4096):
            out[i] ^= 0x5A
        return bytes(out)

    def _read(self, name: str, offset: int, n: int) -> bytes:
        t = self.manifest.tensors[name]
        with open(self.store.part_path(t.part), "rb") as fh:
            fh.seek(t.local + offset)
            return self._altered(name, offset, fh.read(n))

    async def async_hashes(self, model: str, parts: list[str]) -> dict[str, str]:
        assert model == self.manifest.sha256
        out = {}
        for t in self.manifest.tensors.values():
            if t.part in parts and t.part in self.manifest.complete:
                out[t.name] = t.sha256
                if self.lie and t.part in self.flip:
                    data = await asyncio.get_running_loop().run_in_executor(None, self._read, t.name, 0, t.n_bytes)
                    out[t.name] = hashlib.sha256(data).hexdigest()
        return out

    async def async_read(self, model: str, tensor: str, offset: int, n: int) -> bytes:
        assert n <= const.PARTIAL_PEER_CHUNK
        self.reads += 1
        if tensor == self.fail_on:
            raise PeerUnreachable("the peer went")
        return await asyncio.get_running_loop().run_in_executor(None, self._read, tensor, offset, n)


@pytest.fixture
def origin(model):  # noqa: F811
    with ThreadedOrigin(model.read_bytes()) as srv:
        yield srv


async def _holder_and_newcomer(tmp_path, origin, start, end):
    """Node A fetched layers [start, end) from the origin; node B opened the model (header only)."""
    a_store, a_manifest = await async_open_partial(origin.url, tmp_path / "a.partial")
    parts = parts_for(read_header(a_store.header_path), start, end)
    await async_fetch_parts(a_store, a_manifest, parts)
    b_store, b_manifest = await async_open_partial(origin.url, tmp_path / "b.partial")
    return a_store, b_store, b_manifest, parts


async def _same_output(model_path, store, start, end):  # noqa: F811
    x = torch.tensor([3, 1, 4]) if start == 0 else torch.randn(3, SPEC.hidden)
    loop = asyncio.get_running_loop()
    return torch.equal(await loop.run_in_executor(None, _hidden, model_path, start, end, x),
                       await loop.run_in_executor(None, _hidden, store.dir, start, end, x))


async def test_an_honest_peer_costs_the_origin_one_spot_check(tmp_path, model, origin):  # noqa: F811
    a_store, b_store, b_manifest, parts = await _holder_and_newcomer(tmp_path, origin, 2, 5)
    before = origin.sent
    moves = []
    stats = await async_fetch_parts_from(b_store, b_manifest, parts, StoreSource(a_store), origin_url=origin.url,
                                         rng=random.Random(7), progress=lambda d, t: moves.append((d, t)))
    assert moves and moves[-1] == (stats.peer_bytes, stats.peer_bytes)  # the bar reaches 100 %
    assert sorted(stats.parts) == sorted(p for p in parts if p != "globals") and not stats.rejected
    assert stats.spot_checked and not stats.lied
    # the checks (one range per part), nothing else
    assert 0 < origin.sent - before == stats.origin_bytes <= len(stats.parts) * const.PARTIAL_SPOT_CHECK_BYTES
    assert stats.peer_bytes == sum(t.n_bytes for p in stats.parts for t in b_manifest.part_tensors(p))
    assert b_manifest.covers(parts) and not b_manifest.unchecked
    a = a_store.load()
    assert all(b_manifest.tensors[n].sha256 == a.tensors[n].sha256 for n in a.tensors if a.tensors[n].part in parts)
    assert await _same_output(model, b_store, 2, 5)
    # a later origin fetch has nothing to do
    before = origin.sent
    assert (await async_fetch_parts(b_store, b_manifest, parts)).wire_bytes == 0 and origin.sent == before


async def test_bytes_that_do_not_hash_to_the_peers_names_are_refetched_from_the_origin(
        tmp_path, model, origin, caplog):  # noqa: F811
    a_store, b_store, b_manifest, parts = await _holder_and_newcomer(tmp_path, origin, 2, 5)
    source = StoreSource(a_store, flip={"layer-0003"})
    stats = await async_fetch_parts_from(b_store, b_manifest, parts, source, origin_url=origin.url,
                                         rng=random.Random(7))
    assert stats.rejected == ["layer-0003"] and "layer-0003" not in b_manifest.complete
    assert sorted(stats.parts) == ["layer-0002", "layer-0004"] and stats.spot_checked and not stats.lied
    assert "did not hash to what it named" in caplog.text
    assert len(list((b_store.dir / "quarantine").iterdir())) == 1
    before = origin.sent
    fetched = await async_fetch_parts(b_store, b_manifest, parts)  # what the node does next: the origin
    assert fetched.wanted_bytes == sum(t.n_bytes for t in b_manifest.part_tensors("layer-0003"))
    assert origin.sent - before == fetched.wire_bytes == fetched.wanted_bytes
    assert await _same_output(model, b_store, 2, 5)


async def test_a_peer_altering_bytes_and_names_together_is_caught_by_the_spot_check(
        tmp_path, model, origin, caplog):  # noqa: F811
    a_store, b_store, b_manifest, parts = await _holder_and_newcomer(tmp_path, origin, 2, 5)
    layers = [p for p in parts if p.startswith("layer-")]
    source = StoreSource(a_store, flip=set(layers), lie=True)
    stats = await async_fetch_parts_from(b_store, b_manifest, parts, source, origin_url=origin.url,
                                         rng=random.Random(7))
    # its bytes hash to its names: only the origin can tell, and did
    assert stats.lied and stats.spot_checked and stats.parts == [] and sorted(stats.rejected) == layers
    assert not any(p in b_manifest.complete for p in layers)
    assert "do not match the origin" in caplog.text
    before = origin.sent
    fetched = await async_fetch_parts(b_store, b_manifest, parts)
    assert origin.sent - before == fetched.wire_bytes >= sum(t.n_bytes for p in layers
                                                            for t in b_manifest.part_tensors(p))
    assert await _same_output(model, b_store, 2, 5)


async def test_with_the_origin_gone_a_peers_bytes_wait_for_their_check(tmp_path, model, origin):  # noqa: F811
    a_store, b_store, b_manifest, parts = await _holder_and_newcomer(tmp_path, origin, 0, 2)
    stats = await async_fetch_parts_from(b_store, b_manifest, parts, StoreSource(a_store),
                                         origin_url="http://127.0.0.1:1/m.gguf", rng=random.Random(7))
    assert stats.parts and not stats.spot_checked and not stats.lied
    assert b_manifest.unchecked == set(stats.parts)
    assert "not yet checked against the origin" in b_manifest.describe()
    assert b_store.load().unchecked == set(stats.parts)  # on disk: a restart still knows
    assert await _same_output(model, b_store, 0, 2)
    # the origin back: the check runs, they pass, and nothing is refetched
    before = origin.sent
    assert await async_spot_check_held(b_store, b_manifest, origin.url, rng=random.Random(3)) == []
    assert not b_manifest.unchecked and b_manifest.covers(parts)
    assert 0 < origin.sent - before <= len(stats.parts) * const.PARTIAL_SPOT_CHECK_BYTES


async def test_unchecked_parts_that_fail_their_later_check_are_dropped(tmp_path, model, origin):  # noqa: F811
    a_store, b_store, b_manifest, parts = await _holder_and_newcomer(tmp_path, origin, 0, 2)
    taken = [p for p in parts if p != "globals"]  # (B fetched `globals` from the origin when it opened)
    source = StoreSource(a_store, flip=set(taken), lie=True)
    stats = await async_fetch_parts_from(b_store, b_manifest, parts, source,
                                         origin_url="http://127.0.0.1:1/m.gguf", rng=random.Random(7))
    assert b_manifest.unchecked == set(taken) and not stats.spot_checked
    # every 4096th byte altered: any 64 KiB range of them shows it (a 1-in-N chance is not a test)
    dropped = await async_spot_check_held(b_store, b_manifest, origin.url, rng=random.Random(3))
    assert sorted(dropped) == sorted(taken) and not any(p in b_manifest.complete for p in taken)
    await async_fetch_parts(b_store, b_manifest, parts)
    assert await _same_output(model, b_store, 0, 2)


async def test_a_peer_that_stops_inside_a_part_leaves_none_of_that_parts_bytes(tmp_path, model, origin):  # noqa: F811
    a_store, b_store, b_manifest, parts = await _holder_and_newcomer(tmp_path, origin, 2, 5)
    last_of_3 = b_manifest.part_tensors("layer-0003")[-1].name
    # it alters layer 3's bytes (naming the true hashes) and goes before that part's last tensor:
    # nothing of layer 3 may pass to the origin's fetch as if it had been received
    source = StoreSource(a_store, flip={"layer-0003"}, fail_on=last_of_3)
    stats = await async_fetch_parts_from(b_store, b_manifest, parts, source, origin_url=origin.url,
                                         rng=random.Random(7))
    assert stats.parts == ["layer-0002"] and "layer-0003" not in b_manifest.complete
    assert b_store.fetch_state(b_manifest.validator).get(b_manifest.part_tensors("layer-0003")[0].name, 0) == 0
    before = origin.sent
    fetched = await async_fetch_parts(b_store, b_manifest, parts)
    wanted = sum(t.n_bytes for p in ("layer-0003", "layer-0004") for t in b_manifest.part_tensors(p))
    assert fetched.wanted_bytes == wanted and origin.sent - before >= wanted
    assert await _same_output(model, b_store, 2, 5)
