"""Tool calling through the official `openai` SDK against real nodes: the local route (the
embedded default model, plain ChatML: the generic format; a random model) and the distributed route
(a random model split over two node processes), with every tool_choice, streaming and not, and a
history with tool results. Arguments of forced calls validate against the function's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import jsonschema
import openai
import pytest
import pytest_asyncio
from pydantic import BaseModel, Field

from node.inference.synth import SynthSpec
from node.resources import default_model_path
from tests.pipeline.swarm import split_model, start_slice_node, wait_for_route, wait_peers
from tests.support.nodes import node_config, running_node, tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

ROOMY = SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=2048, name="roomy")
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
        "additionalProperties": False}
TZ = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
      "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": TZ}}
SCHEMAS = {"get_weather": CITY, "get_time": TZ}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("tools")
    async with running_node(node_config(base / "data", tiny_model(base, ROOMY, "roomy.gguf"),
                                        include_default_model=default_model_path().exists())) as n:
        yield n


@pytest.fixture
def client(node):
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key, max_retries=0)


def model_named(node, name: str) -> str:
    for served in node.models.all():
        if served.entry.name == name:
            return served.id
    pytest.skip(f"model {name} is not in this checkout")


async def ask(client, model: str, *, stream: bool, messages=ASK, tools=(WEATHER,), max_tokens: int = 160,
              **extra) -> tuple[str | None, list[tuple[str, str, str]], str, int]:
    """(content, [(id, name, arguments)], finish_reason, prompt_tokens); a stream's pieces are put
    back together the way OpenAI clients do. max_tokens leaves room for the generic format's JSON
    around a 12-character city written in byte tokens (4 a character at worst)."""
    kwargs = dict(model=model, messages=messages, max_tokens=max_tokens, **{"temperature": 0, **extra})
    if tools:
        kwargs["tools"] = list(tools)
    if not stream:
        reply = await client.chat.completions.create(**kwargs)
        msg = reply.choices[0].message
        calls = [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        return msg.content, calls, reply.choices[0].finish_reason, reply.usage.prompt_tokens
    content, calls, finish, usage = "", {}, None, 0
    async for chunk in await client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                           **kwargs):
        if chunk.usage:
            usage = chunk.usage.prompt_tokens
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            if piece.id is not None:
                assert piece.index not in calls and piece.type == "function" and piece.function.name
                calls[piece.index] = [piece.id, piece.function.name, piece.function.arguments or ""]
            else:
                assert piece.index in calls and piece.function.name is None
                calls[piece.index][2] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content or None, [tuple(calls[k]) for k in sorted(calls)], finish, usage


def assert_valid_calls(calls, names: set[str]) -> None:
    assert calls
    for call_id, name, arguments in calls:
        assert call_id.startswith("call_") and name in names
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


# --- local route: the default model (generic format, forced by grammar) ---------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_default_model_named_function(node, client, stream):
    model = model_named(node, "swarmllm-pydoc-q8_0")
    content, calls, finish, _ = await ask(client, model, stream=stream, tools=(WEATHER, TIME),
                                          tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert finish == "tool_calls" and content is None
    assert len(calls) == 1
    assert_valid_calls(calls, {"get_time"})


@pytest.mark.parametrize("stream", [False, True])
async def test_default_model_required(node, client, stream):
    model = model_named(node, "swarmllm-pydoc-q8_0")
    content, calls, finish, _ = await ask(client, model, stream=stream, tool_choice="required",
                                          parallel_tool_calls=False)
    assert finish == "tool_calls" and content is None
    assert len(calls) == 1
    assert_valid_calls(calls, {"get_weather"})


async def test_default_model_streamed_and_whole_replies_agree(node, client):
    model = model_named(node, "swarmllm-pydoc-q8_0")
    whole = await ask(client, model, stream=False, tool_choice="required", parallel_tool_calls=False)
    streamed = await ask(client, model, stream=True, tool_choice="required", parallel_tool_calls=False)
    assert [c[1:] for c in whole[1]] == [c[1:] for c in streamed[1]]
    assert whole[2] == streamed[2] == "tool_calls" and whole[3] == streamed[3]
    # parallel calls: the tiny model repeats its call until max_tokens cuts one short; both keep the
    # complete calls, and a stream has also sent at most the opening of the unfinished one
    whole = await ask(client, model, stream=False, tool_choice="required", max_tokens=100)
    streamed = await ask(client, model, stream=True, tool_choice="required", max_tokens=100)
    assert whole[1] and [c[1:] for c in streamed[1][:len(whole[1])]] == [c[1:] for c in whole[1]]
    assert len(streamed[1]) <= len(whole[1]) + 1 and whole[2] == streamed[2]


@pytest.mark.parametrize("stream", [False, True])
async def test_default_model_auto_is_a_call_or_an_answer(node, client, stream):
    model = model_named(node, "swarmllm-pydoc-q8_0")
    content, calls, finish, _ = await ask(client, model, stream=stream, tool_choice="auto")
    if calls:
        assert finish == "tool_calls" and content is None
        assert_valid_calls(calls, {"get_weather"})
    else:  # the generic format's {"response": ...}: the text, never the JSON around it
        assert finish in ("stop", "length") and content and not content.startswith('{"response"')


@pytest.mark.parametrize("stream", [False, True])
async def test_default_model_none_never_calls_and_hides_the_tools(node, client, stream):
    model = model_named(node, "swarmllm-pydoc-q8_0")
    content, calls, finish, prompt = await ask(client, model, stream=stream, tool_choice="none", max_tokens=20)
    assert calls == [] and content and finish in ("stop", "length")
    _, _, _, plain = await ask(client, model, stream=stream, tools=(), max_tokens=1)
    assert prompt == plain  # "none": the tools are not in the prompt


@pytest.mark.parametrize("stream", [False, True])
async def test_default_model_history_with_a_tool_result(node, client, stream):
    model = model_named(node, "swarmllm-pydoc-q8_0")
    first = await client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                                 max_tokens=160, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    assert history[1]["tool_calls"][0]["function"]["arguments"] == call.function.arguments
    content, calls, finish, prompt = await ask(client, model, stream=stream, messages=history, max_tokens=20)
    assert finish in ("stop", "length", "tool_calls")
    assert content or calls or finish == "length"  # a reply cut inside a call's markup is empty, never the markup
    assert prompt > first.usage.prompt_tokens  # the call and its result are in the prompt


async def test_default_model_bad_tool_requests_are_400s(node, client):
    model = model_named(node, "swarmllm-pydoc-q8_0")
    cases = [
        (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(messages=[*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "r"}]),
         "messages[1].tool_call_id"),
        (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools[0].function.name"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                      "properties": 3}}}]),
         "tools[0].function.parameters"),
        (dict(tools=[{"type": "function", "function": {
            # keywords and formats the grammar cannot hold are ignored (lenient); a pattern it cannot
            # compile is still a 400
            "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string",
                                                                                "pattern": "^(?!-)[a-z]+$"}}}}}],
              tool_choice="required"), "tools"),
    ]
    for extra, param in cases:
        kwargs = {"model": model, "messages": ASK, "max_tokens": 5, **extra}
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(**kwargs)
        assert caught.value.body["param"] == param, caught.value.body


# --- local route: a random model (the grammar alone makes its calls valid) --------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_random_model_every_tool_choice(node, client, stream):
    model = model_named(node, "roomy")
    tools = (WEATHER, TIME)
    for seed in range(3):
        _, calls, finish, _ = await ask(client, model, stream=stream, tools=tools, tool_choice="required",
                                        temperature=1.0, seed=seed, max_tokens=400)
        assert finish == "tool_calls"
        assert_valid_calls(calls, {"get_weather", "get_time"})
        _, calls, finish, _ = await ask(client, model, stream=stream, tools=tools, temperature=1.0, seed=seed,
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                        max_tokens=400)
        assert finish == "tool_calls" and len(calls) == 1
        assert_valid_calls(calls, {"get_weather"})
    content, calls, _, _ = await ask(client, model, stream=stream, tools=tools, tool_choice="none", max_tokens=10)
    assert calls == [] and content


class Address(BaseModel):
    city: str = Field(max_length=12)
    country: Literal["NO", "FR"]


class Trip(BaseModel):
    to: Address


# pydantic writes a nested model as a reference into the schema's own `$defs`
TRIP = Trip.model_json_schema()
BOOK = {"type": "function", "function": {"name": "book_trip", "parameters": TRIP}}


@pytest.mark.parametrize("stream", [False, True])
async def test_parameters_that_refer_into_their_own_defs(node, client, stream):
    """A tool's "#/$defs/..." references resolve against its parameters, not against the call's
    schema the grammar wraps them in (which once made every pydantic-made schema a 400)."""
    assert "$defs" in TRIP and TRIP["properties"]["to"] == {"$ref": "#/$defs/Address"}
    model = model_named(node, "roomy")
    own_id = {**TRIP, "$id": "https://example.com/trip.json"}  # references resolve against it: kept as it is
    for book in (BOOK, {"type": "function", "function": {"name": "book_trip", "parameters": own_id}}):
        for seed, choice in ((0, "required"), (1, {"type": "function", "function": {"name": "book_trip"}})):
            _, calls, finish, _ = await ask(client, model, stream=stream, tools=(book, WEATHER), tool_choice=choice,
                                            temperature=1.0, seed=seed, max_tokens=400)
            assert finish == "tool_calls" and calls
            for _id, name, arguments in calls:
                jsonschema.validate(json.loads(arguments), TRIP if name == "book_trip" else CITY)
            if choice != "required":
                assert [name for _id, name, _a in calls] == ["book_trip"]


# --- distributed route: a random model over two nodes ---------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("tools-pair")
    model = split_model(base)
    a = start_slice_node(base, "a", model, "0-2")
    b = start_slice_node(base, "b", model, "3-5", bootstrap=[a.peer_port])
    try:
        yield a, b
    finally:
        for p in (a, b):
            p.terminate()


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
async def test_distributed_every_tool_choice(pair, stream):
    a, _ = pair
    await a.async_wait_ready()
    await wait_peers(a, 1)
    model = await wait_for_route(a, "split6")
    client = openai.AsyncOpenAI(base_url=a.base + "/v1", api_key=a.api_key, max_retries=0)
    tools = (WEATHER, TIME)
    _, calls, finish, _ = await ask(client, model, stream=stream, tools=tools, tool_choice="required",
                                    temperature=1.0, seed=3, max_tokens=300)
    assert finish == "tool_calls"
    assert_valid_calls(calls, {"get_weather", "get_time"})
    _, calls, finish, _ = await ask(client, model, stream=stream, tools=tools, max_tokens=300,
                                    tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert finish == "tool_calls" and len(calls) == 1
    assert_valid_calls(calls, {"get_time"})
    content, calls, finish, _ = await ask(client, model, stream=stream, tools=tools, tool_choice="auto",
                                          max_tokens=300)
    if calls:
        assert finish == "tool_calls"
        assert_valid_calls(calls, {"get_weather", "get_time"})
    else:
        assert content is not None
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz":"UTC"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    content, calls, finish, _ = await ask(client, model, stream=stream, messages=history, tools=tools,
                                          tool_choice="none", max_tokens=8)
    assert calls == [] and content and finish in ("stop", "length")


# --- native formats end to end: a random model given a real model's template ----------------------

TEMPLATES = Path(__file__).resolve().parent.parent / "fixtures" / "templates"
NATIVE = {"Qwen-Qwen2.5-7B-Instruct": "hermes", "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
          "meta-llama-Llama-3.2-3B-Instruct": "llama3"}


def native_template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


@pytest.mark.parametrize("name", sorted(NATIVE))
@pytest.mark.parametrize("stream", [False, True])
async def test_native_formats_forced_and_parsed(node, client, name, stream, monkeypatch, caplog):
    """The random model under a native template: the grammar writes the format's own call syntax
    (`<tool_call>`, `[TOOL_CALLS]`, Llama JSON), the parser reads it back into valid calls."""
    caplog.set_level("DEBUG", logger="node.inference.generate")
    model = model_named(node, "roomy")
    served = next(s for s in node.models.all() if s.id == model)
    monkeypatch.setattr(served.tokenizer, "chat_template", native_template(name))
    tools = (WEATHER, TIME)
    _, calls, finish, _ = await ask(client, model, stream=stream, tools=tools, tool_choice="required",
                                    parallel_tool_calls=False, temperature=1.0, seed=5, max_tokens=400)
    assert f"format={NATIVE[name]}" in caplog.text
    assert finish == "tool_calls" and len(calls) == 1
    assert_valid_calls(calls, {"get_weather", "get_time"})
    _, calls, finish, _ = await ask(client, model, stream=stream, tools=tools, temperature=1.0, seed=6,
                                    tool_choice={"type": "function", "function": {"name": "get_time"}},
                                    max_tokens=400)
    assert finish == "tool_calls" and len(calls) == 1
    assert_valid_calls(calls, {"get_time"})


async def test_a_long_list_of_new_tools_is_checked_off_the_loop(node, client):
    """128 tools never seen before, 40 parameters each: jsonschema's check (~8 ms a schema here)
    runs in a worker thread, so the loop never stalls (this suite's policing fails a step of over
    0.5 s; it took ~1 s on the loop before). The prompt is then too long for the model: a 400."""
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {
        "type": "object", "properties": {f"p{i}_{j}": {"type": "string", "maxLength": j + 1} for j in range(40)}}}}
        for i in range(128)]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=model_named(node, "roomy"), messages=ASK, tools=tools, max_tokens=4)
    assert caught.value.body["code"] == "context_length_exceeded", caught.value.body
