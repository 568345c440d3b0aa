"""Ollama's dialect at its edges (api/ollama.py, api/ollama_reply.py), against a real node on
127.0.0.1 serving the embedded default model: characters a line reader splits at, the load request
of a model whose load failed, unknown names, tool results that match no call, and errors that name
the fields the Ollama client sent."""

from __future__ import annotations

import json
import logging
import time

import httpx
import ollama
import pytest

from node import const
from node.api import ollama as ollama_api
from node.inference.load_failure import LoadFailure, file_identity
from tests.support.nodes import default_model_node, ollama_client

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = [{"role": "user", "content": "hi"}]
SEPARATORS = "a\u2028b\u2029c\x85d"  # each one a line end to str.splitlines (httpx's iter_lines)

node = default_model_node("ollama_edges")


@pytest.fixture
def client(node):
    return ollama_client(node)


def forced(value: str) -> dict:
    """A schema whose one answer holds `value`: the model must write it."""
    return {"type": "object", "properties": {"x": {"enum": [value]}}, "required": ["x"]}


async def test_a_streamed_line_separator_reaches_the_ollama_client_whole(client, model_id):
    options = {"temperature": 0, "num_predict": 40}
    parts = [p async for p in await client.chat(model=model_id, messages=QUESTION, format=forced(SEPARATORS),
                                                stream=True, options=options)]
    assert json.loads("".join(p.message.content for p in parts)) == {"x": SEPARATORS}
    parts = [p async for p in await client.generate(model=model_id, prompt="hi", format=forced(SEPARATORS),
                                                    stream=True, options=options)]
    assert json.loads("".join(p.response for p in parts)) == {"x": SEPARATORS}


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 40, "temperature": 0,
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "x", "schema": forced(SEPARATORS)}}}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 40, "temperature": 0,
                       "text": {"format": {"type": "json_schema", "name": "x", "schema": forced(SEPARATORS)}}}),
])
async def test_sse_data_lines_survive_a_line_splitting_reader(node, model_id, path, body):
    """httpx-sse (and any reader on httpx's iter_lines) splits at U+2028 too: every data line is JSON."""
    text = ""
    async with httpx.AsyncClient(timeout=60) as http, http.stream(
            "POST", f"http://127.0.0.1:{node.api.port}{path}", json={"model": model_id, "stream": True, **body},
            headers={"Authorization": f"Bearer {node.api_key}"}) as resp:
        assert resp.status_code == 200
        async for got in resp.aiter_lines():
            if got.startswith("data: ") and got != "data: [DONE]":
                event = json.loads(got[len("data: "):])
                if event.get("type") == "response.output_text.delta":
                    text += event["delta"]
                elif event.get("choices"):
                    text += event["choices"][0]["delta"].get("content") or ""
            else:
                assert got == "" or got.startswith(("event: ", "data: [DONE]")), repr(got)
    assert json.loads(text) == {"x": SEPARATORS}


async def test_a_load_request_leaves_a_failed_load_failed_as_a_request_does(node, client, model_id):
    """Ollama's load request (no messages) is a request: a model whose load failed is not loaded
    again (the admin API's load is the way to retry), and one not loaded is loaded on demand."""
    served = node.models.get(model_id)
    await node.async_unload_model(model_id)
    served.state = "failed"
    served.failure = LoadFailure("out of memory (simulated)", file_identity(served.entry.path), time.time())
    try:
        for call in (client.chat(model=model_id, messages=[]), client.generate(model=model_id)):
            with pytest.raises(ollama.ResponseError) as info:
                await call
            assert info.value.status_code == 500 and "out of memory (simulated)" in info.value.error
            assert served.state == "failed" and served.engine is None
    finally:
        served.state, served.failure = "unloaded", None
    reply = await client.chat(model=model_id, messages=[])
    assert reply.done_reason == "load" and served.state == "loaded"


async def raw(node, path: str, body: dict) -> tuple[int, dict]:
    """(status, JSON) of one POST on the node's API."""
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"http://127.0.0.1:{node.api.port}{path}", json=body,
                               headers={"Authorization": f"Bearer {node.api_key}"})
        return resp.status_code, resp.json()


async def test_made_up_names_are_remembered_up_to_a_cap(node, model_id, caplog):
    caplog.set_level(logging.DEBUG, logger=ollama_api.__name__)
    for turn in range(2):
        made_up = {f"k{turn}_{i}_" + "x" * 50: 1 for i in range(20_000)}
        options = {f"o{turn}_{i}_" + "x" * 50: 1 for i in range(2_000)}
        status, reply = await raw(node, "/api/chat", {"model": model_id, "messages": [], **made_up})
        assert status == 200 and reply["done_reason"] == "load"
        status, reply = await raw(node, "/api/chat", {"model": model_id, "messages": QUESTION, "stream": False,
                                                      "options": {**options, "num_predict": 2}})
        assert status == 200 and reply["done"]
    assert 0 < len(ollama_api._told) <= const.OLLAMA_IGNORED_NAMES_MAX
    said = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert said and all(len(m) < 60 * const.OLLAMA_IGNORED_NAMES_MAX for m in said)
    assert "x" * (const.OLLAMA_IGNORED_NAME_CHARS + 1) not in "".join(said)


TWO_CALLS = [{"role": "user", "content": "weather in Paris and London?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                 {"function": {"name": "get_weather", "arguments": {"city": "London"}}}]}]


async def test_a_tool_result_matching_no_pending_call_says_which_are_pending(node, model_id):
    status, reply = await raw(node, "/api/chat", {"model": model_id, "stream": False, "messages": [
        *TWO_CALLS, {"role": "tool", "content": "sunny", "tool_call_id": "call_9f2"}]})
    assert status == 400
    assert "'call_9f2' matches none" in reply["error"] and "call_1_0 (get_weather), call_1_1 (get_weather)" in reply["error"]
    status, reply = await raw(node, "/api/chat", {"model": model_id, "stream": False, "messages": [
        *TWO_CALLS, {"role": "tool", "content": "sunny", "tool_name": "get_time"}]})
    assert status == 400 and "tool_name 'get_time' matches none" in reply["error"]
    assert "call_1_0 (get_weather)" in reply["error"]


async def test_errors_name_the_fields_the_ollama_client_sent(node, model_id):
    status, reply = await raw(node, "/api/chat", {"model": model_id, "stream": False, "messages": [
        *QUESTION, {"role": "assistant", "content": "hello", "thinking": 5}, *QUESTION]})
    assert status == 400 and reply["error"] == "messages[1].thinking must be a string"
    for path, body in (("/api/chat", {"messages": QUESTION}), ("/api/generate", {"prompt": "hi"})):
        status, reply = await raw(node, path, {"model": model_id, "stream": False, **body,
                                               "options": {"num_predict": 1 << 25}})
        assert status == 400 and "`options.num_predict` must be between" in reply["error"], path
        assert "max_tokens" not in reply["error"]
    unsatisfiable = {"type": "object", "properties": {}, "required": ["a"], "additionalProperties": False}  # a schema the compiler refuses named `response_format` (the fuzzer's find)
    for path, body in (("/api/chat", {"messages": QUESTION}), ("/api/generate", {"prompt": "hi"})):
        status, reply = await raw(node, path, {"model": model_id, "stream": False, **body, "format": unsatisfiable})
        assert status == 400 and reply["error"].startswith("`format`: the output grammar cannot be compiled"), reply
        assert "response_format" not in reply["error"]


async def test_a_capitalised_role_is_read_as_ollama_reads_it(client, model_id):
    reply = await client.chat(model=model_id, messages=[{"role": "System", "content": "Be brief."},
                                                        {"role": "User", "content": "hi"}],
                              options={"temperature": 0, "num_predict": 4})
    lower = await client.chat(model=model_id, messages=[{"role": "system", "content": "Be brief."},
                                                        {"role": "user", "content": "hi"}],
                              options={"temperature": 0, "num_predict": 4})
    assert reply.done and reply.message.content == lower.message.content


async def test_a_bare_tool_result_answers_the_latest_turns_call_not_one_an_earlier_turn_left():
    """Review r46: turn 1 called `search` twice and answered once; turn 2 called `get_time` and sent
    a result naming no call: it was matched to turn 1's unanswered `search`."""
    from node.api.ollama import _history

    call = lambda name: {"function": {"name": name, "arguments": {}}}  # noqa: E731
    history = _history([
        {"role": "user", "content": "find two things"},
        {"role": "assistant", "content": "", "tool_calls": [call("search"), call("search")]},
        {"role": "tool", "content": "first"},
        {"role": "user", "content": "what time is it?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_time")]},
        {"role": "tool", "content": "noon"},
        {"role": "tool", "content": "late second search", "tool_name": "search"}])
    time_call = history[4]["tool_calls"][0]["id"]
    assert history[5]["tool_call_id"] == time_call
    assert history[6]["tool_call_id"] == history[1]["tool_calls"][1]["id"]  # by name: the one left
