""""Pause contributing" on a node serving `--layers` frees its slices after the sessions running on
them end (ARCHITECTURE, the desktop app: "frees every slice after its sessions end"), as it does for
slices the automatic choice took: a chat another node's user is streaming through it runs to its
end (same greedy text) rather than ending with an error the moment the holder pauses; new ones are
refused, and after a resume the holder serves again."""

from __future__ import annotations

import json

import aiohttp
import pytest

from tests.pipeline.swarm import (
    chat,
    llama_greedy,
    routed_through,
    run,
    split_model,
    start_coordinator,
    start_slice_node,
    wait_for_route,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

PROMPT = "tell me about the swarm"
TOKENS = 200


def test_a_pause_lets_a_running_chain_through_a_layers_holder_finish(tmp_path):
    model = split_model(tmp_path)
    h = start_slice_node(tmp_path, "h", model, "0-5")
    c = start_coordinator(tmp_path, h, config="speculative_max_draft = 0\n")  # one token a step: a long stream
    try:
        async def go():
            model_id = await routed_through(c, h, "split6")
            body = {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS,
                    "temperature": 0, "stream": True}
            text, error, done, chunks = "", None, False, 0
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
                async with s.post(c.base + "/v1/chat/completions", json=body, headers=c.auth) as r:
                    assert r.status == 200, await r.text()
                    async for raw in r.content:
                        line = raw.decode().strip()
                        if not line.startswith("data:"):
                            continue
                        if line[5:].strip() == "[DONE]":
                            done = True
                            break
                        event = json.loads(line[5:])
                        if "error" in event:
                            error = event
                            break
                        text += "".join((ch.get("delta") or {}).get("content") or "" for ch in event["choices"])
                        chunks += 1
                        if chunks == 5:
                            async with s.post(h.base + "/api/admin/contribute", json={"paused": True},
                                              headers=h.auth) as p:
                                assert p.status == 200, await p.text()
                assert error is None and done, (error, chunks)
                status, _headers, refused = await chat(c, model_id, "a new one", max_tokens=8)
                assert status == 503, (status, refused)  # paused: no new sessions for others

                async def freed():
                    rows = (await h.async_get_json("/api/admin/models"))["models"]
                    return not any(m.get("layers_held") for m in rows)
                await wait_until(freed, 30, 0.1, "the paused holder to free its slice once the chain ended")
                async with s.post(h.base + "/api/admin/contribute", json={"paused": False}, headers=h.auth) as p:
                    assert p.status == 200, await p.text()
            assert await wait_for_route(c, "split6") == model_id
            status, _headers, again = await chat(c, model_id, PROMPT, max_tokens=TOKENS)
            assert status == 200, again
            return text, again
        text, again = run(go())
        assert text == again, (text, again)
        assert text == llama_greedy(model, PROMPT, TOKENS)
    finally:
        for p in (c, h):
            p.terminate()
