"""A holder that stops (SIGTERM, Quit) gives the work it runs for other nodes the drain its own
requests get (NODE_DRAIN_S): a chain another node's user streams through it, or a generation on
its whole model, runs to its end rather than being cut the moment the stop starts, which the user
saw as an error mid-reply when no other node held those layers."""

from __future__ import annotations

import json
import signal

import aiohttp
import pytest

from tests.pipeline.swarm import (
    llama_greedy,
    routed_through,
    run,
    split_model,
    start_coordinator,
    start_slice_node,
    start_whole_node,
)
from tests.pipeline.test_remote_generate import whole_model
from tests.support.processes import NodeProcess

pytestmark = [pytest.mark.llama, pytest.mark.slow]

PROMPT = "tell me about the swarm"
TOKENS = {"layers": 200, "whole": 300}  # a stream the stop lands in, short enough to end within
# NODE_DRAIN_S on a loaded machine (600 on the whole model took more than the 5 s in one CI run)


async def _stream_and_stop(c: NodeProcess, h: NodeProcess, model_id: str, tokens: int) -> tuple[str, dict | None, bool]:
    """A greedy stream from c; SIGTERM to h after its fifth chunk. (text, error event, [DONE] seen)."""
    body = {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
            "temperature": 0, "stream": True}
    text, chunks = "", 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s, s.post(
            c.base + "/v1/chat/completions", json=body, headers=c.auth) as r:
        assert r.status == 200, await r.text()
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            if line[5:].strip() == "[DONE]":
                return text, None, True
            event = json.loads(line[5:])
            if "error" in event:
                return text, event, False
            text += "".join((ch.get("delta") or {}).get("content") or "" for ch in event["choices"])
            chunks += 1
            if chunks == 5:
                h.send_signal(signal.SIGTERM)
    return text, None, False


@pytest.mark.parametrize("holder", ["layers", "whole"])
def test_a_stopping_holder_lets_another_nodes_stream_finish(tmp_path, holder):
    if holder == "layers":
        model, name = split_model(tmp_path), "split6"
        h = start_slice_node(tmp_path, "h", model, "0-5")
    else:
        model, name = whole_model(tmp_path), "whole6"
        h = start_whole_node(tmp_path, "h", model)
    c = start_coordinator(tmp_path, h, config="speculative_max_draft = 0\n")  # one token a step
    try:
        async def go():
            model_id = await routed_through(c, h, name)
            return await _stream_and_stop(c, h, model_id, TOKENS[holder])
        text, error, done = run(go())
        assert error is None and done, (error, len(text))
        assert text == llama_greedy(model, PROMPT, TOKENS[holder])
        assert h.proc.wait(30) == 0
        assert "stopping with work for other nodes under way" not in h.node_log()
    finally:
        for p in (c, h):
            p.terminate()
