"""Layers fetched onto a disk without room for them: the fetch wrote until the disk was full
(`OSError: No space left on device`), leaving it full (the bytes are kept to resume), where a
download refuses before anything is written (found on a 30 MB tmpfs data dir, 2026-12-06). The
fetch now compares what it still has to get with the free space first."""

from __future__ import annotations

import shutil

import pytest

from node.errors import DownloadFailed
from node.models.gguf_meta import read_header
from node.models.partial import async_fetch_parts, async_open_partial, parts_for
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.rangeserver import ThreadedOrigin

pytestmark = pytest.mark.usefixtures("fast_retries")


async def test_layers_without_room_on_disk_are_refused_before_a_byte_is_written(tmp_path, model, monkeypatch):  # noqa: F811
    with ThreadedOrigin(model.read_bytes()) as origin:
        store, manifest = await async_open_partial(origin.url, tmp_path / "m.partial")
        parts = parts_for(read_header(store.header_path), 2, 6)
        sent = origin.sent
        usage = shutil.disk_usage(tmp_path)
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1_000_000))
        with pytest.raises(DownloadFailed, match="not enough disk space"):
            await async_fetch_parts(store, manifest, parts)
        assert origin.sent == sent  # nothing asked of the origin
        assert not any(store.part_path(p).exists() for p in parts)
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
        await async_fetch_parts(store, manifest, parts)  # with room, the same fetch goes through
        assert manifest.covers(parts)
