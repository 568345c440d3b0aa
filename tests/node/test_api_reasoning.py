"""Reasoning models on /v1/chat/completions (and Anthropic Messages, Responses), through the
official `openai` and `anthropic` clients against a real node: a tiny random model whose vocabulary has `<think>`/`</think>` tokens (as Qwen3's) and whose
chat template is a real reasoning model's (DeepSeek-R1-Distill: the reply starts inside the
thoughts; Qwen3: thoughts of earlier turns read from `reasoning_content`). A random model never
closes its thoughts by itself: a logit_bias on `</think>` makes it, a banned one keeps it thinking."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from node.inference.synth import SynthSpec
from node.inference.tools.deepseek_r1 import MARKERS as R1_MARKERS
from tests.support.nodes import anthropic_client, template, tiny_models_node, token_id

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

R1 = template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B")
QWEN3 = template("Qwen-Qwen3-0.6B")
# (R1's tool-call markers are tokens of its vocabulary: its template's calls are read in its own format)
SPEC = SynthSpec(n_ctx=2048, think=True, control_tokens=R1_MARKERS, chat_template=R1, name="thinker")
ASK = [{"role": "user", "content": "Is the sky blue?"}]


node = tiny_models_node(SPEC, SPEC.replace(chat_template=QWEN3, name="qwen3ish"))


@pytest.fixture
def claude(node):
    return anthropic_client(node)  # (its SDK models built here, off the loop)


def model_id(node, name: str) -> str:
    return next(s.id for s in node.models.all() if s.entry.name == name)


def close_token(node) -> str:
    return token_id(node, "</think>")


async def ask(client, model: str, stream: bool, **kw) -> tuple[str | None, str | None, str, object]:
    """(reasoning_content, content, finish_reason, usage) of one reply, a stream's put back together."""
    if not stream:
        r = await client.chat.completions.create(model=model, messages=kw.pop("messages", ASK), **kw)
        msg = r.choices[0].message
        return getattr(msg, "reasoning_content", None), msg.content, r.choices[0].finish_reason, r.usage
    reasoning = content = None
    finish, usage = "", None
    async with await client.chat.completions.create(model=model, messages=kw.pop("messages", ASK), stream=True,
                                                    stream_options={"include_usage": True}, **kw) as events:
        async for chunk in events:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                piece = getattr(choice.delta, "reasoning_content", None)
                if piece:
                    reasoning = (reasoning or "") + piece
                if choice.delta.content:
                    content = (content or "") + choice.delta.content
                finish = choice.finish_reason or finish
    return reasoning, content, finish, usage


@pytest.mark.parametrize("stream", [False, True])
async def test_thoughts_cut_by_max_tokens_are_reasoning_content(node, client, stream):
    """R1's prompt opens the thoughts: a reply max_tokens cuts before `</think>` is all thoughts,
    the content empty, finish_reason length; reasoning_format "none" keeps them in content, as the
    model wrote them."""
    model = model_id(node, "thinker")
    kw = dict(max_tokens=12, temperature=0, logit_bias={close_token(node): -100})
    raw, raw_content, _, _ = await ask(client, model, stream, extra_body={"reasoning_format": "none"}, **kw)
    assert raw is None and raw_content and raw_content.strip()
    reasoning, content, finish, usage = await ask(client, model, stream, **kw)
    assert reasoning == raw_content.strip()
    assert content in ("", None) and finish == "length"
    assert usage.completion_tokens == usage.completion_tokens_details.reasoning_tokens == 12


@pytest.mark.parametrize("stream", [False, True])
async def test_a_json_answer_comes_after_the_thoughts(node, client, stream):
    """A response_format's grammar leaves room to think: the thoughts are free text up to
    `</think>`, the content is the JSON (until 2026-12-06 the grammar forced JSON at the first
    token, inside the thoughts)."""
    model = model_id(node, "thinker")
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"enum": ["yes", "no"]}}}
    kw = dict(max_tokens=64, temperature=0, response_format=schema, logit_bias={close_token(node): 100})
    _, raw, _, _ = await ask(client, model, stream, extra_body={"reasoning_format": "none"}, **kw)
    assert "</think>" in raw
    reasoning, content, finish, usage = await ask(client, model, stream, **kw)
    assert usage.completion_tokens_details.reasoning_tokens == 1  # `</think>` (the bias): no thoughts before it
    thoughts, answer = raw.split("</think>", 1)
    assert (reasoning or "") == thoughts.strip()
    assert content == answer.strip() and content in ('"yes"', '"no"') and finish == "stop"


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_calls_come_after_the_thoughts(node, client, stream):
    """The tool grammar leaves room to think (the first token is `</think>`: the bias), and the
    tool-call parser reads only the text after it."""
    model = model_id(node, "thinker")
    tool = {"type": "function", "function": {"name": "sky", "parameters": {
        "type": "object", "properties": {"c": {"enum": ["blue"]}}, "required": ["c"], "additionalProperties": False}}}
    kw = dict(max_tokens=120, temperature=0, tools=[tool], tool_choice="required", parallel_tool_calls=False,
              logit_bias={close_token(node): 100}, logprobs=True)
    if stream:
        calls, tokens = {}, []
        async with await client.chat.completions.create(model=model, messages=ASK, stream=True, **kw) as events:
            async for chunk in events:
                if chunk.choices and chunk.choices[0].logprobs:
                    tokens += [t.token for t in chunk.choices[0].logprobs.content]
                for d in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
                    calls.setdefault(d.index, ["", ""])
                    calls[d.index][0] += d.function.name or ""
                    calls[d.index][1] += d.function.arguments or ""
        assert list(calls.values()) == [["sky", '{"c":"blue"}']], calls
        assert tokens[0] == "</think>"
    else:
        r = await client.chat.completions.create(model=model, messages=ASK, **kw)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls"
        assert r.choices[0].logprobs.content[0].token == "</think>"
        assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == [("sky", '{"c":"blue"}')]
        assert "</think>" not in (msg.content or "") and "sky" not in (getattr(msg, "reasoning_content", "") or "")


@pytest.mark.parametrize("stream", [False, True])
async def test_calls_are_read_with_the_thoughts_kept_as_content(node, client, stream):
    """reasoning_format "none" keeps the thoughts in content as written, and the tool-call parser still
    reads only the text after them (found in review: the parser saw `</think>` first and the call
    came back as content)."""
    model = model_id(node, "thinker")
    tool = {"type": "function", "function": {"name": "sky", "parameters": {
        "type": "object", "properties": {"c": {"enum": ["blue"]}}, "required": ["c"], "additionalProperties": False}}}
    kw = dict(model=model, messages=ASK, max_tokens=120, temperature=0, tools=[tool], tool_choice="required",
              parallel_tool_calls=False, logit_bias={close_token(node): 100}, extra_body={"reasoning_format": "none"})
    if stream:
        calls, content = {}, ""
        async with await client.chat.completions.create(stream=True, **kw) as events:
            async for chunk in events:
                delta = chunk.choices[0].delta if chunk.choices else None
                content += (delta.content or "") if delta else ""
                for d in (delta.tool_calls or ()) if delta else ():
                    calls.setdefault(d.index, ["", ""])
                    calls[d.index][0] += d.function.name or ""
                    calls[d.index][1] += d.function.arguments or ""
        got = list(calls.values())
    else:
        r = await client.chat.completions.create(**kw)
        assert r.choices[0].finish_reason == "tool_calls"
        got = [[c.function.name, c.function.arguments] for c in r.choices[0].message.tool_calls]
        content = r.choices[0].message.content or ""
    assert got == [["sky", '{"c":"blue"}']]
    assert content.strip() == "</think>" and "tool_call" not in content


async def test_chat_template_kwargs_reach_the_template(node, client):
    """enable_thinking false: R1's template closes the thoughts in the prompt (one more token), the
    reply is content; unknown kwargs change nothing; a wrong type is a 400 naming it."""
    model = model_id(node, "thinker")
    kw = dict(max_tokens=6, temperature=0, logit_bias={close_token(node): -100})
    reasoning, content, _, usage = await ask(client, model, False, **kw)
    assert reasoning and not content
    off = await ask(client, model, False, extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kw)
    assert off[0] is None and off[1] and off[3].prompt_tokens == usage.prompt_tokens + 1
    same = await ask(client, model, False, extra_body={"chat_template_kwargs": {"colour": "blue"}}, **kw)
    assert same[:2] == (reasoning, content) and same[3].prompt_tokens == usage.prompt_tokens
    effort = await ask(client, model, False, reasoning_effort="none", **kw)  # llama-server's meaning
    assert effort[3].prompt_tokens == usage.prompt_tokens + 1
    for bad, param in (({"enable_thinking": "no"}, "chat_template_kwargs.enable_thinking"),
                       (["enable_thinking"], "chat_template_kwargs"),
                       ({"messages": []}, "chat_template_kwargs.messages")):
        with pytest.raises(openai.BadRequestError) as caught:
            await ask(client, model, False, extra_body={"chat_template_kwargs": bad}, **kw)
        assert caught.value.body["param"] == param, caught.value.body
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(client, model, False, extra_body={"reasoning_format": "thoughts"}, **kw)
    assert caught.value.body["param"] == "reasoning_format"


async def test_history_thoughts_reach_the_template(node, client):
    """An assistant turn's reasoning_content goes to the template: Qwen3's shows the thoughts of
    the turns after the last user message (here a tool call's), so the prompt grows by them."""
    model = model_id(node, "qwen3ish")
    tool = {"type": "function", "function": {"name": "sky", "parameters": {"type": "object", "properties": {}}}}

    def history(thoughts):
        turn = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "sky", "arguments": "{}"}}]}
        if thoughts:
            turn["reasoning_content"] = thoughts
        return [*ASK, turn, {"role": "tool", "tool_call_id": "c1", "content": "blue"}]

    kw = dict(max_tokens=1, temperature=0, tools=[tool])
    plain = (await ask(client, model, False, messages=history(None), **kw))[3].prompt_tokens
    thought = (await ask(client, model, False, messages=history("I must look at the sky"), **kw))[3].prompt_tokens
    assert thought > plain
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(client, model, False, messages=history(["no"]), **kw)
    assert caught.value.body["param"] == "messages[1].reasoning_content"


async def test_apply_template_renders_as_a_run_does(node):
    """llama-server's /apply-template takes chat_template_kwargs and history thoughts too."""
    url = f"http://127.0.0.1:{node.api.port}/apply-template"
    headers = {"Authorization": f"Bearer {node.api_key}"}
    history = [*ASK, {"role": "assistant", "content": "Yes.", "reasoning_content": "Rayleigh."}]
    async with aiohttp.ClientSession(headers=headers) as http:
        async def prompt(model: str, **extra) -> str:
            async with http.post(url, json={"model": model_id(node, model), **extra}) as resp:
                assert resp.status == 200, await resp.text()
                return (await resp.json())["prompt"]

        assert (await prompt("thinker", messages=ASK)).endswith("<think>\n")
        off = await prompt("thinker", messages=ASK, chat_template_kwargs={"enable_thinking": False})
        assert off.endswith("<think>\n</think>")
        assert "<think>\nRayleigh.\n</think>\n\nYes." in await prompt("qwen3ish", messages=history)


# --- Anthropic Messages: thinking blocks -----------------------------------------------------------


async def test_anthropic_thinking_blocks(node, client, claude):
    """The thoughts come as a thinking block with an empty signature, first (stream: thinking_delta
    events and a signature_delta, as the SDK's accumulator expects): the same text the chat route
    puts in reasoning_content for the same greedy reply."""
    model = model_id(node, "thinker")
    reasoning, content, _, _ = await ask(client, model, False, max_tokens=12, temperature=0)
    assert reasoning
    kw = dict(model=model, max_tokens=12, messages=ASK, extra_body={"temperature": 0})
    msg = await claude.messages.create(**kw)
    assert msg.content[0].type == "thinking" and msg.content[0].signature == ""
    assert msg.content[0].thinking == reasoning
    assert [b.text for b in msg.content[1:] if b.type == "text"] == ([content] if content else [])
    kinds = []
    async with claude.messages.stream(**kw) as events:
        async for event in events:
            if event.type == "content_block_delta":
                kinds.append(event.delta.type)
        final = await events.get_final_message()
    assert "thinking_delta" in kinds and "signature_delta" in kinds
    assert final.model_dump()["content"] == msg.model_dump()["content"]
    # thinking disabled: the template closes the thoughts in the prompt (one more token)
    off = await claude.messages.create(**kw, thinking={"type": "disabled"})
    def prompt(m):
        return m.usage.input_tokens + m.usage.cache_read_input_tokens

    assert prompt(off) == prompt(msg) + 1
    assert all(b.type != "thinking" for b in off.content)


async def test_anthropic_history_thinking_reaches_the_template(node, claude):
    """An earlier turn's thinking block is its reasoning_content: Qwen3's template shows it within
    the tool-use loop (after the last user message), so the prompt grows by it."""
    tool = {"name": "sky", "input_schema": {"type": "object", "properties": {}}}

    def history(thoughts):
        blocks = [{"type": "thinking", "thinking": thoughts, "signature": ""}] if thoughts else []
        return [*ASK, {"role": "assistant", "content": [*blocks, {"type": "tool_use", "id": "t1", "name": "sky",
                                                                  "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "blue"}]}]

    model = model_id(node, "qwen3ish")
    plain = await claude.messages.count_tokens(model=model, messages=history(None), tools=[tool])
    thought = await claude.messages.count_tokens(model=model, messages=history("Look up"), tools=[tool])
    assert thought.input_tokens > plain.input_tokens


# --- OpenAI Responses: a reasoning item ------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_reasoning_item(node, client, stream):
    """The thoughts come as a reasoning output item (reasoning_text content), first: the text the
    chat route puts in reasoning_content for the same greedy reply."""
    model = model_id(node, "thinker")
    reasoning, content, _, _ = await ask(client, model, False, max_tokens=16, temperature=0)
    assert reasoning
    kw = dict(model=model, input="Is the sky blue?", max_output_tokens=16, temperature=0)
    if stream:
        deltas, response = [], None
        async with client.responses.stream(**kw) as events:
            async for event in events:
                if event.type == "response.reasoning_text.delta":
                    deltas.append(event.delta)
                if event.type in ("response.completed", "response.incomplete"):  # (max_output_tokens cut it)
                    response = event.response
        assert "".join(deltas) == reasoning
    else:
        response = await client.responses.create(**kw)
    item = response.output[0]
    assert item.type == "reasoning" and [c.text for c in item.content] == [reasoning]
    assert response.output_text == (content or "")


async def test_responses_input_reasoning_and_effort_none_reach_the_template(node, client):
    """A stateless client (store false: Codex CLI) sends the reasoning item back in `input`: it is
    that turn's reasoning_content, which Qwen3's template shows inside a tool loop; `reasoning:
    {effort: "none"}` turns thinking off (found in review: both were dropped)."""
    model = model_id(node, "qwen3ish")
    tool = {"type": "function", "name": "sky", "parameters": {"type": "object", "properties": {}}}
    turn = [{"role": "user", "content": "Is the sky blue?"},
            {"type": "function_call", "call_id": "call_1", "name": "sky", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "blue"}]
    thought = {"type": "reasoning", "id": "rs_1", "summary": [],
               "content": [{"type": "reasoning_text", "text": "I should look at the sky first, carefully."}]}
    kw = dict(model=model, tools=[tool], max_output_tokens=1, temperature=0)
    without = await client.responses.create(input=turn, **kw)
    with_thought = await client.responses.create(input=[turn[0], thought, *turn[1:]], **kw)
    assert with_thought.usage.input_tokens > without.usage.input_tokens + 5
    on = await client.responses.create(input="Is the sky blue?", **kw)
    off = await client.responses.create(input="Is the sky blue?", reasoning={"effort": "none"}, **kw)
    assert off.usage.input_tokens > on.usage.input_tokens  # Qwen3's template closes the thoughts itself


async def test_a_reasoning_item_belongs_to_the_assistant_items_right_after_it():
    """A turn cut while thinking leaves a reasoning item with no answer after it: its thoughts are
    not the next turn's (found in review)."""
    from node.api.openai_responses import _input_messages

    def thought(text):
        return {"type": "reasoning", "content": [{"type": "reasoning_text", "text": text}]}

    def said(text):
        return {"role": "assistant", "content": [{"type": "output_text", "text": text}]}

    cut = _input_messages([{"role": "user", "content": "q1"}, thought("T1"), {"role": "user", "content": "q2"},
                           said("answer two")])
    assert "reasoning_content" not in cut[-1]
    kept = _input_messages([{"role": "user", "content": "q1"}, thought("T1"), said("a1")])
    assert kept[-1]["reasoning_content"] == "T1"
