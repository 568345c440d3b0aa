"""Tool use and structured output through /v1/messages and /v1/responses (official SDKs, the
default model): a forced tool call comes back as a tool_use block / function_call item whose
input matches the tool's schema, streamed as input_json_delta / function_call_arguments pieces;
tool results travel back into the prompt; a JSON schema holds the reply."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from tests.support.nodes import anthropic_client, default_model_node, openai_client

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
          "required": ["city"], "additionalProperties": False}
GREEDY = {"temperature": 0}


node = default_model_node("dialect-tools")


@pytest.fixture
def claude(node):
    return anthropic_client(node)


@pytest.fixture
def oai(node):
    return openai_client(node)


ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather in a city", "input_schema": SCHEMA}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city",
                  "parameters": SCHEMA, "strict": True}


async def test_messages_forced_tool_use(claude, model_id):
    msg = await claude.messages.create(model=model_id, max_tokens=160, tools=[ANTHROPIC_TOOL],
                                       tool_choice={"type": "tool", "name": "get_weather"},
                                       messages=[{"role": "user", "content": "Weather in Paris?"}], extra_body=GREEDY)
    assert msg.stop_reason == "tool_use"
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id
    jsonschema.validate(uses[0].input, SCHEMA)
    # one call (the tiny model would repeat parallel calls until max_tokens: stop_reason max_tokens)
    async with claude.messages.stream(model=model_id, max_tokens=160, tools=[ANTHROPIC_TOOL],
                                      tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                      messages=[{"role": "user", "content": "Weather in Paris?"}],
                                      extra_body=GREEDY) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_message()
    assert any(e.type == "input_json" for e in events)  # the SDK's view of input_json_delta
    assert final.stop_reason == "tool_use" and [b.type for b in final.content][-1] == "tool_use"
    assert final.content[-1].input == uses[0].input
    # the result goes back: a tool_result block becomes a tool message in the prompt
    follow = await claude.messages.create(model=model_id, max_tokens=4, tools=[ANTHROPIC_TOOL], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather",
                                           "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny, 21 C"}]}])
    counted = await claude.messages.count_tokens(model=model_id, tools=[ANTHROPIC_TOOL], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": "get_weather",
                                           "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny, 21 C"}]}])
    # the whole prompt in Anthropic's accounting: input_tokens + what the KV cache held
    whole = follow.usage.input_tokens + follow.usage.cache_read_input_tokens
    assert whole == counted.input_tokens > msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    with pytest.raises(anthropic.BadRequestError):  # a result for a call never made
        await claude.messages.create(model=model_id, max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}])


async def test_the_reply_content_goes_back_as_anthropic_documents_it(claude, model_id):
    """Anthropic's tool-use guide appends `response.content` (the SDK's own block objects) as the
    assistant turn; blocks from Anthropic's API itself carry `caller` and `toolset_name` too."""
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    msg = await claude.messages.create(model=model_id, max_tokens=160, tools=[ANTHROPIC_TOOL],
                                       tool_choice={"type": "tool", "name": "get_weather"}, messages=ask,
                                       extra_body=GREEDY)
    use = next(b for b in msg.content if b.type == "tool_use")
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}
    echoed = await claude.messages.create(model=model_id, max_tokens=4, tools=[ANTHROPIC_TOOL], extra_body=GREEDY,
                                          messages=[*ask, {"role": "assistant", "content": msg.content}, result])
    from_api = {"type": "tool_use", "id": use.id, "name": "get_weather", "input": use.input,
                "caller": {"type": "direct"}, "toolset_name": None}
    theirs = await claude.messages.create(model=model_id, max_tokens=4, tools=[ANTHROPIC_TOOL], extra_body=GREEDY,
                                          messages=[*ask, {"role": "assistant", "content": [from_api]}, result])
    def reply(m):  # greedy: the same prompt gives the same blocks (a tool_use's id is new each time)
        return [b.model_dump(exclude={"id"}) for b in m.content], m.stop_reason

    assert reply(echoed) == reply(theirs)
    assert echoed.usage.input_tokens + echoed.usage.cache_read_input_tokens == \
        theirs.usage.input_tokens + theirs.usage.cache_read_input_tokens
    with pytest.raises(anthropic.BadRequestError, match="caller"):  # still checked: a caller is an object
        await claude.messages.create(model=model_id, max_tokens=4, tools=[ANTHROPIC_TOOL], messages=[
            *ask, {"role": "assistant", "content": [{**from_api, "caller": "me"}]}, result])


async def test_responses_forced_function_call(oai, model_id):
    resp = await oai.responses.create(model=model_id, input="Weather in Paris?", tools=[RESPONSES_TOOL],
                                      tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                                      max_output_tokens=160)
    calls = [item for item in resp.output if item.type == "function_call"]
    assert resp.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMA)
    async with oai.responses.stream(model=model_id, input="Weather in Paris?", tools=[RESPONSES_TOOL],
                                    tool_choice="required", parallel_tool_calls=False, temperature=0,
                                    max_output_tokens=160) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_response()
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == calls[0].arguments == final.output[-1].arguments
    # function_call_output continues it, also through previous_response_id
    follow = await oai.responses.create(model=model_id, previous_response_id=resp.id, tools=[RESPONSES_TOOL],
                                        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                                "output": "sunny, 21 C"}], max_output_tokens=4)
    explicit = await oai.responses.create(model=model_id, tools=[RESPONSES_TOOL], max_output_tokens=4, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}])
    assert follow.usage.input_tokens == explicit.usage.input_tokens > resp.usage.input_tokens


async def test_responses_output_type_beside_tools(oai, model_id):
    """What the OpenAI Agents SDK sends for an agent with tools and an output type: text.format
    json_schema, tools, tool_choice left at auto. The output is a call or the schema's JSON."""
    fmt = {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}
    kwargs = dict(model=model_id, input="Weather in Paris?", tools=[RESPONSES_TOOL], text={"format": fmt},
                  parallel_tool_calls=False, temperature=0, max_output_tokens=160)
    resp = await oai.responses.create(**kwargs)
    async with oai.responses.stream(**kwargs) as stream:
        final = await stream.get_final_response()
    assert resp.status == "completed"
    calls = [item for item in resp.output if item.type == "function_call"]
    if calls:
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMA)
        assert [c.arguments for c in final.output if c.type == "function_call"] == [calls[0].arguments]
    else:
        jsonschema.validate(json.loads(resp.output_text), SCHEMA)
        assert final.output_text == resp.output_text


async def test_json_schema_output(claude, oai, model_id):
    resp = await oai.responses.create(model=model_id, input="Name a city.", max_output_tokens=40, temperature=0,
                                      text={"format": {"type": "json_schema", "name": "city", "schema": SCHEMA,
                                                       "strict": True}})
    jsonschema.validate(json.loads(resp.output_text), SCHEMA)
    assert resp.text.format.type == "json_schema"
    msg = await claude.messages.create(model=model_id, max_tokens=40, extra_body=GREEDY,
                                       output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
                                       messages=[{"role": "user", "content": "Name a city."}])
    jsonschema.validate(json.loads(msg.content[0].text), SCHEMA)
    # the structured-outputs beta's name (older SDKs' beta.messages.parse send it): a 400 until 2026-12-07
    msg = await claude.messages.create(model=model_id, max_tokens=40, messages=[{"role": "user", "content": "Name a city."}],
                                       extra_body={**GREEDY, "output_format": {"type": "json_schema", "schema": SCHEMA}})
    jsonschema.validate(json.loads(msg.content[0].text), SCHEMA)
    with pytest.raises(anthropic.BadRequestError, match="give one of them"):
        await claude.messages.create(model=model_id, max_tokens=40, messages=[{"role": "user", "content": "x"}],
                                     output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
                                     extra_body={"output_format": {"type": "json_schema", "schema": SCHEMA}})
    # a bad output_config is a 400 beside output_format too (2026-12-07, review r35: dropped unsaid)
    with pytest.raises(anthropic.BadRequestError, match="output_config: must be an object"):
        await claude.messages.create(model=model_id, max_tokens=40, messages=[{"role": "user", "content": "x"}],
                                     extra_body={"output_config": "garbage",
                                                 "output_format": {"type": "json_schema", "schema": SCHEMA}})


async def test_calls_cut_by_max_tokens_say_the_turn_was_truncated(claude, oai, model_id):
    """The tiny model repeats parallel calls until max_tokens: the complete calls are kept, and the
    reply says it was cut (an agent loop must know), as the chat route's finish_reason length does."""
    msg = await claude.messages.create(model=model_id, max_tokens=100, tools=[ANTHROPIC_TOOL],
                                       tool_choice={"type": "any"},
                                       messages=[{"role": "user", "content": "Weather in Paris?"}], extra_body=GREEDY)
    assert msg.stop_reason == "max_tokens" and [b.type for b in msg.content].count("tool_use") >= 1
    resp = await oai.responses.create(model=model_id, input="Weather in Paris?", tools=[RESPONSES_TOOL],
                                      tool_choice="required", temperature=0, max_output_tokens=100)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in resp.output].count("function_call") >= 1
