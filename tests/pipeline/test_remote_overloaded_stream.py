"""A streamed request a coordinator cannot place because its whole holder's queue is full gets the
holder's 429 with Retry-After as its HTTP status, as a streamed request made at the holder itself
does (admission comes before the stream there), not a 200 whose only event is an `overloaded`
error: the OpenAI and Anthropic SDKs retry a 429 on their own, an error event mid-stream they raise."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.pipeline.swarm import routed_through, run, start_coordinator, start_whole_node
from tests.pipeline.test_remote_generate import whole_model
from tests.support.processes import NodeProcess

pytestmark = [pytest.mark.llama, pytest.mark.slow]


async def _streamed(s: aiohttp.ClientSession, node: NodeProcess, model_id: str, i: int) -> tuple[int, dict, str]:
    """(HTTP status, headers, "ok" | the error event's code | the error body) of one greedy stream."""
    body = {"model": model_id, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 40,
            "temperature": 0, "stream": True}
    async with s.post(node.base + "/v1/chat/completions", json=body, headers=node.auth) as r:
        if r.status != 200:
            return r.status, dict(r.headers), await r.text()
        async for raw in r.content:
            line = raw.decode().strip()
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                event = json.loads(line[5:])
                if "error" in event:
                    return r.status, dict(r.headers), event["error"].get("code") or "error"
        return r.status, dict(r.headers), "ok"


def test_a_busy_holder_gives_a_streaming_client_of_a_coordinator_a_429(tmp_path):
    model = whole_model(tmp_path)
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.toml").write_text("max_queue_per_model = 1\nmax_concurrent = 1\n")
    h = start_whole_node(tmp_path, "h", model)
    c = start_coordinator(tmp_path, h)
    try:
        async def go():
            model_id = await routed_through(c, h, "whole6")
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
                results = await asyncio.gather(*[_streamed(s, c, model_id, i) for i in range(8)])
            assert any(r[0] == 200 and r[2] == "ok" for r in results), results
            # one running + one queued: the rest are refused, each with the status a client retries
            refused = [r for r in results if r[2] != "ok"]
            assert refused, results
            for status, headers, text in refused:
                assert status == 429, (status, text)
                assert '"overloaded"' in text and headers.get("Retry-After") == "1", (headers, text)
        run(go())
    finally:
        for p in (c, h):
            p.terminate()
