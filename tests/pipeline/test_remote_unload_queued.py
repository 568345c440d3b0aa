"""A forced unload on a whole holder ends the generations it runs for other nodes that are queued
for the model too, as it ends its own queued requests: not one of them runs to its end on the
model after the unload was asked for, and the unload does not wait for them."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from tests.pipeline.swarm import routed_through, run, start_coordinator, start_whole_node
from tests.pipeline.test_remote_generate import whole_model
from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]


async def _stream(s: aiohttp.ClientSession, node: NodeProcess, model_id: str, content: str, seen: list) -> str:
    """"ok" (finished), "error" (an error event, or an error status); each event appended to `seen`."""
    body = {"model": model_id, "messages": [{"role": "user", "content": content}], "max_tokens": 1500,
            "temperature": 0, "stream": True}
    async with s.post(node.base + "/v1/chat/completions", json=body, headers=node.auth) as r:
        if r.status != 200:
            return "error"
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            if line[5:].strip() == "[DONE]":
                return "ok"
            event = json.loads(line[5:])
            seen.append(event)
            if "error" in event:
                return "error"
    return "cut"


def test_a_forced_unload_ends_a_queued_remote_generation(tmp_path):
    model = whole_model(tmp_path)
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "config.toml").write_text("max_concurrent = 1\n")
    h = start_whole_node(tmp_path, "h", model)
    c = start_coordinator(tmp_path, h)
    try:
        async def go():
            model_id = await routed_through(c, h, "whole6")

            async def model_row():
                return (await h.async_get_json("/api/admin/models"))["models"][0]
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
                running_seen, queued_seen = [], []
                running = asyncio.create_task(_stream(s, c, model_id, "the first one", running_seen))
                await wait_until(lambda: len(running_seen) >= 3, 60, 0.02, "the first stream's tokens")
                queued = asyncio.create_task(_stream(s, c, model_id, "the second one", queued_seen))

                async def waiting():
                    return (await model_row())["waiting"] == 1
                await wait_until(waiting, 30, 0.02, "the second generation to queue on the holder")
                assert not running.done()
                started = time.monotonic()
                async with s.post(h.base + f"/api/admin/models/{model_id}/unload?force=1", headers=h.auth) as r:
                    assert r.status == 200, await r.text()
                unload_s = time.monotonic() - started
                outcomes = await asyncio.gather(running, queued)
            assert outcomes == ["error", "error"], (outcomes, len(running_seen), len(queued_seen), unload_s)
            assert unload_s < 5, unload_s  # it waited for no generation to run its course
            assert (await model_row())["state"] == "unloaded"
        run(go())
    finally:
        for p in (c, h):
            p.terminate()
