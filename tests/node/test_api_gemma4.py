"""Gemma 4 on the API, through the official `openai` and `anthropic` clients against a real node
serving a tiny random model with Gemma 4's tokens (`<|"|>` shown as text; `<|tool_call>`,
`<|channel>`, the turn marks ... control tokens; llama.cpp ends the generation at `<turn|>` and
`<|tool_response>`) and its real chat template. A random model writes no call by itself: a forced
call's grammar makes it. The reply's split in every chunking is tests/inference/test_tool_formats_all.py's."""

from __future__ import annotations

import json

import aiohttp
import pytest

from node.inference.synth import SynthSpec
from tests.support.nodes import anthropic_client, template, tiny_models_node, token_id

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

SPEC = SynthSpec(n_ctx=2048, gemma4=True, chat_template=template("google-gemma-4-31B-it"), name="gemma4")
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "days"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMS}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


node = tiny_models_node(SPEC)


def bias(node) -> dict[str, int]:
    """A logit_bias that closes the thinking channel as soon as the model opens one, a string as soon
    as it starts (a random model would write one until max_tokens) and the reply after one call with
    `<|tool_response>` (Gemma's wait for the results: it ends the generation)."""
    return {token_id(node, t): 100 for t in ("<channel|>", '<|"|>', "<|tool_response>")}


async def forced(client, model, stream, **kw):
    """(written text, content, thoughts, [(name, arguments)], finish) of one reply."""
    if not stream:
        r = await client.chat.completions.create(model=model, logprobs=True, **kw)
        msg = r.choices[0].message
        written = "".join(t.token for t in r.choices[0].logprobs.content)
        return (written, msg.content, getattr(msg, "reasoning_content", None),
                [(c.function.name, c.function.arguments) for c in msg.tool_calls or []], r.choices[0].finish_reason)
    content = thoughts = None
    finish, parts, written = "", {}, ""
    async with await client.chat.completions.create(model=model, stream=True, logprobs=True, **kw) as events:
        async for chunk in events:
            for c in chunk.choices:
                written += "".join(t.token for t in (c.logprobs.content or [])) if c.logprobs else ""
                content = (content or "") + c.delta.content if c.delta.content else content
                piece = getattr(c.delta, "reasoning_content", None)
                thoughts = (thoughts or "") + piece if piece else thoughts
                for d in c.delta.tool_calls or []:
                    name, args = parts.get(d.index, ("", ""))
                    parts[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
                finish = c.finish_reason or finish
    return written, content, thoughts, list(parts.values()), finish


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_forced_call_is_a_tool_call(node, client, stream, choice):
    """The forced call's grammar writes Gemma's own notation (`<|tool_call>call:get_weather{city:<|"|>
    …<|"|>,days:N}<tool_call|>`, `<|"|>` a token of its own): the client gets the call with its JSON
    arguments, and no markup as content."""
    model = node.models.all()[0].id
    written, content, thoughts, calls, finish = await forced(
        client, model, stream, messages=ASK, tools=[WEATHER], tool_choice=choice, max_tokens=120,
        logit_bias=bias(node))
    assert 'call:get_weather{city:<|"|><|"|>,days:' in written, written  # (control tokens are "" in logprobs)
    assert finish == "tool_calls", written
    assert [name for name, _ in calls] == ["get_weather"], written
    args = json.loads(calls[0][1])
    assert sorted(args) == ["city", "days"] and isinstance(args["days"], int) and isinstance(args["city"], str)
    assert '<|"|>' not in args["city"]
    assert not content
    assert "<|" not in (thoughts or "")


async def test_the_next_turn_renders_the_call_and_its_result(node, client):
    """The call goes back through the template in Gemma's notation and its result as the model's
    `<|tool_response>`; the model answers in the same turn (the template opens no new one)."""
    model = node.models.all()[0].id
    r = await client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                             max_tokens=120, logit_bias=bias(node))
    call = r.choices[0].message.tool_calls[0]
    history = [*ASK, r.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    url = f"http://127.0.0.1:{node.api.port}/apply-template"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as http:
        async with http.post(url, json={"messages": history, "tools": [WEATHER]}) as resp:
            assert resp.status == 200, await resp.text()
            prompt = (await resp.json())["prompt"]
    days = json.loads(call.function.arguments)["days"]
    assert prompt.endswith(f'<|tool_call>call:get_weather{{city:<|"|><|"|>,days:{days}}}<tool_call|>'
                           '<|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>'), prompt
    again = await client.chat.completions.create(model=model, messages=history, tools=[WEATHER], max_tokens=8,
                                                 logit_bias={token_id(node, "<channel|>"): 100})
    assert again.choices[0].finish_reason in ("length", "stop", "tool_calls")
    assert "<|" not in (again.choices[0].message.content or "")


@pytest.fixture
def anthropic_sdk(node):  # (made outside the loop: the SDK builds its types ~1 s at first use)
    return anthropic_client(node)


DAYS = {"name": "forecast", "description": "Forecast", "input_schema": {
    "type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["days"]}}


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_forced_call(node, anthropic_sdk, stream):
    """The Messages route: the forced call is a tool_use block with its input parsed, no markup as
    text, and the next turn (the call and its tool_result) renders and answers."""
    model = node.models.all()[0].id
    kw = dict(model=model, max_tokens=100, messages=[{"role": "user", "content": "Forecast?"}], tools=[DAYS],
              tool_choice={"type": "any", "disable_parallel_tool_use": True}, thinking={"type": "disabled"},
              extra_body={"temperature": 0})
    if stream:
        async with anthropic_sdk.messages.stream(**kw) as events:
            msg = await events.get_final_message()
    else:
        msg = await anthropic_sdk.messages.create(**kw)
    assert [b.type for b in msg.content] == ["tool_use"], msg.content
    call = msg.content[0]
    assert call.name == "forecast" and 1 <= call.input["days"] <= 7
    assert msg.stop_reason == "tool_use"
    history = [*kw["messages"], {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]}]
    again = await anthropic_sdk.messages.create(**{**kw, "messages": history, "tool_choice": {"type": "auto"},
                                                   "max_tokens": 8})
    assert again.stop_reason in ("max_tokens", "end_turn", "tool_use")
    assert all("<|" not in (getattr(b, "text", "") or "") for b in again.content)


async def test_a_turn_with_text_beside_its_calls_opens_the_next_model_turn(node, client):
    """A turn with text beside its call, then the result: the template closes the model's turn
    (`<turn|>`) and, after a tool response, opens none; the model was asked to go on after its own
    turn's end. llama.cpp opens `<|turn>model` there: so does the node, in a run and /apply-template."""
    model = node.models.all()[0].id
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}
    history = [*ASK, {"role": "assistant", "content": "Let me check.", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    url = f"http://127.0.0.1:{node.api.port}/apply-template"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as http:
        async with http.post(url, json={"messages": history, "tools": [WEATHER]}) as resp:
            assert resp.status == 200, await resp.text()
            prompt = (await resp.json())["prompt"]
    assert prompt.endswith("<tool_response|>Let me check.<turn|>\n<|turn>model\n"), prompt
    kw = dict(model=model, tools=[WEATHER], max_tokens=4, temperature=0)
    again = await client.chat.completions.create(messages=history, **kw)
    assert again.usage.prompt_tokens == len(node.models.all()[0].tokenizer.tokenize(prompt, add_bos=False))


ANSWER = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"ok": {"enum": ["yes"]}}, "required": ["ok"], "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True])
async def test_thoughts_without_tools_are_reasoning_content(node, client, stream):
    """No tools, thinking on (Gemma 4's default): the model opens its thoughts with the control token
    `<|channel>` and the text `thought`. The reply's text shows the token, so the thoughts are
    reasoning_content (they were content, "thought…", with the token rendered ""), counted in
    reasoning_tokens, and the thinking budget closes them. A grammar (response_format) leaves room to
    open them (`<|channel>` was masked: the tag compiled as plain text)."""
    model = node.models.all()[0].id
    written, content, thoughts, _, finish = await forced(
        client, model, stream, messages=ASK, response_format=ANSWER, max_tokens=60,
        logit_bias={token_id(node, "<|channel>"): 100}, extra_body={"reasoning_budget_tokens": 4},
        stream_options={"include_usage": True} if stream else None)
    assert finish == "stop", (written, content, thoughts)
    assert json.loads(content) == {"ok": "yes"}, (written, content, thoughts)
    assert thoughts and "thought" not in thoughts[:7] and "<channel|>" not in thoughts, (written, thoughts)


async def test_thought_tokens_are_counted(node, client):
    """usage's reasoning_tokens counts the thoughts: the opening tag's two tokens, the budget's four
    and the closing token."""
    model = node.models.all()[0].id
    r = await client.chat.completions.create(
        model=model, messages=ASK, response_format=ANSWER, max_tokens=60,
        logit_bias={token_id(node, "<|channel>"): 100}, extra_body={"reasoning_budget_tokens": 4})
    assert r.choices[0].message.reasoning_content, r
    assert r.usage.completion_tokens_details.reasoning_tokens >= 6, r.usage
