"""The openai SDK's structured-output helpers against a real node (the default model): `parse()` and
`stream()` with pydantic models as `response_format` and `openai.pydantic_function_tool` tools. The
model's text is random-ish; the grammar holds its shape, so every `.parsed` / `.parsed_arguments`
validates."""

from __future__ import annotations

import datetime
import enum
import json
import uuid
from typing import Annotated, Literal

import openai
import pytest
from pydantic import UUID4, BaseModel, Field, IPvAnyAddress, SecretStr

from node.inference.schema_bounds import MAX_INTEGER
from tests.support.nodes import default_model_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

node = default_model_node("sdk-structured")


ASK = [{"role": "user", "content": "Ship a parcel, as JSON."}]


class Addr(BaseModel):
    city: str = Field(max_length=8)


class Colour(enum.StrEnum):
    red = "red"
    blue = "blue"


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    barks: int = Field(ge=0, le=9)


class Parcel(BaseModel):
    """What pydantic writes for real apps: a model used twice ($defs/$ref), `str | None` (anyOf with
    null), Literal and Enum, list[Sub] with max_items, a pattern, bounds, a date, a discriminated
    union (oneOf + discriminator)."""
    src: Addr
    dst: Addr
    note: str | None = Field(max_length=8)
    size: Literal["s", "m", "l"]
    colour: Colour
    stops: list[Addr] = Field(max_length=2)
    code: str = Field(pattern=r"^[A-Z]{3}$")
    weight: int = Field(ge=1, le=30)
    sent: datetime.date
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]


class Tree(BaseModel):
    v: int = Field(ge=0, le=9)
    kids: list[Tree] = Field(max_length=2)


class Ship(BaseModel):
    src: Addr
    dst: Addr


class Answer(BaseModel):
    verdict: Literal["yes", "no"]


SHIP = openai.pydantic_function_tool(Ship, name="ship")


@pytest.mark.parametrize("shape", [Parcel, Tree])
async def test_parse_and_stream_pydantic_models(client, model_id, shape):
    reply = await client.chat.completions.parse(model=model_id, messages=ASK, response_format=shape,
                                                max_tokens=200, temperature=0.7, seed=3)
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    assert isinstance(reply.choices[0].message.parsed, shape)
    async with client.chat.completions.stream(model=model_id, messages=ASK, response_format=shape,
                                              max_tokens=200, temperature=0.7, seed=4) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, shape)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "ship"}}],
                         ids=["required", "named"])
async def test_a_forced_call_with_a_response_format(client, model_id, tool_choice):
    """An app that gives its final answer's shape and forces a tool call first (as OpenAI takes it:
    response_format governs the content, the reply here is calls). Until 2026-12-06 a 400."""
    kwargs = dict(model=model_id, messages=ASK, tools=[SHIP], tool_choice=tool_choice, response_format=Answer,
                  parallel_tool_calls=False, max_tokens=120, temperature=0)
    reply = await client.chat.completions.parse(**kwargs)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id and call.function.name == "ship" and isinstance(call.function.parsed_arguments, Ship)
    async with client.chat.completions.stream(**kwargs) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls
    assert streamed.function.arguments == call.function.arguments and streamed.id.startswith("call_")
    # the call's result goes back; with tool_choice none the reply is the response_format's
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "ship", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": [{"type": "text", "text": "shipped"}]}]
    answer = await client.chat.completions.parse(model=model_id, messages=history, tools=[SHIP], tool_choice="none",
                                                 response_format=Answer, max_tokens=20, temperature=0)
    assert isinstance(answer.choices[0].message.parsed, Answer)


@pytest.mark.parametrize("bias", [{}, {"first": "response"}], ids=["as-it-chooses", "answer"])
async def test_auto_tool_choice_with_a_response_format(node, client, model_id, bias):
    """The OpenAI Agents SDK's agent with an output type and tools: tool_choice "auto" and a
    response_format. The reply is calls or the answer as the response_format's JSON, streamed or not
    alike. Until 2026-12-06 a 400."""
    kwargs = dict(model=model_id, messages=ASK, tools=[SHIP], response_format=Answer, max_tokens=120, temperature=0,
                  parallel_tool_calls=False)
    if bias:  # the default model speaks the generic format: steer its first key to "response"
        tok = node.models.all()[0].tokenizer
        kwargs["logit_bias"] = {str(t): 100 for t in tok.tokenize('{"response', add_bos=False)[-1:]}
    reply = await client.chat.completions.parse(**kwargs)
    message = reply.choices[0].message
    async with client.chat.completions.stream(**kwargs) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    if message.tool_calls:
        assert reply.choices[0].finish_reason == "tool_calls" and not bias
        assert all(isinstance(c.function.parsed_arguments, Ship) for c in message.tool_calls)
        assert [c.function.arguments for c in final.choices[0].message.tool_calls] == \
            [c.function.arguments for c in message.tool_calls]
    else:
        assert reply.choices[0].finish_reason == "stop"
        assert isinstance(message.parsed, Answer) and json.loads(message.content) == message.parsed.model_dump()
        assert final.choices[0].message.parsed == message.parsed


class Record(BaseModel):
    """A record."""
    id: UUID4
    host: IPvAnyAddress
    key: SecretStr
    blob: bytes
    flags: frozenset[int]


class Note(BaseModel):
    """A note."""
    tags: set[str] = Field(max_length=3)
    file: str  # a pathlib.Path, read back as a string: any string is one


def _schema(props: dict, required: list[str], **extra) -> dict:
    return {"properties": props, "required": required, "type": "object", **extra}


RECORD = {"id": {"format": "uuid4", "type": "string"}, "host": {"format": "ipvanyaddress", "type": "string"},
          "key": {"format": "password", "type": "string", "writeOnly": True},
          "blob": {"format": "binary", "type": "string"},
          "flags": {"items": {"type": "integer"}, "type": "array", "uniqueItems": True}}
NOTE = {"tags": {"items": {"type": "string"}, "maxItems": 3, "title": "Tags", "type": "array", "uniqueItems": True},
        "file": {"format": "path", "title": "File", "type": "string"}}
# request bodies as the libraries sent them (captured 2026-12-07), the model id left out
REPLAYED = {
    # pydantic-ai 2.38 Agent(output_type=NativeOutput(Record)): strict false
    "pydantic-ai": (Record, {"messages": [{"role": "user", "content": "Make a record"}], "max_completion_tokens": 300,
                             "response_format": {"type": "json_schema", "json_schema": {
                                 "name": "Record", "schema": _schema(RECORD, list(RECORD), additionalProperties=False),
                                 "description": "A record.", "strict": False}}, "temperature": 0}),
    # LiteLLM 1.110 completion(response_format=Record) and the openai SDK's parse(): strict true
    "litellm": (Record, {"messages": [{"role": "user", "content": "Make a record"}], "temperature": 0, "max_tokens": 300,
                         "response_format": {"type": "json_schema", "json_schema": {
                             "schema": _schema({k: {**v, "title": k.title()} for k, v in RECORD.items()}, list(RECORD),
                                               description="A record.", title="Record", additionalProperties=False),
                             "name": "Record", "strict": True}}}),
    # instructor 1.17 from_openai(mode=JSON_SCHEMA).create(response_model=Note): no strict, no temperature
    "instructor": (Note, {"messages": [{"role": "user", "content": "Tag this note about os.path"}], "max_tokens": 300,
                          "response_format": {"type": "json_schema", "json_schema": {
                              "name": "Note", "schema": _schema(NOTE, list(NOTE), description="A note.",
                                                                title="Note")}}}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("library", list(REPLAYED))
async def test_pydantic_standard_types_as_libraries_send_them(client, model_id, library, stream):
    """`set[str]`, `frozenset`, `Path`, `bytes`, `SecretStr`, `UUID4`, `IPvAnyAddress` in a response
    model: pydantic writes uniqueItems and formats of its own, and instructor, LangChain, pydantic-ai,
    LiteLLM and parse() send them as they are. Until 2026-12-07 each was a 400 (unsupported_parameter)."""
    shape, body = REPLAYED[library]
    body = {**body, "model": model_id}
    if not stream:
        choice = (await client.chat.completions.create(**body)).choices[0]
        content, finish = choice.message.content, choice.finish_reason
    else:
        content, finish = "", None
        async for chunk in await client.chat.completions.create(**body, stream=True):
            if chunk.choices:
                content += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
    if shape is Record:  # greedy: the model's reply ends within the budget
        assert finish == "stop", content
    if finish == "stop":  # sampled (instructor sets no temperature): a path may run past max_tokens
        parsed = shape.model_validate_json(content)
        if shape is Record:
            assert parsed.id.version == 4 and isinstance(parsed.id, uuid.UUID)


class Order(BaseModel):
    qty: int
    year: int | None


ORDER = {"properties": {"qty": {"title": "Qty", "type": "integer"},
                        "year": {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "Year"}},
         "required": ["qty", "year"], "title": "Order", "type": "object"}
ORDER_ASK = [{"role": "user", "content": "3 apples, 2024"}]
# captured 2026-12-07: instructor 1.17 JSON_SCHEMA mode and LangChain (langchain-openai 1.8)
# with_structured_output(Order, method="json_schema"), which sets strict and closes the object
INSTRUCTOR_ORDER = {"messages": ORDER_ASK, "max_tokens": 200,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "Order", "schema": ORDER}}}
LANGCHAIN_ORDER = {"messages": ORDER_ASK, "max_completion_tokens": 200, "stream": False,
                   "response_format": {"type": "json_schema", "json_schema": {
                       "schema": {**ORDER, "additionalProperties": False}, "name": "Order", "strict": True}}}


@pytest.mark.parametrize("body", [INSTRUCTOR_ORDER, LANGCHAIN_ORDER], ids=["instructor", "langchain"])
async def test_an_unbounded_int_ends_within_19_digits(client, model_id, body):
    """A response model's plain `int`, sampled (neither library sends a temperature): the default
    model wrote digit after digit until max_tokens in 14 replies of 20, cut JSON that no client
    parses. Integers now have 19 digits at most (2026-12-07; 16, llama.cpp's, until review r44)."""
    for _ in range(4):
        choice = (await client.chat.completions.create(model=model_id, **body)).choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        order = Order.model_validate_json(choice.message.content)
        assert abs(order.qty) <= MAX_INTEGER and (order.year is None or abs(order.year) <= MAX_INTEGER)


class Reading(BaseModel):
    value: float
    ratio: float | None
    at: datetime.datetime


async def test_a_float_and_a_datetime_end_however_long_the_model_would_write_digits(node, client, model_id):
    """A model that always prefers another digit (a logit_bias on "3", a smaller one on "."): a
    pydantic `float` and `datetime` ran "3.33333…" and "…:33.3333…" until max_tokens, cut JSON that
    parse() cannot read. Each ends now: a number's integral part by 19 digits, its fraction
    by 16, its exponent by 3, a second's fraction by 9 (2026-12-07)."""
    import re

    tok = node.models.all()[0].tokenizer
    three, point = (tok.tokenize(c, add_bos=False)[-1] for c in "3.")
    bias = {str(three): 100, str(point): 60}
    for stream in (False, True):
        kwargs = dict(model=model_id, messages=ASK, response_format=Reading, max_tokens=160, logit_bias=bias, seed=1)
        if stream:
            async with client.chat.completions.stream(**kwargs) as s:
                async for _ in s:
                    pass
                reply = await s.get_final_completion()
        else:
            reply = await client.chat.completions.parse(**kwargs)
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Reading)
        value, ratio, at = re.fullmatch(r'\{"value":([^,]+),"ratio":([^,]+),"at":"([^"]+)"\}',
                                        choice.message.content).groups()
        for number in (value, ratio):  # (integral, fraction, exponent digits)
            whole, fraction, exponent = re.fullmatch(r"-?([0-9]+)(?:\.([0-9]+))?(?:[eE][+-]?([0-9]+))?|null",
                                                     number).groups(default="")
            assert len(whole) <= 19 and len(fraction) <= 16 and len(exponent) <= 3, number
        assert len(re.search(r"[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.([0-9]+))?", at).group(1) or "") <= 9, at


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"min_tokens": 100}, {"bias_ban": True}])
async def test_a_top_level_number_with_the_end_banned_is_no_500(node, client, model_id, extra):
    """`response_format` a bare number with ignore_eos (or min_tokens, or a logit_bias of -100 on the end
    tokens, the usual trick to force long replies): past the digit bound only the end was left, the ban
    took it too, and the reply was a 500 mid-way ("sampled outside the grammar", review r55, r57). The
    digits go on while the end is banned (2026-12-07)."""
    import re

    tok = node.models.all()[0].tokenizer
    three, point = (tok.tokenize(c, add_bos=False)[-1] for c in "3.")
    bias = {str(three): 100, str(point): 60}
    if extra.pop("bias_ban", False):
        bias |= {str(i): -100 for i in range(tok.n_vocab) if tok.is_eog(i)}
        extra = {"ignore_eos": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "number"}}}
    reply = await client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "a number"}], response_format=fmt, max_tokens=120,
        seed=1, logit_bias=bias, extra_body=extra)
    choice = reply.choices[0]
    assert re.fullmatch(r"3+\.3+[eE]3+", choice.message.content), choice.message.content
    assert len(choice.message.content) > 40
    assert choice.finish_reason == ("length" if "min_tokens" not in extra else "stop"), choice
