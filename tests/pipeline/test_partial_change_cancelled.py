"""The origin's file changed while layers were fetched (same header and size: the same model id),
and the fetch was stopped — Ctrl-C, a pause, a move — after it had switched to the new version:
the weight cache's conversions of the old bytes were forgotten only once the fetch finished, so
the next start (the validator now the new one's, nothing looks changed) loaded the old version's
conversions over the new bytes. They now go before the new version is recorded."""

from __future__ import annotations

import asyncio

from node import const
from node.inference.pipeline.partials import PartialModels
from node.inference.weights.cache import WeightCache
from node.models.catalog import ModelCatalog
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.rangeserver import ThreadedOrigin


async def test_a_fetch_stopped_after_the_origin_changed_leaves_no_old_conversions(tmp_path, model, monkeypatch):  # noqa: F811
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_BASE_S", 0.01)
    monkeypatch.setattr(const, "DOWNLOAD_PROGRESS_S", 0.0)
    data = model.read_bytes()
    with ThreadedOrigin(data) as origin:
        cache = WeightCache(tmp_path / "cache", 1 << 30)
        partials = PartialModels(tmp_path / "models", cache)
        directory = await partials.async_open(origin.url)
        [entry] = await ModelCatalog(None).async_scan([(directory, "cli")])
        old = cache.root / f"{entry.sha256[:32]}-int8-qgemm1-std-v1"  # the old version's conversions
        old.mkdir(parents=True)
        (old / "layer-0002.bin").write_bytes(b"converted from v1")

        t = entry.partial.tensors["blk.3.attn_q.weight"]
        changed = bytearray(data)
        changed[t.offset + 5] ^= 0xFF  # same header and size: another version of the file
        origin.drop_after = 200_000  # the first range breaks; the file changes before the retry
        origin.change_after = (origin.sent + 1, bytes(changed))
        task, stopped = asyncio.current_task(), []

        def progress(done: int, total: int) -> None:
            if entry.partial.validator == '"v2"' and not stopped:  # on the new version: the user stops it
                stopped.append(True)
                task.cancel()
        try:
            await partials.async_fetch(entry, 2, 5, progress=progress)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
        assert entry.partial.validator == '"v2"'
        assert not old.exists(), "the old version's conversions outlived the switch to the new one"
