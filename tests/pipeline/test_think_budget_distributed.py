"""A thinking budget on the distributed route: a random-weight reasoning model (`<think>` tokens,
DeepSeek-R1's template: the reply starts inside the thoughts) split over two real nodes on
127.0.0.1, driven by the official anthropic SDK. The chain's last segment samples, so the budget
must reach it with the sampling parameters: after N tokens of thoughts `</think>` is forced there
and the answer follows, as on the local route."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import anthropic
import pytest

from node.inference.synth import write_gguf
from tests.pipeline.swarm import SPLIT, run, start_slice_node, wait_for_route, wait_peers

pytestmark = [pytest.mark.llama, pytest.mark.slow]

R1 = (Path(__file__).resolve().parent.parent / "fixtures" / "templates"
      / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
ASK = [{"role": "user", "content": "Is the sky blue?"}]


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    base = tmp_path_factory.mktemp("thinkbudget2")
    model = base / "split6-think.gguf"
    write_gguf(model, dataclasses.replace(SPLIT, think=True, chat_template=R1, name="split6-think"))
    a = start_slice_node(base, "a", model, "0-2")
    b = start_slice_node(base, "b", model, "3-5", bootstrap=[a.peer_port])
    try:
        async def ready():
            for p in (a, b):
                await p.async_wait_ready()
            await wait_peers(a, 1)
            return await wait_for_route(a, "split6-think")
        yield a, run(ready())
    finally:
        for p in (a, b):
            p.terminate()


def test_budget_tokens_close_the_thoughts_on_a_chain(swarm):
    a, model_id = swarm
    client = anthropic.Anthropic(base_url=a.base, api_key=a.api_key, max_retries=0, timeout=120)
    kw = dict(model=model_id, max_tokens=24, messages=ASK, extra_body={"temperature": 0})
    free = client.messages.with_raw_response.create(**kw)
    assert free.headers["x-swarm-route"] == "distributed"
    free = free.parse()
    assert [b.type for b in free.content] == ["thinking"] and free.stop_reason == "max_tokens"
    capped = client.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 3})
    assert [b.type for b in capped.content] == ["thinking", "text"], capped.content
    thoughts = capped.content[0].thinking
    assert thoughts and free.content[0].thinking.startswith(thoughts)
    assert len(thoughts) < len(free.content[0].thinking) and capped.content[1].text.strip()
