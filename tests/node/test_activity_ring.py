"""The report's recent activity keeps const.ACTIVITY_RING_SIZE lines, the oldest dropped first
(the node hard-coded 100 and the constant was read by nothing)."""

from __future__ import annotations

import aiohttp

from node import const
from tests.support.nodes import node_config, running_node


async def test_recent_activity_honours_activity_ring_size(tmp_path, monkeypatch):
    monkeypatch.setattr(const, "ACTIVITY_RING_SIZE", 5)
    async with running_node(node_config(tmp_path / "data")) as node:
        for i in range(12):
            node.note_activity(f"event {i:02d}")
        assert [line.split(" ", 1)[1] for line in node.activity] == [f"event {i:02d}" for i in range(7, 12)]
        url = f"http://127.0.0.1:{node.api.port}/api/admin/diagnostics"
        async with aiohttp.ClientSession() as s, \
                s.get(url, headers={"Authorization": f"Bearer {node.api_key}"}) as r:
            assert r.status == 200
            section = (await r.text()).split("-- recent activity --")[1]
    assert [f"event {i:02d}" in section for i in range(12)] == [False] * 7 + [True] * 5
