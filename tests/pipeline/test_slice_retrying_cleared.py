"""A slice loading again after a failed load carries that load's error (`HostedSlice.retrying`, the
app keeps the failure shown meanwhile); it was never cleared, so GET /api/admin/models said
{"state": "loaded", "retrying": "<old error>"} for a slice that loaded fine (2026-12-07, review r27)."""

from __future__ import annotations

import aiohttp
import pytest

from tests.support.nodes import node_config, running_node, tiny_model

pytestmark = pytest.mark.asyncio


async def test_a_slice_that_loaded_after_a_failed_one_says_no_retrying(tmp_path):
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "data", model)) as node:
        entry = node.catalog.resolve("tiny")
        hosted = await node.slice_host.async_load(entry, 0, 1, retrying="the last load's error")
        assert hosted.state == "loaded" and hosted.retrying is None
        async with aiohttp.ClientSession() as s, s.get(
                f"http://127.0.0.1:{node.api.port}/api/admin/models",
                headers={"Authorization": f"Bearer {node.api_key}"}) as r:
            body = await r.json()
        rows = [m for m in body["models"] if m.get("layers_held") == [0, 1]]
        assert rows and rows[0]["state"] == "loaded" and rows[0]["retrying"] is None, rows
