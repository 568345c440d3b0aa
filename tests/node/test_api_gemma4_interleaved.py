"""Gemma 4's older template (-interleaved) on the API: a real node serving a tiny random model with
Gemma 4's tokens and that template, through the official `openai` client. The template wants each
call's results as `tool_responses` on the call's turn and the answer after them in the same turn
(node.inference.tools.gemma4.gemma4_history merges them): the earlier thoughts and a prefilled reply
must still land where they belong."""

from __future__ import annotations

import aiohttp
import pytest

from node.inference.synth import SynthSpec
from tests.support.nodes import openai_client, template, tiny_models_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

SPEC = SynthSpec(n_ctx=2048, gemma4=True, chat_template=template("google-gemma-4-31B-it-interleaved"), name="gemma4i")
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMS}}


def call(n: int, city: str) -> dict:
    return {"id": f"call_{n}", "type": "function",
            "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}


node = tiny_models_node(SPEC)


@pytest.fixture
def client(node):  # (made outside the loop: the SDK builds its types at first use)
    return openai_client(node)


async def apply_template(node, **body) -> str:
    url = f"http://127.0.0.1:{node.api.port}/apply-template"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as http:
        async with http.post(url, json=body) as resp:
            assert resp.status == 200, await resp.text()
            return (await resp.json())["prompt"]


def n_tokens(node, text: str) -> int:
    return len(node.models.all()[0].tokenizer.tokenize(text, add_bos=False))


async def test_each_call_turn_shows_its_own_thoughts(node, client):
    """A call, its result and the answer after it are one model turn; the next call's turn shows
    the thoughts the client sent with that call. Until 2026-12-06 the thoughts were handed out by
    position after the merge (fewer turns): the second call's turn showed the answer's thoughts."""
    history = [{"role": "user", "content": "Weather in Paris, then Rome?"},
               {"role": "assistant", "content": "", "reasoning_content": "thinking-of-paris", "tool_calls": [call(1, "Paris")]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
               {"role": "assistant", "content": "Paris is sunny.", "reasoning_content": "thinking-of-the-answer"},
               {"role": "assistant", "content": "", "reasoning_content": "thinking-of-rome", "tool_calls": [call(2, "Rome")]},
               {"role": "tool", "tool_call_id": "call_2", "content": "rainy"}]
    prompt = await apply_template(node, messages=history, tools=[WEATHER])
    rome = prompt.index("call:get_weather{city:<|\"|>Rome")
    assert "thinking-of-rome" in prompt[:rome] and "thinking-of-the-answer" not in prompt, prompt
    assert prompt.index("thinking-of-paris") < prompt.index("call:get_weather{city:<|\"|>Paris"), prompt
    r = await client.chat.completions.create(model=node.models.all()[0].id, messages=history,
                                                          tools=[WEATHER], max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens == n_tokens(node, prompt)  # a run renders it so too


@pytest.mark.parametrize("tools", [{}, {"tools": [WEATHER], "tool_choice": "none"}])
async def test_a_prefill_after_tool_results_continues_that_turn(node, client, tools):
    """A chat that ends with the reply's start (a prefill) after a call's results: the prompt is the
    calls and their results, then the prefill. Until 2026-12-06 the history merged the prefill into
    the call's turn and the prefill's removal took the whole turn with it: the model never saw the
    call nor its results."""
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [call(1, "Paris")]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prefill = "The weather in Paris is"
    before = await apply_template(node, messages=history, **tools)
    assert "<|tool_response>response:get_weather{value:<|\"|>sunny<|\"|>}<tool_response|>" in before, before
    r = await client.chat.completions.create(
        model=node.models.all()[0].id, messages=[*history, {"role": "assistant", "content": prefill}],
        max_tokens=2, temperature=0, **tools)
    assert r.usage.prompt_tokens == n_tokens(node, before + prefill), before
