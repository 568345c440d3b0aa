"""/api/admin/stats' requests_last_minute counts every request finished in the last minute, not at
most the recent ring's size (TRACE_RING_SIZE): a node serving thousands a minute reported 50."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from node import const
from tests.support.nodes import tiny_model
from tests.support.processes import NodeProcess

pytestmark = [pytest.mark.llama, pytest.mark.slow]


def test_requests_last_minute_is_not_capped_by_the_trace_ring(tmp_path):
    proc = NodeProcess(tmp_path / "data", args=["--model", str(tiny_model(tmp_path)), "--no-default-model",
                                                "--n-threads", "1", "--no-mdns"])
    try:
        proc.wait_ready()
        n = const.TRACE_RING_SIZE + 30

        async def go():
            body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            async with aiohttp.ClientSession() as s:
                for _ in range(n):  # each a traced request (404 model_not_found), finished at once
                    async with s.post(proc.base + "/v1/chat/completions", json=body, headers=proc.auth) as r:
                        assert r.status == 404
            return await proc.async_get_json("/api/admin/stats")

        stats = asyncio.run(go())
        assert stats["requests"].get("error", 0) >= n
        assert stats["requests_last_minute"] >= n, stats
    finally:
        proc.terminate()
