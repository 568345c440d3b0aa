"""gpt-oss (harmony) through the Anthropic Messages and Responses routes, with the official clients,
on test_api_harmony.py's tiny random model: the call arrives in the route's own shape (tool_use,
function_call) with its arguments parsed, the analysis channel as a thinking block or reasoning
item, no harmony markup as text, and the next turn (the call and its result) renders. Messages has
a thinking budget to close the analysis channel; Responses has none, so it runs a seed whose greedy
reply skips the analysis and calls at once."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.node.test_api_harmony import CITY, SPEC
from tests.support.nodes import anthropic_client, openai_client, tiny_models_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]
TOOL = {"name": "get_weather", "description": "Weather", "input_schema": CITY}
FUNCTION = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": CITY}
ASK = "Weather in Paris?"
GREEDY = {"temperature": 0}


# greedy, the first thinks until a budget closes the channel, the second (seed 1) calls
node = tiny_models_node(SPEC, dataclasses.replace(SPEC, seed=1, name="caller"))


@pytest.fixture
def anthropic_sdk(node):  # (made outside the loop: the SDK builds its types ~1 s at first use)
    return anthropic_client(node)


@pytest.fixture
def openai_sdk(node):
    return openai_client(node)


def model_id(node, name: str) -> str:
    return next(m.id for m in node.models.all() if m.id.startswith(name))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
async def test_messages_forced_call(node, anthropic_sdk, stream, choice):
    client = anthropic_sdk
    kw = dict(model=model_id(node, "gptoss"), max_tokens=1200, messages=[{"role": "user", "content": ASK}],
              tools=[TOOL], tool_choice=choice, thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=GREEDY)
    if stream:
        async with client.messages.stream(**kw) as events:
            kinds = [e.type async for e in events]
            msg = await events.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    else:
        msg = await client.messages.create(**kw)
    assert [b.type for b in msg.content] == ["thinking", "tool_use"]
    thoughts, call = msg.content
    assert thoughts.thinking and "<|" not in thoughts.thinking
    assert call.name == "get_weather" and call.input["city"] in ("Paris", "Rome")
    assert msg.stop_reason == "tool_use"
    assert msg.usage.output_tokens > 0 and msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 0
    history = [*kw["messages"], {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]}]
    again = await client.messages.create(**{**kw, "messages": history, "tool_choice": {"type": "auto"},
                                            "max_tokens": 8})
    assert again.stop_reason in ("max_tokens", "end_turn", "tool_use")
    assert all("<|" not in (getattr(b, "text", "") or "") for b in again.content)


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_forced_call_and_next_turns(node, openai_sdk, stream):
    client = openai_sdk
    kw = dict(model=model_id(node, "caller"), input=ASK, tools=[FUNCTION], tool_choice="required",
              max_output_tokens=100, temperature=0)
    if stream:
        async with client.responses.stream(**kw) as events:
            kinds = [e.type async for e in events]
            first = await events.get_final_response()
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    else:
        first = await client.responses.create(**kw)
    calls = [o for o in first.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"], first.output
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Rome")
    assert not [o for o in first.output if o.type == "message"]
    assert first.status == "completed" and first.usage.output_tokens > 0
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}
    chained = await client.responses.create(model=kw["model"], previous_response_id=first.id, input=[result],
                                            tools=[FUNCTION], max_output_tokens=8, temperature=0)
    thoughts = {"type": "reasoning", "id": "rs_1", "summary": [],
                "content": [{"type": "reasoning_text", "text": "Look it up."}]}
    stateless = await client.responses.create(
        model=kw["model"], store=False, tools=[FUNCTION], max_output_tokens=8, temperature=0,
        input=[{"role": "user", "content": ASK}, thoughts, *[o.model_dump(exclude_none=True) for o in calls], result])
    for r in (chained, stateless):
        assert r.usage.input_tokens > first.usage.input_tokens
        assert "<|" not in r.output_text


async def test_messages_effort_sets_the_reasoning_line_as_the_chat_routes(node, anthropic_sdk, openai_sdk):
    """output_config.effort reaches gpt-oss's template as the chat route's reasoning_effort does
    (`Reasoning: low`): the prompt is the chat route's for the same effort, in count_tokens and in a
    reply's usage ("max" is gpt-oss's "high"). Until 2026-12-06 it was checked and dropped."""
    model = model_id(node, "gptoss")
    messages = [{"role": "user", "content": ASK}]
    counts = {}
    for effort in ("low", "high", "max"):
        config = {"output_config": {"effort": effort}}
        counted = await anthropic_sdk.messages.count_tokens(model=model, messages=messages, extra_body=config)
        reply = await anthropic_sdk.messages.create(model=model, messages=messages, max_tokens=1, extra_body=config)
        chat = await openai_sdk.chat.completions.create(model=model, messages=messages, max_tokens=1,
                                                        reasoning_effort="high" if effort == "max" else effort)
        placed = reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
        assert counted.input_tokens == placed == chat.usage.prompt_tokens, effort
        counts[effort] = counted.input_tokens
    plain = await anthropic_sdk.messages.count_tokens(model=model, messages=messages)  # the template's own: medium
    medium = await openai_sdk.chat.completions.create(model=model, messages=messages, max_tokens=1)
    assert plain.input_tokens == medium.usage.prompt_tokens
    assert len({counts["low"], counts["high"], plain.input_tokens}) == 3, counts  # the effort shows in the prompt
