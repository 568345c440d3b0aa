"""A model whose file was overwritten in place since it was hashed is not loaded under its old id
(review of 2026-12-06): not by Load (admin API, the GUI), not on demand by a request. Before, the
new bytes came up under the old id and sha256 (with the old file's tokenizer) and were advertised
to peers as that model: within the watch's interval for a file in models/, for good for one outside
it (`--model PATH`, added by path). A loaded model whose file the watch saw changed is not
advertised. A real node; the admin API and the official openai client ask."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import aiohttp
import openai
import pytest

from node.inference.adverts import model_adverts
from node.inference.synth import write_gguf
from tests.pipeline.test_held_file_changed import OTHER, _downloaded, _overwrite
from tests.support.nodes import TINY, node_config, openai_client, running_node

pytestmark = [pytest.mark.llama]

MINE = dataclasses.replace(TINY, seed=21, name="mine")  # a file outside the models folder
MINE_NEW = dataclasses.replace(MINE, seed=23)  # the same size, other bytes


async def _load(node, model_id: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{node.api.port}/api/admin/models/{model_id}/load",
                                                    headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status, await r.json()


async def test_an_overwritten_file_is_not_loaded_under_its_old_id(tmp_path):
    data_dir = tmp_path / "data"
    inside, inside_sha = _downloaded(data_dir)
    outside = write_gguf(tmp_path / "mine.gguf", MINE)
    # the watch does not look meanwhile (its interval: a Load within it, as a user's would be)
    async with running_node(node_config(data_dir, outside, models_watch_s=3600.0)) as node:
        ids = {e.path: e.id for e in node.catalog.entries.values()}
        client = await asyncio.to_thread(openai_client, node)  # (its TLS context is made off the loop)
        for path in (inside, outside):
            served = node.models.get(ids[path.resolve()])
            if served.state == "loaded":
                await node.models.async_unload(served.id)
        await asyncio.to_thread(_overwrite, inside, OTHER)
        await asyncio.to_thread(_overwrite, outside, MINE_NEW)
        for path, then in ((inside, "read again as a new model"), (outside, "add it again")):
            status, body = await _load(node, ids[path.resolve()])
            assert status == 503 and "changed on disk" in body["error"]["message"] \
                and then in body["error"]["message"], (status, body)
            with pytest.raises(openai.APIStatusError) as refused:  # a request's on-demand load
                await client.chat.completions.create(
                    model=ids[path.resolve()], messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            assert refused.value.status_code == 503 and "changed on disk" in refused.value.message
            assert node.models.get(ids[path.resolve()]).state != "loaded"
        # the watch's look: the file outside the folder is marked changed, and stays refused
        await node.model_files.watcher.async_look()
        assert node.catalog.entries[ids[outside.resolve()]].changed
        status, body = await _load(node, ids[outside.resolve()])
        assert status == 503 and "add it again" in body["error"]["message"], (status, body)
        assert inside_sha not in {e.sha256 for e in node.catalog.entries.values()}  # read again, as new


async def test_a_loaded_model_whose_file_changed_is_not_advertised(tmp_path):
    data_dir = tmp_path / "data"
    outside = write_gguf(tmp_path / "mine.gguf", MINE)
    async with running_node(node_config(data_dir, outside, models_watch_s=3600.0)) as node:
        [entry] = node.catalog.entries.values()
        await node.models.async_load(entry.id)
        adverts = lambda: {a["sha256"] for a in model_adverts(  # noqa: E731
            node.catalog, node.models, node.slice_host, contribute=True)}
        assert entry.sha256 in adverts()
        await asyncio.to_thread(_overwrite, outside, MINE_NEW)
        await node.model_files.watcher.async_look()
        assert entry.changed and node.models.get(entry.id).state == "loaded"
        assert entry.sha256 not in adverts()


async def test_a_touched_file_is_hashed_again_and_loads_under_its_id(tmp_path):
    """Its mtime changed, its bytes did not (`touch`, a backup tool): it is the same model."""
    data_dir = tmp_path / "data"
    outside = write_gguf(tmp_path / "mine.gguf", MINE)
    async with running_node(node_config(data_dir, outside, models_watch_s=3600.0)) as node:
        [entry] = node.catalog.entries.values()
        if node.models.get(entry.id).state == "loaded":
            await node.models.async_unload(entry.id)
        st = outside.stat()
        os.utime(outside, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        status, body = await _load(node, entry.id)
        assert status == 200 and body["model"]["sha256"] == entry.sha256, (status, body)
        assert entry.hashed_stat == (st.st_size, st.st_mtime_ns + 10**9) and not entry.changed
