"""Parsing of tools, tool_choice, parallel_tool_calls and tool history (node.api.schemas): the
internal message shape, and a 400 naming the parameter for every bad value."""

from __future__ import annotations

import hashlib
import json

import pytest

from node.api.schemas import parse_completion
from node.errors import InvalidRequest, Unsupported
from node.inference.request import ToolCall

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "d", "strict": True,
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


def test_tools_and_choices_parse():
    req = parse_completion({**CHAT, "tools": [TOOL]}, "chat")
    assert req.tools[0].name == "get_weather" and req.tools[0].strict and req.tools[0].description == "d"
    assert req.tool_choice == "auto" and req.parallel_tool_calls
    named = parse_completion({**CHAT, "tools": [TOOL], "parallel_tool_calls": False,
                              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "chat")
    assert (named.tool_choice, named.tool_choice_name, named.parallel_tool_calls) == ("function", "get_weather",
                                                                                     False)
    for choice in ("none", "auto", "required"):
        assert parse_completion({**CHAT, "tools": [TOOL], "tool_choice": choice}, "chat").tool_choice == choice
    no_params = parse_completion({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "chat")
    assert no_params.tools[0].parameters == {"type": "object", "properties": {}}


def test_history_with_calls_and_results_becomes_the_internal_shape():
    messages = [CHAT["messages"][0], {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]}]
    req = parse_completion({**CHAT, "messages": messages, "tools": [TOOL]}, "chat")
    assert req.messages[1] == {"role": "assistant", "content": "",
                               "tool_calls": (ToolCall("call_1", "get_weather", '{"city": "Oslo"}'),)}
    assert req.messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}


@pytest.mark.parametrize(("patch", "param"), [
    ({"tools": {"a": 1}}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                              "required": "x"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools[0].function.strict"),
    ({"tools": [{"type": "function", "function": {"name": "f", "returns": {}}}]}, "tools[0].function"),
    ({"tools": [TOOL], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"messages": [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    # (an unfinished object, `{"x": 1`, is taken: a call max_tokens cut short, echoed back)
    ({"messages": [{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{x}"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "x"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": CALL["function"]}]}]},
     "messages[0].tool_calls[0].id"),
    ({"messages": [{"role": "assistant", "tool_calls": "call"}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]}, "messages[0].tool_calls"),
])
def test_bad_tool_values_name_the_parameter(patch, param):
    with pytest.raises(InvalidRequest) as info:
        parse_completion({**CHAT, **patch}, "chat")
    assert info.value.param == param and info.value.http_status == 400


@pytest.mark.parametrize(("patch", "param"), [
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
])
def test_legacy_and_other_tool_types_are_refused(patch, param):
    with pytest.raises(Unsupported) as info:
        parse_completion({**CHAT, **patch}, "chat")
    assert info.value.param == param


def test_tools_are_a_chat_parameter():
    with pytest.raises(InvalidRequest) as info:
        parse_completion({"model": "m", "prompt": "x", "tools": [TOOL]}, "text")
    assert info.value.param == "tools"


def test_at_most_128_tools_and_each_schema_checked_once():
    from node.api import tool_schemas as schemas

    many = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(129)]
    with pytest.raises(InvalidRequest, match="at most 128") as caught:
        parse_completion({**CHAT, "tools": many}, "chat")
    assert caught.value.param == "tools"
    assert len(parse_completion({**CHAT, "tools": many[:128]}, "chat").tools) == 128
    fresh = {"type": "object", "properties": {"unique_to_this_test": {"type": "string"}}}
    assert schemas._schema_error(fresh) is None
    key = hashlib.sha256(json.dumps(fresh, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert schemas._schema_checks[key] is None  # remembered (by hash): the next request with it skips jsonschema
    bad = {"type": "object", "required": "x"}
    assert "is not of type 'array'" in schemas._schema_error(bad) and schemas._schema_error(bad)
    # what jsonschema raises on its own for some schemas is an answer too, not a 500
    deep: dict = {"type": "object"}
    for _ in range(400):
        deep = {"type": "object", "properties": {"a": deep}}
    for odd in ({"type": "object", "$schema": []}, {"type": "object", "$schema": 5}, deep):
        assert schemas._schema_error(odd) is not None
        with pytest.raises(InvalidRequest):
            parse_completion({**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": odd}}]},
                             "chat")
