"""Request validation: every problem is a clear 400 naming the parameter; nothing silently ignored."""

import pytest

from node.api.schemas import parse_completion
from node.errors import InvalidRequest, Unsupported

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_valid_chat_defaults():
    req = parse_completion(dict(CHAT), "chat")
    assert req.model == "m" and not req.stream and req.params.max_tokens is None
    assert req.params.temperature == 1.0 and req.messages[0]["content"] == "hi"


@pytest.mark.parametrize(("patch", "param"), [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 3}, "temperature"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),  # past schemas.MAX_CHOICES
    ({"top_p": True}, "top_p"),
    ({"stream": "yes"}, "stream"),
    ({"stop": 5}, "stop"),
    ({"stop": ["s"] * 65}, "stop"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"model": 7}, "model"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": ""}, "stream_options"),  # "empty" values of the wrong type
    ({"stream": True, "stream_options": []}, "stream_options"),
    ({"frobnicate": 1}, "frobnicate"),
])
def test_bad_values_name_the_parameter(patch, param):
    with pytest.raises(InvalidRequest) as info:
        parse_completion({**CHAT, **patch}, "chat")
    assert info.value.param == param
    assert info.value.http_status == 400


@pytest.mark.parametrize(("patch", "param"), [
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content"),
])
def test_unsupported_options_are_refused(patch, param):
    with pytest.raises(Unsupported) as info:
        parse_completion({**CHAT, **patch}, "chat")
    assert info.value.param == param and info.value.http_status == 400


def test_harmless_explicit_defaults_accepted():
    req = parse_completion({**CHAT, "n": 1, "tools": None, "logprobs": False, "response_format": {"type": "text"},
                            "echo": False,
                            "user": "u1", "stream": True, "stream_options": {"include_usage": True}}, "chat")
    assert req.stream and req.include_usage
    # what the current openai SDK and older LangChain send (a compatibility run, 2026-12-06: 400s)
    req = parse_completion({**CHAT, "stream": None, "prompt_cache_key": "k", "safety_identifier": "s",
                            "verbosity": "low"}, "chat")
    assert not req.stream
    assert parse_completion({"model": "m", "prompt": "p", "best_of": 1, "suffix": ""}, "text").suffix is None
    assert parse_completion({"model": "m", "prompt": "p", "suffix": "x"}, "text").suffix == "x"  # fill in the middle
    parse_completion({**CHAT, "suffix": ""}, "chat")
    for patch, kind in (({"best_of": 2}, "text"), ({"best_of": True}, "text"), ({"suffix": "x"}, "chat")):
        with pytest.raises(Unsupported):  # asking for something: still refused
            parse_completion({**(CHAT if kind == "chat" else {"model": "m", "prompt": "p"}), **patch}, kind)


def test_completion_prompt_forms():
    assert parse_completion({"model": "m", "prompt": "abc"}, "text").prompt == "abc"
    assert parse_completion({"model": "m", "prompt": ["abc"]}, "text").prompt == "abc"
    with pytest.raises(Unsupported):
        parse_completion({"model": "m", "prompt": ["a", "b"]}, "text")
    with pytest.raises(InvalidRequest, match="prompt"):
        parse_completion({"model": "m"}, "text")


def test_text_parts_are_joined_and_developer_maps_to_system():
    req = parse_completion({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}, "chat")
    assert req.messages[0] == {"role": "system", "content": "be brief"}
    assert req.messages[1]["content"] == "ab"


@pytest.mark.parametrize(("patch", "param"), [
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_object", "extra": 1}}, "response_format"),
    ({"response_format": {"type": "json_object", "json_schema": {"name": "x"}}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}, "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}},
     "response_format.json_schema.strict"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "shema": {}}}},
     "response_format.json_schema"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"logit_bias": {"a": 1}}, "logit_bias"),
    ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"5": "1"}}, "logit_bias"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
])
def test_bad_structured_output_options_name_the_parameter(patch, param):
    with pytest.raises(InvalidRequest) as info:
        parse_completion({**CHAT, **patch}, "chat")
    assert info.value.param == param and info.value.http_status == 400


def test_response_format_and_logit_bias_parsed():
    req = parse_completion({**CHAT, "logit_bias": {"12": -100, "7": 3.5},
                            "response_format": {"type": "json_schema", "json_schema": {
                                "name": "person", "strict": True, "schema": {"type": "object"}}}}, "chat")
    assert req.params.logit_bias == ((7, 3.5), (12, -100.0))
    fmt = req.response_format
    assert (fmt.type, fmt.name, fmt.strict, fmt.schema) == ("json_schema", "person", True, {"type": "object"})
    assert parse_completion({**CHAT, "response_format": {"type": "json_object"}}, "chat").response_format.type \
        == "json_object"
    assert parse_completion({**CHAT, "response_format": {"type": "text"}}, "chat").response_format is None


def test_seed_minus_one_is_llama_cpps_random_seed():
    # llama.cpp reads -1 as "pick a random seed"; taken modulo 2**32 it pinned the seed 2**32 - 1
    assert parse_completion({**CHAT, "seed": -1}, "chat").params.seed is None
    assert parse_completion({**CHAT, "seed": 7}, "chat").params.seed == 7
