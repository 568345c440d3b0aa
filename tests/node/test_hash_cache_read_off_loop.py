"""model_hashes.json is read in an executor at start, not on the event loop where the Node is built:
read_data_file pauses and reads again when the file is locked for a moment (an antivirus, a sync tool),
and in the tray app the loop is the GUI's. Until 2026-12-07 ModelCatalog's constructor read it."""

from __future__ import annotations

import threading

import node.models.hash_cache as hash_cache
from tests.support.nodes import node_config, running_node, tiny_model


async def test_the_hash_cache_is_read_off_the_loop(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    model = tiny_model(tmp_path)
    async with running_node(node_config(data_dir, model)):
        pass  # the first run writes model_hashes.json
    assert (data_dir / hash_cache.HASH_CACHE_FILE).is_file()
    readers: list[int] = []
    real = hash_cache.read_data_file

    def recording(path, **kw):
        if path.name == hash_cache.HASH_CACHE_FILE:
            readers.append(threading.get_ident())
        return real(path, **kw)

    monkeypatch.setattr(hash_cache, "read_data_file", recording)
    loop_thread = threading.get_ident()
    async with running_node(node_config(data_dir, model)) as node:
        assert node.catalog.entries  # served from the cached hash
    assert readers, "model_hashes.json was not read"
    assert loop_thread not in readers
