"""gpt-oss (the harmony format) on the API, through the official `openai` client against a real
node serving a tiny random model with gpt-oss's vocabulary tokens (`<|end|>` a control token,
`<|return|>` and `<|call|>` ending the generation) and its real chat template. A random model writes
no harmony by itself: a forced call's grammar makes it, and a logit_bias on `<|end|>` closes the
analysis channel at once. The reply's split in every chunking is tests/inference/test_harmony.py's."""

from __future__ import annotations

import json

import aiohttp
import pytest

from node.inference.synth import SynthSpec
from tests.support.nodes import template, tiny_models_node, token_id

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

SPEC = SynthSpec(n_ctx=2048, harmony=True, chat_template=template("openai-gpt-oss-120b"), name="gptoss")
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


node = tiny_models_node(SPEC)


def end_token(node) -> str:
    return token_id(node, "<|end|>")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_forced_call_is_a_tool_call(node, client, stream, choice):
    """The forced call's grammar writes harmony (room for the analysis channel, then
    `<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{...}`): the client
    gets a tool call, and no channel markup as content."""
    model = node.models.all()[0].id
    kw = dict(model=model, messages=ASK, tools=[WEATHER], tool_choice=choice, max_tokens=200,
              logit_bias={end_token(node): 100})
    if not stream:
        r = await client.chat.completions.create(logprobs=True, **kw)
        written = "".join(t.token for t in r.choices[0].logprobs.content)  # the model's own text
        msg = r.choices[0].message
        content, finish = msg.content, r.choices[0].finish_reason
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        thoughts = getattr(msg, "reasoning_content", None)
    else:
        content = thoughts = None
        finish, parts, written = "", {}, ""
        async with await client.chat.completions.create(stream=True, logprobs=True, **kw) as events:
            async for chunk in events:
                for c in chunk.choices:
                    written += "".join(t.token for t in (c.logprobs.content or [])) if c.logprobs else ""
                    content = (content or "") + (c.delta.content or "") if c.delta.content else content
                    piece = getattr(c.delta, "reasoning_content", None)
                    thoughts = (thoughts or "") + piece if piece else thoughts
                    for d in c.delta.tool_calls or []:
                        name, args = parts.get(d.index, ("", ""))
                        parts[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
                    finish = c.finish_reason or finish
        calls = list(parts.values())
    assert written.startswith("<|channel|>") and "to=functions.get_weather <|constrain|>json<|message|>{" in written
    assert finish == "tool_calls"
    assert [name for name, _ in calls] == ["get_weather"]
    assert json.loads(calls[0][1])["city"] in ("Paris", "Rome")
    assert not content
    assert "<|" not in (thoughts or "")


async def test_history_and_effort_reach_the_template(node):
    """A tool-calling turn and its result go back through the template as gpt-oss was trained on
    (thoughts in `thinking`, the call in the role header), and reasoning_effort sets its system block."""
    url = f"http://127.0.0.1:{node.api.port}/apply-template"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*ASK, {"role": "assistant", "content": None, "reasoning_content": "Look it up.", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as http:
        async with http.post(url, json={"messages": history, "tools": [WEATHER], "reasoning_effort": "high"}) as resp:
            assert resp.status == 200, await resp.text()
            prompt = (await resp.json())["prompt"]
    assert "Reasoning: high" in prompt
    assert ("<|start|>assistant<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant "
            'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
            '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>') in prompt


async def test_response_format_answer_in_the_final_channel(node, client):
    """A response_format's JSON is written in the final channel (after room for the analysis), as
    gpt-oss answers: the client gets the JSON alone as content."""
    model = node.models.all()[0].id
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
              "additionalProperties": False}
    r = await client.chat.completions.create(
        model=model, messages=ASK, max_tokens=200, logprobs=True, logit_bias={end_token(node): 100},
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    written = "".join(t.token for t in r.choices[0].logprobs.content)
    assert "<|channel|>final<|message|>{" in written
    assert json.loads(r.choices[0].message.content)["city"] in ("Paris", "Rome")
    assert r.choices[0].finish_reason == "stop"


async def test_continued_final_message(node, client):
    """A final assistant message to continue (a prefill) is written in the final channel, as
    llama.cpp continues one: the model's `<|end|>` then ends the answer (a plain text prefill after
    `<|start|>assistant` was no message, and everything after it came back as content, `<|end|>` too)."""
    model = node.models.all()[0].id
    r = await client.chat.completions.create(
        model=model, messages=[*ASK, {"role": "assistant", "content": "It is"}], max_tokens=4,
        logit_bias={end_token(node): 100})
    assert r.choices[0].message.content == ""
    assert r.choices[0].finish_reason == "length"


async def test_a_tool_without_description(node, client):
    """The template writes `"// " + description` for each tool: a tool without one (optional at
    OpenAI) was a 400 on every request ("the model's chat template failed to render")."""
    model = node.models.all()[0].id
    bare = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
    r = await client.chat.completions.create(model=model, messages=ASK, tools=[bare], tool_choice="required",
                                             max_tokens=200, logit_bias={end_token(node): 100})
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]


async def test_a_thinking_budget_closes_the_analysis_channel(node, client):
    """`thinking_budget_tokens` on gpt-oss: the analysis channel is its thoughts (`<|channel|>analysis
    <|message|>` … `<|end|>`, llama.cpp's tags for it); with `<|end|>` banned the model would think
    until max_tokens, the budget forces `<|end|>` after 3 tokens and the forced call follows (the
    budget read the harmony splitter, which had no `held`: every such request was a 500)."""
    model = node.models.all()[0].id
    r = await client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=120, logprobs=True,
        logit_bias={end_token(node): -100}, extra_body={"thinking_budget_tokens": 3})
    tokens = [t.token for t in r.choices[0].logprobs.content]
    written = "".join(tokens)
    assert r.choices[0].finish_reason == "tool_calls", written
    assert "to=functions.get_weather" in written
    head = "<|channel|>analysis<|message|>"
    if written.startswith(head):  # the grammar lets the model skip its thoughts; where it thinks, 3 tokens
        opened = next(i for i in range(len(tokens)) if "".join(tokens[:i + 1]).endswith(head))
        assert tokens.index("<|end|>") - opened - 1 <= 3, tokens
