"""A reply that max_tokens cuts inside a tool call (official SDKs, the default model: the generic
format, forced by tool_choice required): no call markup in the content, the unfinished call
returned as far as it was written (OpenAI's and llama-server's answer; finish_reason length /
stop_reason max_tokens), a stream and a whole reply alike. Until 2026-12-06 the raw JSON of the
call came back as the message's content."""

from __future__ import annotations

import json

import pytest

from tests.support.nodes import anthropic_client, default_model_node, openai_client

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": CITY}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
# cut before the call's name is written (3), inside it (15), and inside its arguments (30, 34)
CUTS = (3, 15, 30, 34)

node = default_model_node("tool-call-cut")


@pytest.fixture
def oai(node):
    return openai_client(node)


@pytest.fixture
def claude(node):
    return anthropic_client(node)


@pytest.fixture
def model(node):
    return node.models.all()[0].id


async def chat(client, model: str, max_tokens: int, stream: bool,
               **extra) -> tuple[str | None, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish_reason), a stream's pieces put together as clients do."""
    kwargs = dict(model=model, messages=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                  max_tokens=max_tokens, temperature=0, **extra)
    if not stream:
        reply = await client.chat.completions.create(**kwargs)
        msg = reply.choices[0].message
        return msg.content or None, [(c.function.name, c.function.arguments) for c in msg.tool_calls or []], \
            reply.choices[0].finish_reason
    content, calls, finish = "", {}, None
    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            if piece.id is not None:
                calls[piece.index] = [piece.function.name, piece.function.arguments or ""]
            else:
                calls[piece.index][1] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content or None, [tuple(calls[k]) for k in sorted(calls)], finish


async def test_chat_cut_inside_a_call_returns_no_markup_and_the_call_so_far(oai, model):
    client = oai
    _, whole_calls, finish = await chat(client, model, 160, stream=False)
    assert finish == "tool_calls" and len(whole_calls) == 1
    name, arguments = whole_calls[0]
    named = 0
    for max_tokens in CUTS:
        whole = await chat(client, model, max_tokens, stream=False)
        streamed = await chat(client, model, max_tokens, stream=True)
        assert whole == streamed, max_tokens
        content, calls, finish = whole
        assert finish == "length" and content is None, whole  # never the call's JSON as text
        assert len(calls) <= 1
        if calls:  # once its name is written: the call, its arguments as far as they go
            named += 1
            assert calls[0][0] == name and arguments.startswith(calls[0][1]) and calls[0][1] != arguments
    assert named >= 2  # the cuts inside the arguments


async def test_messages_cut_inside_a_call_is_a_tool_use_block_streamed_or_not(claude, model):
    tool = {"name": "get_weather", "description": "Weather in a city", "input_schema": CITY}
    kwargs = dict(model=model, tools=[tool], tool_choice={"type": "any", "disable_parallel_tool_use": True},
                  messages=ASK, extra_body={"temperature": 0})
    blocks = 0
    for max_tokens in CUTS:
        whole = await claude.messages.create(max_tokens=max_tokens, **kwargs)
        async with claude.messages.stream(max_tokens=max_tokens, **kwargs) as stream:
            streamed = await stream.get_final_message()
        assert whole.stop_reason == streamed.stop_reason == "max_tokens"
        assert all(block.type == "tool_use" for block in whole.content), whole.content  # no text of JSON
        assert [(b.type, b.name, b.input) for b in whole.content] == \
            [(b.type, b.name, b.input) for b in streamed.content], max_tokens
        for block in whole.content:
            assert block.name == "get_weather" and isinstance(block.input, dict)
            blocks += 1
    assert blocks >= 2  # the cuts inside the arguments


async def test_responses_cut_inside_a_call_is_an_incomplete_function_call(oai, model):
    kwargs = dict(model=model, input="Weather in Paris?", tools=[{"type": "function", "name": "get_weather",
                                                                  "parameters": CITY, "strict": True}],
                  tool_choice="required", parallel_tool_calls=False, temperature=0, max_output_tokens=34)
    whole = await oai.responses.create(**kwargs)
    final = None
    async for event in await oai.responses.create(stream=True, **kwargs):
        if event.type == "response.incomplete":
            final = event.response
    assert whole.status == final.status == "incomplete"
    items = [(i.type, i.name, i.arguments, i.status) for i in whole.output]
    assert items == [(i.type, i.name, i.arguments, i.status) for i in final.output]
    assert items and items[-1][:2] == ("function_call", "get_weather") and items[-1][3] == "incomplete"
    with pytest.raises(json.JSONDecodeError):
        json.loads(items[-1][2])  # the arguments as far as they were written


async def test_a_cut_call_sent_back_in_the_history_is_taken(oai, model):
    """A client sends the assistant turn back as it got it, with the cut call's unfinished arguments
    and a tool result for it: the next turn is served (chat; Responses by previous_response_id).
    Until 2026-12-06 the node refused its own reply: 400 'arguments is not valid JSON', and every
    later turn of that conversation with it."""
    cut = await oai.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                            parallel_tool_calls=False, max_tokens=34, temperature=0)
    [call] = cut.choices[0].message.tool_calls
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)
    history = [*ASK, cut.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "the call was cut short"}]
    again = await oai.chat.completions.create(model=model, messages=history, tools=[WEATHER], max_tokens=8,
                                              temperature=0)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
    tools = [{"type": "function", "name": "get_weather", "parameters": CITY, "strict": True}]
    first = await oai.responses.create(model=model, input="Weather in Paris?", tools=tools, tool_choice="required",
                                       parallel_tool_calls=False, temperature=0, max_output_tokens=34)
    [item] = [i for i in first.output if i.type == "function_call"]
    second = await oai.responses.create(
        model=model, previous_response_id=first.id, tools=tools, temperature=0, max_output_tokens=8,
        input=[{"type": "function_call_output", "call_id": item.call_id, "output": "the call was cut short"}])
    assert second.status in ("completed", "incomplete")


async def test_a_stop_sequence_inside_a_call_cuts_it_like_the_budget(oai, claude, model):
    """A stop sequence the call's JSON holds ("city": every call of get_weather writes it) ends the
    reply inside the call: the call as far as it was written, never its markup as content, the
    stream and the whole reply alike (finish_reason stop / stop_reason stop_sequence). Until
    2026-12-07 the raw JSON came back as the content, and a stream sent the call's first pieces as a
    tool call and then the same JSON again as content."""
    _, [(name, arguments)], _ = await chat(oai, model, 160, stream=False)
    assert "city" in arguments
    for stream in (False, True):
        content, calls, finish = await chat(oai, model, 160, stream=stream, stop=["city"])
        assert content is None and finish == "stop", (stream, content, calls, finish)
        assert [c[0] for c in calls] == [name] and arguments.startswith(calls[0][1]), (stream, calls)
    tool = {"name": "get_weather", "description": "Weather in a city", "input_schema": CITY}
    kwargs = dict(model=model, tools=[tool], tool_choice={"type": "any", "disable_parallel_tool_use": True},
                  messages=ASK, max_tokens=160, stop_sequences=["city"], extra_body={"temperature": 0})
    whole = await claude.messages.create(**kwargs)
    async with claude.messages.stream(**kwargs) as stream:
        streamed = await stream.get_final_message()
    for reply in (whole, streamed):
        assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "city")
        assert [(b.type, b.name) for b in reply.content] == [("tool_use", "get_weather")], reply.content


async def test_a_stop_sequence_inside_a_calls_name_or_key_cuts_it_too(oai, model):
    """Review r78: a stop sequence matching before the call's name was whole ("weather" in
    get_weather, "tool_call" in the generic format's key) returned the call's raw JSON as content."""
    for stop in (["weather"], ["tool_call"]):
        for stream in (False, True):
            content, calls, finish = await chat(oai, model, 160, stream=stream, stop=stop)
            assert content is None and finish == "stop", (stop, stream, content, calls, finish)
