"""A partial model made from the swarm's header (no validator yet) fetching layers from a peer that
holds the whole file, while its origin is down or hung, or answers for a file replaced in place.
In-process: the holder's real PartServer over a catalog holding the file, PartialModels whose peer
requests go to it, the origin a real HTTP server (tests/support/rangeserver.py). Found in review,
2026-12-06: an origin answering 503/429 made the fetch raise `_Retry: HTTP 503` before any peer was
asked; a hung origin cost a full read timeout on every round, under the PartialModels lock; a Hub
file replaced in place (same header and size, another sha256) was adopted and its bytes taken
under the old id. 2026-12-07 (review 39): one stating no sha256 at all, with other bytes, likewise."""

from __future__ import annotations

import asyncio
import hashlib
import logging

import pytest

from node import const
from node.errors import DownloadFailed
from node.inference.pipeline.part_server import PartServer
from node.inference.pipeline.partials import PartialModels
from node.inference.synth import write_gguf
from node.models.catalog import HashCache, scan_entry
from node.models.download.urls import display_url, resolve_url
from node.models.partial.fetch import async_fetch_parts, async_open_partial
from node.models.partial.fromheader import async_adopt_origin, create_from_header
from node.models.partial.layout import PartialStore
from tests.pipeline.test_autoserve import AUTO8
from tests.pipeline.test_whole_parts_bound import _Catalog, _Peers
from tests.support.rangeserver import ThreadedOrigin, other_bytes


@pytest.fixture
def holder(tmp_path, monkeypatch):
    """The whole file, its catalog entry, the holder's PartServer (one layer hashed per request:
    several rounds for one fetch)."""
    path = write_gguf(tmp_path / "auto8.gguf", AUTO8)
    entry = scan_entry(path, "cli", HashCache(None))
    layer = sum(t.n_bytes for t in entry.header.tensors if t.name.startswith("blk.0."))
    monkeypatch.setattr(const, "PARTIAL_WHOLE_HASH_BYTES", layer)
    return path, entry, PartServer(_Catalog(entry))


def _newcomer(tmp_path, path, entry, url):
    header = path.read_bytes()[:entry.header.data_offset]
    directory = create_from_header(tmp_path / "b.partial", header, entry.header, sha256=entry.sha256,
                                   header_sha256=hashlib.sha256(header).hexdigest(),
                                   size_bytes=entry.size_bytes, origin_url=display_url(resolve_url(url)))
    return scan_entry(directory, "data_dir", HashCache(None))


def _partials(tmp_path, server, newcomer, url) -> PartialModels:
    partials = PartialModels(tmp_path)
    partials.attach(_Peers(server), lambda _sha: [], lambda _sha: ["a" * 64])
    partials._urls[newcomer.path] = url  # (the URL as given, as async_open_from_swarm records it)
    return partials


def _held_matches(path, newcomer, layers) -> None:
    data = path.read_bytes()
    for t in newcomer.partial.tensors.values():
        if t.part in {f"layer-{i:04d}" for i in layers}:
            held = (newcomer.path / "parts" / f"{t.part}.bin").read_bytes()
            assert held[t.local:t.local + t.n_bytes] == data[t.offset:t.offset + t.n_bytes], t.name


async def test_an_origin_answering_503_does_not_stop_the_layers_coming_from_the_whole_holder(tmp_path, holder):
    path, entry, server = holder
    with ThreadedOrigin(path.read_bytes()) as origin:
        origin.unavailable = True  # the Hub down, or rate limiting (429/5xx)
        b = _newcomer(tmp_path, path, entry, origin.url)
        partials = _partials(tmp_path, server, b, origin.url)
        await partials.async_fetch(b, 0, 4)  # raised `_Retry: HTTP 503`, no peer asked
        layers = {f"layer-{i:04d}" for i in range(4)}
        assert layers <= set(b.partial.complete) and layers <= set(b.partial.unchecked)
        _held_matches(path, b, range(4))
        # the adopt probe once; then, with the origin failed, no round asked it again
        assert origin.requests == 1, origin.requests


async def test_a_hung_origin_is_waited_for_once_per_fetch_and_briefly(tmp_path, holder, monkeypatch):
    path, entry, server = holder
    monkeypatch.setattr(const, "PARTIAL_HELD_PROBE_S", 0.5)
    with ThreadedOrigin(path.read_bytes()) as origin:
        origin.hold_answers = True  # accepts, never answers (a proxy holding the request)
        b = _newcomer(tmp_path, path, entry, origin.url)
        partials = _partials(tmp_path, server, b, origin.url)
        # a deadline, not a speed: each round waited the 60 s read timeout (10 rounds: ~11 min)
        await asyncio.wait_for(partials.async_fetch(b, 0, AUTO8.n_layers), 45)
        assert b.partial.covers([f"layer-{i:04d}" for i in range(AUTO8.n_layers)])
        assert origin.requests == 1, origin.requests


async def test_an_origin_stating_another_sha256_is_not_adopted(tmp_path, holder, caplog):
    path, entry, _server = holder
    with ThreadedOrigin(path.read_bytes()) as origin:
        origin.linked_etag = "f" * 64  # replaced in place on the Hub: same header and size, another file
        b = _newcomer(tmp_path, path, entry, origin.url)
        with caplog.at_level(logging.INFO):
            assert await async_adopt_origin(PartialStore(b.path), b.partial, origin.url) is False
        assert b.partial.validator is None and "answers for another file" in caplog.text
        origin.linked_etag = entry.sha256  # the same file: adopted
        assert await async_adopt_origin(PartialStore(b.path), b.partial, origin.url) is True
        assert b.partial.validator == origin.etag


async def test_an_origin_back_stating_no_sha256_is_never_used_for_the_swarms_file(tmp_path, holder, caplog):
    """Review 39 finding 1 on the older path (2026-12-07): the origin down when B opened the swarm's
    model, then back with the same header and size but other tensor bytes and no sha256 stated (a
    plain server, a GitHub release, S3). Its version was recorded, the holder's layers failed the spot
    check against it (lied, distrusted) and its bytes were fetched under the swarm's sha256."""
    path, entry, server = holder
    real = path.read_bytes()
    with ThreadedOrigin(real) as origin:
        origin.unavailable = True
        b = _newcomer(tmp_path, path, entry, origin.url)
        partials = _partials(tmp_path, server, b, origin.url)
        await partials.async_fetch(b, 0, 4)  # from the holder, the origin down
        offset = entry.header.data_offset
        origin.data, origin.etag = other_bytes(real, offset), '"v2"'
        origin.unavailable = False
        with caplog.at_level(logging.INFO):
            await partials.async_fetch(b, 0, AUTO8.n_layers)
        assert b.partial.covers([f"layer-{i:04d}" for i in range(AUTO8.n_layers)])
        _held_matches(path, b, range(AUTO8.n_layers))  # the swarm's bytes only, none of the origin's
        assert not partials._distrusted and "lied=True" not in caplog.text  # the honest holder trusted
        assert b.partial.validator is None and "states no sha256, not used" in caplog.text
        assert PartialStore(b.path).load().validator is None


async def test_a_first_answer_stating_no_sha256_is_not_taken_for_the_swarms_file(tmp_path, holder):
    """The adopt probe got no answer, the fetch's first does, with no sha256: nothing is fetched."""
    path, entry, _server = holder
    real = path.read_bytes()
    offset = entry.header.data_offset
    with ThreadedOrigin(other_bytes(real, offset)) as origin:
        b = _newcomer(tmp_path, path, entry, origin.url)
        with pytest.raises(DownloadFailed, match="another file"):
            await async_fetch_parts(PartialStore(b.path), b.partial, ["layer-0000"], url=origin.url)
        assert b.partial.validator is None and not b.partial.complete & {"layer-0000"}
        assert not (b.path / "parts" / "layer-0000.bin").exists()


async def test_reopening_at_an_origin_stating_no_sha256_records_nothing(tmp_path, holder):
    """The open of the URL (a restart, --model) meets the swarm's model made from its header: an
    origin stating no sha256 has its version recorded for it no more than the fetch does."""
    path, entry, _server = holder
    real = path.read_bytes()
    offset = entry.header.data_offset
    with ThreadedOrigin(other_bytes(real, offset)) as origin:
        b = _newcomer(tmp_path, path, entry, origin.url)
        _store, manifest = await async_open_partial(origin.url, b.path)
        assert manifest.sha256 == entry.sha256 and manifest.validator is None
        assert PartialStore(b.path).load().validator is None
