"""Ollama's API on the node's port (api/ollama.py, api/ollama_models.py), driven by the official
`ollama` Python client against a real node on 127.0.0.1 serving the embedded default model: the
model routes, chat and generate whole and streamed (NDJSON), options, embeddings, tools, errors in
Ollama's `{"error": ...}` shape, a client gone mid-stream, and the same key, Host and Origin guards
as /v1."""

from __future__ import annotations

import json

import aiohttp
import jsonschema
import ollama
import pytest
import pytest_asyncio
from aiohttp import web

from node.api.auth import make_auth_middleware
from node.api.ollama_reply import OllamaDialect, OllamaEvents
from node.errors import AuthenticationFailed, InvalidRequest
from node.inference.request import ToolCall
from node.inference.synth import SynthSpec
from node.inference.tools.deepseek_r1 import MARKERS as R1_MARKERS
from tests.support.fake_remote import request_from
from tests.support.nodes import (
    default_model_node,
    node_config,
    ollama_client,
    openai_client,
    running_node,
    template,
    tiny_model,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = [{"role": "user", "content": "What does os.path.join do?"}]
GREEDY = {"temperature": 0}
LONG_PROMPT = "def add(a, b):"  # raw: the pydoc model writes on until the limit

node = default_model_node("ollama")


@pytest.fixture
def client(node):
    return ollama_client(node)


@pytest.fixture
def oai(node):
    return openai_client(node)  # here, not on the loop: it builds the SDK's types the first time


async def raw(node, method: str, path: str, body: bytes | dict | None = None, *, key: bool = True,
              headers: dict | None = None) -> tuple[int, dict, str]:
    """(status, headers, text) of one request on the node's API."""
    sent = {"Authorization": f"Bearer {node.api_key}"} if key else {}
    sent.update(headers or {})
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    async with aiohttp.ClientSession() as session, session.request(
            method, f"http://127.0.0.1:{node.api.port}{path}", data=data, headers=sent) as resp:
        return resp.status, dict(resp.headers), await resp.text()


async def test_model_routes(client, node, oai, model_id):
    """What Open WebUI, Zed and Continue read to list models and size prompts."""
    listed = (await client.list()).models
    v1 = [m.id async for m in oai.models.list()]
    assert [m.model for m in listed] == [f"{i}:latest" for i in v1]  # /v1/models' ids, tagged as Ollama lists
    entry = listed[0]
    served = node.models.get(model_id)
    assert entry.digest == served.entry.sha256 and entry.size == served.entry.size_bytes
    assert entry.details.format == "gguf" and entry.details.family == "llama" == entry.details.families[0]
    assert entry.details.quantization_level == "Q8_0" and entry.details.parameter_size.endswith("M")
    shown = await client.show(f"{model_id}:latest")  # Ollama's clients add the tag
    assert shown.capabilities == ["completion"]  # ChatML without tools, no pooling: a chat model only
    assert shown.template == served.tokenizer.chat_template
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == served.n_ctx
    assert not any(k.startswith("tokenizer.chat_template") for k in shown.modelinfo)
    status, _, text = await raw(node, "POST", "/api/show", {"name": model_id})  # the older field
    assert status == 200 and json.loads(text)["details"]["family"] == "llama"
    loaded = await client.chat(model=model_id, messages=[])  # Ollama's load request
    assert loaded.done and loaded.done_reason == "load" and loaded.message.content == ""
    running = (await client.ps()).models
    assert [m.model for m in running] == [f"{model_id}:latest"] and running[0].context_length == served.n_ctx
    unload = await client.generate(model=model_id, keep_alive=0)  # answered; the node keeps it loaded
    assert unload.done and unload.done_reason == "unload"
    assert [m.model for m in (await client.ps()).models] == [f"{model_id}:latest"]
    with pytest.raises(ollama.ResponseError) as info:
        await client.chat(model="no-such-model", messages=[])
    assert info.value.status_code == 404
    status, _, text = await raw(node, "GET", "/api/version")
    assert status == 200 and json.loads(text)["version"].count(".") == 2
    status, _, text = await raw(node, "GET", "/", key=False)  # apps' "is Ollama there?" probe
    assert status == 200 and text == "Ollama is running"


async def test_chat_whole_and_streamed(client, node, model_id):
    whole = await client.chat(model=model_id, messages=QUESTION, options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.role == "assistant"
    assert whole.message.content and whole.model == model_id
    assert whole.eval_count > 0 and whole.prompt_eval_count > 0
    for field in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(getattr(whole, field), int)
    assert whole.total_duration >= whole.eval_duration > 0
    parts = [p async for p in await client.chat(model=model_id, messages=QUESTION, options=GREEDY, stream=True)]
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == whole.done_reason
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count
    probed = await client.chat(model=model_id, messages=QUESTION, options={"num_predict": 5, **GREEDY},
                               logprobs=True, top_logprobs=2)
    assert len(probed.logprobs) == probed.eval_count and all(len(t.top_logprobs) == 2 for t in probed.logprobs)
    assert "".join(t.token for t in probed.logprobs) == probed.message.content
    # `stream` left out is true, as Ollama's: NDJSON lines, the last with done
    status, headers, text = await raw(node, "POST", "/api/chat", {"model": model_id, "messages": QUESTION,
                                                                  "options": GREEDY})
    assert status == 200 and headers["Content-Type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) > 1 and lines[-1]["done"] is True and lines[0]["done"] is False


async def test_greedy_equals_v1(client, oai, model_id):
    ours = await client.chat(model=f"{model_id}:latest", messages=QUESTION, options={"temperature": 0, "num_ctx": 4096})
    theirs = await oai.chat.completions.create(model=model_id, messages=QUESTION, temperature=0)
    assert ours.message.content == theirs.choices[0].message.content
    assert ours.model == f"{model_id}:latest"  # echoed as named


async def test_num_predict_and_seed(client, model_id):
    limited = await client.generate(model=model_id, prompt=LONG_PROMPT, raw=True, options={"num_predict": 13, **GREEDY})
    assert limited.done_reason == "length" and limited.eval_count == 13
    texts = [(await client.chat(model=model_id, messages=QUESTION, options={"temperature": 1.0, "seed": s,
                                                                            "num_predict": 24})).message.content
             for s in (7, 7, 8, 9)]
    assert texts[0] == texts[1] and len(set(texts)) > 1  # the seed decides the sample


async def test_generate(client, model_id):
    whole = await client.generate(model=model_id, prompt="What does os.path.join do?", options=GREEDY)
    chat = await client.chat(model=model_id, messages=QUESTION, options=GREEDY)
    assert whole.response == chat.message.content  # the prompt under the chat template, as Ollama
    with_system = await client.generate(model=model_id, prompt="What does os.path.join do?", system="Be brief.",
                                        options=GREEDY)
    assert with_system.prompt_eval_count > whole.prompt_eval_count
    parts = [p async for p in await client.generate(model=model_id, prompt=LONG_PROMPT, raw=True, stream=True,
                                                    options={"num_predict": 9, **GREEDY})]
    raw_whole = await client.generate(model=model_id, prompt=LONG_PROMPT, raw=True, options={"num_predict": 9, **GREEDY})
    assert "".join(p.response for p in parts) == raw_whole.response and parts[-1].eval_count == 9
    assert raw_whole.prompt_eval_count < whole.prompt_eval_count  # no template around it
    with pytest.raises(ollama.ResponseError) as info:
        await client.generate(model=model_id, prompt="x", images=[b"\x89PNG"])
    assert info.value.status_code == 400 and "images" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        await client.generate(model=model_id, prompt="x", context=[1, 2, 3])
    assert info.value.status_code == 400 and "context" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:  # the pydoc model has no FIM tokens
        await client.generate(model=model_id, prompt="def f(", suffix="\n    return x")
    assert info.value.status_code == 400 and "suffix" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        await client.generate(model=model_id, prompt="x", raw=True, think=True)
    assert info.value.status_code == 400 and "raw" in info.value.error


async def test_format_json_and_schema(client, model_id):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}, "required": ["name"]}
    reply = await client.chat(model=model_id, messages=QUESTION, format=schema, options={"num_predict": 60, **GREEDY})
    jsonschema.validate(json.loads(reply.message.content), schema)
    reply = await client.chat(model=model_id, messages=QUESTION, format="json", options={"num_predict": 60, **GREEDY})
    assert isinstance(json.loads(reply.message.content), dict)


async def test_embed(client, oai, model_id):
    texts = ["a list", "a dict"]
    reply = await client.embed(model=model_id, input=texts)
    v1 = await oai.embeddings.create(model=model_id, input=texts, encoding_format="float")
    assert len(reply.embeddings) == 2 and reply.prompt_eval_count == v1.usage.prompt_tokens
    for got, want in zip(reply.embeddings, v1.data, strict=True):
        assert got == pytest.approx(want.embedding, abs=1e-6)
    older = await client.embeddings(model=model_id, prompt=texts[0])
    assert older.embedding == pytest.approx(reply.embeddings[0], abs=1e-6)
    with pytest.raises(ollama.ResponseError) as info:
        await client.embed(model=model_id, input="x", dimensions=3)
    assert info.value.status_code == 400 and "dimensions" in info.value.error


async def test_tools_reach_the_template_and_history_round_trips(client, model_id):
    """The pydoc model's template renders no tools, and no forced call exists in Ollama's API: what
    the node guarantees is that tools and a tool-call history are taken and rendered."""
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    plain = await client.chat(model=model_id, messages=QUESTION, options={"num_predict": 4, **GREEDY})
    with_tools = await client.chat(model=model_id, messages=QUESTION, tools=[tool], options={"num_predict": 4, **GREEDY})
    assert with_tools.done and with_tools.prompt_eval_count > plain.prompt_eval_count  # rendered in the prompt
    history = [*QUESTION, {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "Sunny, 21 C", "tool_name": "get_weather"}]
    answered = await client.chat(model=model_id, messages=history, tools=[tool], options={"num_predict": 4, **GREEDY})
    assert answered.prompt_eval_count > with_tools.prompt_eval_count  # the call and its result are in the prompt
    with pytest.raises(ollama.ResponseError) as info:  # a result no call asked for
        await client.chat(model=model_id, messages=[*QUESTION, {"role": "tool", "content": "x", "tool_name": "nope"}])
    assert info.value.status_code == 400 and "nope" in info.value.error


async def test_a_sampled_tool_call_whole_and_streamed(client, model_id):
    """Ollama has no tool_choice: the tiny model calls a tool when it samples one. Among a few seeds one
    does; its calls come back with object arguments holding to the schema, streamed as whole. (The
    client keeps only type, items, description and enum of a property: a maxLength never reaches the node.)"""
    tool = {"type": "function", "function": {"name": "lookup_docs", "description": "Look up a Python name",
                                             "parameters": {"type": "object", "required": ["name"],
                                                            "properties": {"name": {"type": "string"}}}}}
    for seed in range(8):
        ask = {"model": model_id, "messages": QUESTION, "tools": [tool],
               "options": {"num_predict": 120, "temperature": 0.7, "seed": seed}}
        whole = await client.chat(**ask)
        if whole.message.tool_calls:
            break
    else:
        pytest.fail("no seed of 8 made a tool call")
    for call in whole.message.tool_calls:
        assert call.function.name == "lookup_docs"
        jsonschema.validate(dict(call.function.arguments), tool["function"]["parameters"])
    parts = [p async for p in await client.chat(**ask, stream=True)]
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert streamed == list(whole.message.tool_calls) and parts[-1].done


async def test_tool_calls_go_out_whole_with_object_arguments():
    """A run's calls as Ollama writes them: one line before the last, arguments an object."""

    class Run:
        tool_calls = [ToolCall("call_1", "get_weather", '{"city": "Paris"}')]
        content, reasoning = "", ""

        class trace:  # noqa: N801 - the attributes done_fields reads
            finish_reason, total_ms, ttft_ms, decode_ms = "tool_calls", 5.0, 1.0, 2.0
            assembled = admitted = 0.0
            prompt_tokens, completion_tokens = 3, 4

    lines = [json.loads(b) for b in OllamaEvents(Run, chat=True, named="m").closing()]
    assert lines[0]["done"] is False and lines[0]["message"]["tool_calls"] == [
        {"id": "call_1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]
    assert lines[1]["done"] is True and lines[1]["done_reason"] == "stop" and lines[1]["eval_duration"] == 2_000_000
    whole = OllamaDialect(chat=True, named="m").body(Run, [])
    assert json.loads(OllamaEvents(Run, chat=True, named="m").error(InvalidRequest("bad"))[0]) == {"error": "bad"}
    assert whole["message"]["tool_calls"] == lines[0]["message"]["tool_calls"] and whole["done_reason"] == "stop"


async def test_errors_in_ollamas_shape(client, node, model_id):
    with pytest.raises(ollama.ResponseError) as info:
        await client.chat(model="no-such-model", messages=QUESTION)
    assert info.value.status_code == 404 and "no-such-model" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:  # a picture the user expects seen: said, not dropped
        await client.chat(model=model_id, messages=[{**QUESTION[0], "images": [b"\x89PNG"]}])
    assert info.value.status_code == 400 and "images" in info.value.error
    status, headers, text = await raw(node, "POST", "/api/chat", b'{"model": ', headers={"Content-Type": "application/json"})
    assert status == 400 and "not valid JSON" in json.loads(text)["error"]
    status, _, text = await raw(node, "POST", "/api/chat", {"model": model_id, "messages": QUESTION,
                                                            "options": {"temperature": "hot"}})
    assert status == 400 and isinstance(json.loads(text)["error"], str)
    for path in ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete"):
        status, headers, text = await raw(node, "POST", path, {"model": "llama3"})
        assert status == 400 and headers["Content-Type"].startswith("application/json"), path
        assert "SwarmLLM" in json.loads(text)["error"], path
    with pytest.raises(ollama.ResponseError) as info:
        await client.delete("llama3")
    assert "swarmllm download" in info.value.error or "Models page" in info.value.error


async def test_a_client_gone_mid_stream_frees_the_run(node, model_id):
    body = {"model": model_id, "prompt": LONG_PROMPT, "raw": True, "options": {"num_predict": 900, **GREEDY}}
    served = node.models.get(model_id)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"http://127.0.0.1:{node.api.port}/api/generate", json=body,
                                  headers={"Authorization": f"Bearer {node.api_key}"})
        first = json.loads(await resp.content.readline())
        assert first["done"] is False
        resp.close()  # the app closed the tab
    await wait_until(lambda: node.traces.in_flight == 0 and served.lock.holders == 0, 30, 0.02, "the run to end")
    trace = node.traces.recent[-1]
    assert trace.outcome == "cancelled" and trace.completion_tokens < 900


async def test_the_key_and_host_guard_ollamas_routes(node, model_id):
    for method, path, body in (("GET", "/api/tags", None), ("GET", "/api/version", None),
                               ("POST", "/api/chat", {"model": model_id, "messages": QUESTION, "stream": False}),
                               ("POST", "/api/generate", {"model": model_id, "prompt": "x"}),
                               ("POST", "/api/embed", {"model": model_id, "input": "x"})):
        status, _, text = await raw(node, method, path, body, key=False)
        assert status == 401 and "API key" in json.loads(text)["error"], path
    status, _, text = await raw(node, "GET", "/api/tags", headers={"Host": "evil.example"})
    assert status == 403 and "DNS-rebinding" in json.loads(text)["error"]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def keyless(tmp_path_factory):
    base = tmp_path_factory.mktemp("ollama-keyless")
    async with running_node(node_config(base / "data", tiny_model(base), require_api_key_for_inference=False)) as n:
        yield n


async def test_keyless_loopback_but_not_a_foreign_page(keyless):
    """--no-auth-inference: an app on this machine needs no key; a web page posting text/plain (no
    CORS preflight) from another site is refused as on /v1."""
    model = keyless.models.all()[0].id
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False,
            "options": {"num_predict": 2}}
    status, _, text = await raw(keyless, "POST", "/api/chat", body, key=False)
    assert status == 200 and json.loads(text)["done"] is True
    page = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    for path, sent in (("/api/chat", body), ("/api/generate", {"model": model, "prompt": "hi"}),
                       ("/v1/chat/completions", {"model": model, "messages": body["messages"]})):
        status, _, text = await raw(keyless, "POST", path, sent, key=False, headers=page)
        assert status == 401, (path, text)


# a tiny random model with DeepSeek-R1's template: its reply starts inside the thoughts and a random
# model never closes them (tests/node/test_api_reasoning.py)
THINKER = SynthSpec(n_ctx=2048, think=True, control_tokens=R1_MARKERS,
                    chat_template=template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"), name="thinker")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def thinker(tmp_path_factory):
    base = tmp_path_factory.mktemp("ollama-thinker")
    async with running_node(node_config(base / "data", tiny_model(base, THINKER, "thinker.gguf"))) as n:
        yield n


async def test_a_reasoning_models_thoughts_are_thinking(thinker):
    model = thinker.models.all()[0].id
    client = ollama_client(thinker)
    assert "thinking" in (await client.show(model)).capabilities
    ask = {"model": model, "messages": [{"role": "user", "content": "Is the sky blue?"}], "think": True,
           "options": {"num_predict": 8, **GREEDY}}
    whole = await client.chat(**ask)
    assert whole.message.thinking and whole.message.content == "" and whole.done_reason == "length"
    parts = [p async for p in await client.chat(**ask, stream=True)]
    assert "".join(p.message.thinking or "" for p in parts) == whole.message.thinking
    generated = await client.generate(model=model, prompt="Is the sky blue?", think=True,
                                      options={"num_predict": 8, **GREEDY})
    assert generated.thinking == whole.message.thinking and generated.response == ""


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/embed", "/api/tags", "/api/show"])
async def test_keyless_does_not_cover_another_machine(path):
    """--no-auth-inference: a client on the LAN (or behind a proxy on this machine) needs the key on
    Ollama's routes as on /v1 (the middleware, with the connection's address as a LAN client's)."""
    middleware = make_auth_middleware("sk-test", inference_needs_key=False, allowed_hosts=frozenset())

    async def handler(_request):
        return web.Response(text="ok")

    method = "GET" if path == "/api/tags" else "POST"
    with pytest.raises(AuthenticationFailed):
        await middleware(request_from("192.168.1.20", path=path, method=method), handler)
    with pytest.raises(AuthenticationFailed):
        await middleware(request_from("127.0.0.1", {"X-Forwarded-For": "192.168.1.30"}, path=path, method=method),
                         handler)
    assert (await middleware(request_from("192.168.1.20", {"Authorization": "Bearer sk-test"}, path=path,
                                          method=method), handler)).text == "ok"
    assert (await middleware(request_from("127.0.0.1", path=path, method=method), handler)).text == "ok"
