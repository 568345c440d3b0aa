"""model_hashes.json forgets files that are gone and stays bounded (2026-12-07).

Seen: every path ever hashed stayed in the cache for good, files long deleted or replaced by others
under new names included (a node downloading for weeks). At start, in the executor that reads it,
the records of files gone from a folder that is still there are dropped (a folder missing too may be
a drive not mounted yet: kept), and at most HASH_CACHE_MAX_RECORDS are kept, the least recently
hashed dropped first. A real node serving a real tiny model; the cache file is read back from disk."""

from __future__ import annotations

import json
import logging

from node import const
from node.models.hash_cache import HASH_CACHE_FILE
from tests.support.nodes import node_config, running_node, tiny_model


def record(n: int) -> dict:
    return {"size": n, "mtime_ns": n, "sha256": f"{n:064x}", "origin": f"https://example.com/{n}.gguf"}


async def test_records_of_gone_files_are_dropped_and_the_cache_is_bounded(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="node.models")
    data_dir, models = tmp_path / "data", tmp_path / "models"
    models.mkdir()
    model = tiny_model(models)
    async with running_node(node_config(data_dir, model)):
        pass  # the first run writes the served model's record
    cache_file = data_dir / HASH_CACHE_FILE
    served = json.loads(cache_file.read_text())
    assert list(served) == [str(model.resolve())]
    present = []
    for i in range(3):  # files still there (not models: the node never hashes them)
        path = models / f"kept{i}.bin"
        path.write_bytes(b"x")
        present.append(str(path.resolve()))
    unmounted = str(tmp_path / "not-mounted" / "away.gguf")  # its folder is missing too: kept
    (tmp_path / "mnt").mkdir()  # an fstab mount point before its drive is up: an empty folder (review r51)
    mount_point = str(tmp_path / "mnt" / "big.gguf")
    gone = {str(models / f"deleted{i}.gguf"): record(i) for i in range(200)}
    cache_file.write_text(json.dumps({**{p: record(7) for p in present}, unmounted: record(8),
                                      mount_point: record(9), **gone, **served}))
    monkeypatch.setattr(const, "HASH_CACHE_MAX_RECORDS", 4)
    caplog.clear()
    async with running_node(node_config(data_dir, model)) as node:
        assert node.catalog.entries  # served from its cached record
    after = json.loads(cache_file.read_text())
    assert not set(after) & set(gone)
    # 6 left (3 present, the two not mounted, the served model) for 4 places: the first two listed went,
    # the served model stays with its record as it was
    assert list(after) == [present[2], unmounted, mount_point, str(model.resolve())]
    assert after[str(model.resolve())] == served[str(model.resolve())]
    assert "DIAG: model hash cache records dropped" in caplog.text and "files_gone=200 over_max=2" in caplog.text
    assert "hashed model file" not in caplog.text  # nothing hashed again


async def test_a_record_used_is_the_last_the_bound_drops(tmp_path, monkeypatch):
    """The served model's record, listed first (hashed longest ago), is used at start: a later save
    past the bound (another model added) drops the oldest other record, not the one in use (review
    r51: a test with the used record already last could not tell)."""
    data_dir, models = tmp_path / "data", tmp_path / "models"
    models.mkdir()
    model = tiny_model(models)
    async with running_node(node_config(data_dir, model)):
        pass
    cache_file = data_dir / HASH_CACHE_FILE
    served = json.loads(cache_file.read_text())
    others = []
    for i in range(3):
        path = models / f"kept{i}.bin"
        path.write_bytes(b"x")
        others.append(str(path.resolve()))
    cache_file.write_text(json.dumps({**served, **{p: record(7) for p in others}}))  # 4: none dropped at start
    monkeypatch.setattr(const, "HASH_CACHE_MAX_RECORDS", 4)
    async with running_node(node_config(data_dir, model)) as node:
        second = tiny_model(tmp_path / "more", name="second.gguf")
        await node.model_files.async_add_path(str(second))  # hashed and saved: 5 records for 4 places
    after = json.loads(cache_file.read_text())
    assert list(after) == [*others[1:], str(model.resolve()), str(second.resolve())]
