"""A whole holder whose queue is full refuses a coordinator's GENERATE (`overloaded`): the client of
the coordinator gets the holder's 429 with Retry-After, as it would asking the holder itself, not a
503 saying no peer holds the model (the holder is connected and serving; it is only busy)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.pipeline.swarm import routed_through, run, start_coordinator, start_whole_node
from tests.pipeline.test_remote_generate import whole_model

pytestmark = [pytest.mark.llama, pytest.mark.slow]


def test_a_busy_holder_gives_the_coordinators_client_a_429_not_a_503(tmp_path):
    model = whole_model(tmp_path)
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.toml").write_text("max_queue_per_model = 1\nmax_concurrent = 1\n")
    h = start_whole_node(tmp_path, "h", model)
    c = start_coordinator(tmp_path, h)
    try:
        async def go():
            model_id = await routed_through(c, h, "whole6")

            async def one(s, i):
                body = {"model": model_id, "messages": [{"role": "user", "content": f"hello {i}"}],
                        "max_tokens": 40, "temperature": 0}
                async with s.post(c.base + "/v1/chat/completions", json=body, headers=c.auth) as r:
                    return r.status, dict(r.headers), await r.text()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
                results = await asyncio.gather(*[one(s, i) for i in range(8)])
            statuses = sorted(r[0] for r in results)
            assert 200 in statuses, results
            assert 503 not in statuses, [r for r in results if r[0] != 200]
            busy = [r for r in results if r[0] == 429]
            assert busy, statuses  # one running + one queued: the rest are refused
            for _status, headers, text in busy:
                assert '"overloaded"' in text and headers.get("Retry-After") == "1", (headers, text)
        run(go())
    finally:
        for p in (c, h):
            p.terminate()
