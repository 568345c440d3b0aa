"""DeepSeek R1 (its distills) calling tools on the API, through the official `openai` client against a
real node serving a tiny random model whose vocabulary has R1's call markers as control tokens and
`<think>`/`</think>`, with R1-Distill-Qwen's real template. A random model writes no calls by itself:
a forced call's grammar writes R1's own format, and a logit_bias on `</think>` closes the thoughts the
generation prompt opened. The format's parsing in every chunking is tests/inference/test_deepseek_r1.py's."""

from __future__ import annotations

import json

import aiohttp
import pytest

from node.inference.synth import SynthSpec
from node.inference.tools.deepseek_r1 import MARKERS
from tests.support.nodes import template, tiny_models_node, token_id

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

SPEC = SynthSpec(n_ctx=2048, think=True, control_tokens=MARKERS, name="r1",
                 chat_template=template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"))
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


node = tiny_models_node(SPEC)


def close_thoughts(node) -> dict[str, int]:
    return {token_id(node, "</think>"): 100}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_forced_call_is_a_tool_call(node, client, stream, choice):
    """The forced call's grammar writes R1's format (`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
    <｜tool▁sep｜>get_weather` and a fenced JSON block): the client gets a tool call, and none of the
    markup as content (the markers are control tokens: the parser sees them all the same)."""
    model = node.models.all()[0].id
    kw = dict(model=model, messages=ASK, tools=[WEATHER], tool_choice=choice, max_tokens=200,
              logit_bias=close_thoughts(node), parallel_tool_calls=False)
    if not stream:
        r = await client.chat.completions.create(logprobs=True, **kw)
        written = "".join(t.token for t in r.choices[0].logprobs.content)  # the model's own text
        msg = r.choices[0].message
        content, finish = msg.content, r.choices[0].finish_reason
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    else:
        content, finish, parts, written = None, "", {}, ""
        async with await client.chat.completions.create(stream=True, logprobs=True, **kw) as events:
            async for chunk in events:
                for c in chunk.choices:
                    written += "".join(t.token for t in (c.logprobs.content or [])) if c.logprobs else ""
                    content = (content or "") + c.delta.content if c.delta.content else content
                    for d in c.delta.tool_calls or []:
                        name, args = parts.get(d.index, ("", ""))
                        parts[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
                    finish = c.finish_reason or finish
        calls = list(parts.values())
    assert written.startswith("</think>") and "function" in written  # (the control tokens' text is not a logprob's)
    assert "get_weather\n```json\n{" in written, written
    assert finish == "tool_calls"
    assert [name for name, _ in calls] == ["get_weather"]
    assert json.loads(calls[0][1])["city"] in ("Paris", "Rome")
    assert not content


async def test_history_reaches_the_template(node):
    """The tools (the distill's template shows none), a tool-calling turn and its result go back
    through the template as R1 writes them."""
    url = f"http://127.0.0.1:{node.api.port}/apply-template"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as http:
        async with http.post(url, json={"messages": history, "tools": [WEATHER]}) as resp:
            assert resp.status == 200, await resp.text()
            prompt = (await resp.json())["prompt"]
    assert "You can call any of the following function tools" in prompt and '"name": "get_weather"' in prompt
    assert ('<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
            '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
            "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>") in prompt, prompt
