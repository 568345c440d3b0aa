"""MiniMax M2 calling tools on the API, through the official `openai` client against a real node
serving a tiny random model whose vocabulary has M2's markers (`<minimax:tool_call>`, `[e~[`, ...) as
control tokens and `<think>`/`</think>`, with M2's real template. A random model writes no calls by
itself: a forced call's grammar writes M2's own format, and a logit_bias on `</think>` closes the
thoughts the generation prompt opened. The format's parsing in every chunking is
tests/inference/test_minimax.py's."""

from __future__ import annotations

import json

import aiohttp
import pytest

from node.inference.synth import SynthSpec
from node.inference.tools.minimax import MARKERS
from tests.support.nodes import template, tiny_models_node, token_id

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

SPEC = SynthSpec(n_ctx=2048, think=True, control_tokens=MARKERS, chat_template=template("MiniMax-M2"), name="m2")
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
    """The forced call's grammar writes M2's format (`<minimax:tool_call>` `<invoke name="get_weather">`
    `<parameter name="city">...`): the client gets a tool call, and none of the markup as content (the
    block's markers are control tokens: the parser sees them all the same); the generation ends after
    the block."""
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
    assert written.startswith("</think>")  # (the control tokens' text is not a logprob's)
    assert '<invoke name="get_weather">\n<parameter name="city">' in written, written
    assert finish == "tool_calls", (written, content)
    assert [name for name, _ in calls] == ["get_weather"]
    assert json.loads(calls[0][1])["city"] in ("Paris", "Rome")
    assert not content


async def test_history_reaches_the_template(node):
    """The tools, a tool-calling turn and its result go back through the template as M2 writes them
    (the generic format's calls as text made this template refuse the result: a 400)."""
    url = f"http://127.0.0.1:{node.api.port}/apply-template"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as http:
        async with http.post(url, json={"messages": history, "tools": [WEATHER]}) as resp:
            assert resp.status == 200, await resp.text()
            prompt = (await resp.json())["prompt"]
    assert "<tools>\n<tool>" in prompt and '"name": "get_weather"' in prompt
    assert (']~b]ai\n\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
            '</invoke>\n</minimax:tool_call>[e~[\n]~b]tool\n<response>sunny</response>[e~[\n') in prompt, prompt
