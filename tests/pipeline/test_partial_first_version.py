"""A partial model made from the swarm's header (no validator yet) whose origin answers, for the
first time, in a fetch or an open: the layers it holds (taken from peers) are kept. In-process: the
holder's real PartServer over a catalog holding the file, PartialModels whose peer requests go to
it, the origin a real HTTP server (tests/support/rangeserver.py). Found in review, 2026-12-06: when
the adopt probe recorded nothing (the origin busy or slow, or stating another sha256), the
origin's first 206 named a validator other than None, taken as "the origin changed": every part
held was removed (layers just taken from peers, layers under loaded slices) and the validator
recorded, adopting a file replaced in place after all; an open of the URL did the same."""

from __future__ import annotations

import logging

import pytest

from node import const
from node.errors import DownloadFailed
from node.inference.pipeline.partials import PartialModels
from node.models.catalog import HashCache, scan_entry
from node.models.partial.layout import PartialStore
from tests.pipeline import test_whole_holder_origin_down as down
from tests.pipeline.test_whole_holder_origin_down import _held_matches, _newcomer, _partials
from tests.support.rangeserver import ThreadedOrigin

holder = down.holder  # (the whole file, its entry, the holder's PartServer)


def _layers(*numbers: int) -> set[str]:
    return {f"layer-{i:04d}" for i in numbers}


async def test_layers_held_stay_when_the_origin_first_answers_in_a_fetch(tmp_path, holder, monkeypatch, caplog):
    path, entry, server = holder
    monkeypatch.setattr(const, "PARTIAL_HELD_PROBE_S", 1e-6)  # the adopt probe never answers in time
    with ThreadedOrigin(path.read_bytes()) as origin:
        origin.linked_etag = entry.sha256  # the Hub: it states the swarm's sha256 (one stating none is not used)
        b = _newcomer(tmp_path, path, entry, origin.url)
        partials = _partials(tmp_path, server, b, origin.url)
        await partials.async_fetch(b, 4, 8)  # from the whole holder
        assert _layers(4, 5, 6, 7) <= set(b.partial.complete) and b.partial.validator is None
        partials.whole_holders = lambda _sha: []  # the holder went: layers 0-3 come from the origin
        with caplog.at_level(logging.INFO):
            await partials.async_fetch(b, 0, 4)
        assert "fetching again from zero" not in caplog.text
        assert _layers(*range(8)) <= set(b.partial.complete)  # 4-7 were removed
        _held_matches(path, b, range(8))
        assert _layers(4, 5, 6, 7) <= set(b.partial.unchecked)  # still to be spot checked
        on_disk = PartialStore(b.path).load()
        assert on_disk.validator == origin.etag and _layers(*range(8)) <= set(on_disk.complete)


async def test_an_origin_holding_another_file_fails_the_fetch_and_removes_nothing(tmp_path, holder, caplog):
    path, entry, server = holder
    with ThreadedOrigin(path.read_bytes()) as origin:
        origin.linked_etag = "f" * 64  # replaced in place on the Hub: same header and size, another file
        b = _newcomer(tmp_path, path, entry, origin.url)
        partials = _partials(tmp_path, server, b, origin.url)
        await partials.async_fetch(b, 4, 8)  # from the whole holder, unchecked
        assert _layers(4, 5, 6, 7) <= set(b.partial.complete)
        partials.whole_holders = lambda _sha: []
        with caplog.at_level(logging.INFO), pytest.raises(DownloadFailed, match="another file"):
            await partials.async_fetch(b, 0, 4)  # fetched layers 0-3 of the other file, removing 4-7
        assert "fetching again from zero" not in caplog.text
        assert b.partial.validator is None and not _layers(0, 1, 2, 3) & set(b.partial.complete)
        assert _layers(4, 5, 6, 7) <= set(b.partial.complete) and _layers(4, 5, 6, 7) <= set(b.partial.unchecked)
        _held_matches(path, b, range(4, 8))
        assert PartialStore(b.path).load().validator is None


@pytest.mark.parametrize("linked", ["the swarm's", None, "another file"])
async def test_an_open_of_the_url_keeps_the_layers_taken_from_peers(tmp_path, holder, linked):
    path, entry, server = holder
    with ThreadedOrigin(path.read_bytes()) as origin:
        origin.unavailable = True  # down while "Help serve" made it from the swarm's header
        made = _newcomer(tmp_path, path, entry, origin.url)
        directory = PartialModels(tmp_path).directory_of(origin.url)  # where async_open_from_swarm puts it
        made.path.rename(directory)
        b = scan_entry(directory, "data_dir", HashCache(None))
        partials = _partials(tmp_path, server, b, origin.url)
        await partials.async_fetch(b, 4, 8)
        assert _layers(4, 5, 6, 7) <= set(b.partial.complete)
        origin.unavailable = False  # then the origin answers: an open (async_open_later's) reads it
        origin.linked_etag = {"the swarm's": entry.sha256, None: None}.get(linked, "f" * 64)
        assert await partials.async_open(origin.url) == directory.resolve()
        held = PartialStore(directory).load()
        assert _layers(4, 5, 6, 7) <= set(held.complete)  # every part was removed
        # recorded for the Hub stating the swarm's sha256 only (2026-12-07: one stating none no more)
        assert held.validator == (origin.etag if linked == "the swarm's" else None)
        _held_matches(path, b, range(4, 8))
