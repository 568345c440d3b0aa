"""The OpenAI-compatible API of a real node on 127.0.0.1, driven by the official `openai` client
and by raw HTTP for the error paths. After every bad request the node keeps serving."""

from __future__ import annotations

import json
import time

import aiohttp
import openai
import pytest
import pytest_asyncio

from node.inference.llama_engine import LlamaEngine
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.sse import DONE, sse_data

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("api")
    model = tiny_model(base)
    async with running_node(node_config(base / "data", model)) as n:
        yield n


@pytest.fixture
def client(node):
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key, max_retries=0)


async def raw(node, method, path, *, body=None, data=None, headers=None, key=True):
    hdrs = {"Authorization": f"Bearer {node.api_key}"} if key else {}
    hdrs.update(headers or {})
    if body is not None:
        data = json.dumps(body)
        hdrs.setdefault("Content-Type", "application/json")
    async with aiohttp.ClientSession() as s, s.request(method, f"http://127.0.0.1:{node.api.port}{path}",
                                                        data=data, headers=hdrs) as r:
        text = await r.text()
        return r.status, r.headers, text


async def assert_still_serving(client, model_id):
    reply = await client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=2, temperature=0)
    assert reply.choices[0].finish_reason in ("length", "stop")


async def test_models_list(client, model_id):
    models = await client.models.list()
    assert [m.id for m in models.data] == [model_id]
    assert model_id.startswith("tiny-")


async def test_chat_non_stream(client, model_id):
    reply = await client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "hello"}], max_tokens=5, temperature=0)
    assert reply.object == "chat.completion" and reply.model == model_id
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5 and reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5


async def test_chat_raw_headers(node, model_id):
    status, headers, text = await raw(node, "POST", "/v1/chat/completions", body={
        "model": model_id, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0})
    assert status == 200, text
    assert headers["x-swarm-route"] == "local" and headers["x-swarm-segments"] == "1"
    assert headers["x-swarm-peers"] == "0" and headers["x-swarm-nodes"] == node.short_id
    timing = headers["server-timing"]
    for name in ("queue;dur=", "sched;dur=", "ttft;dur=", "decode;dur="):
        assert name in timing


async def test_chat_stream_with_usage(client, model_id):
    stream = await client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "hello"}], max_tokens=6, temperature=0,
        stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert finishes == ["length"]
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1].choices == []
    assert usage_chunks[0].usage.completion_tokens == 6
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    plain = await client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "hello"}], max_tokens=6, temperature=0)
    assert text == plain.choices[0].message.content  # greedy: same text streamed or not
    assert usage_chunks[0].usage.prompt_tokens == plain.usage.prompt_tokens


async def test_stream_raw_has_done_and_timings(node, model_id):
    status, headers, text = await raw(node, "POST", "/v1/chat/completions", body={
        "model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True})
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert "ttft" not in headers["server-timing"] and "queue;dur=" in headers["server-timing"]
    events = sse_data(text)
    assert events[-1] == DONE
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "length" and "ttft_ms" in last["x_swarm"]


async def test_completions_endpoint(client, model_id):
    reply = await client.completions.create(model=model_id, prompt="the model", max_tokens=4, temperature=0)
    assert reply.object == "text_completion" and reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 4
    chunks = [c async for c in await client.completions.create(
        model=model_id, prompt="the model", max_tokens=4, temperature=0, stream=True)]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reply.choices[0].text


async def test_seed_reproducible_sampling(client, model_id):
    kw = dict(model=model_id, messages=[{"role": "user", "content": "seed"}], max_tokens=8, temperature=1.0, seed=42)
    a = await client.chat.completions.create(**kw)
    b = await client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content


async def test_stop_sequence_cuts_reply(client, model_id):
    base = await client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "q"}],
                                                max_tokens=12, temperature=0)
    text = base.choices[0].message.content
    cut = text[len(text) // 2:][:2]
    if not cut.strip():
        pytest.skip("greedy text of the random model has no usable stop substring")
    stopped = await client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "q"}],
                                                   max_tokens=12, temperature=0, stop=[cut])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[:text.index(cut)]


@pytest.mark.parametrize(("body", "status", "param"), [
    ("{not json", 400, None),
    (json.dumps({"model": "x", "messages": [{"role": "user", "content": "x"}], "temperature": "warm"}), 400, "temperature"),
    (json.dumps({"model": "x", "messages": "hi"}), 400, "messages"),
    (json.dumps([1, 2]), 400, None),
    (b"\xff\xfe\x00garbage", 400, None),
])
async def test_malformed_and_wrong_types(node, client, model_id, body, status, param):
    got, _, text = await raw(node, "POST", "/v1/chat/completions", data=body,
                             headers={"Content-Type": "application/json"})
    assert got == status
    err = json.loads(text)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and err["message"]
    await assert_still_serving(client, model_id)


async def test_unknown_model_404(node, client, model_id):
    got, _, text = await raw(node, "POST", "/v1/chat/completions", body={
        "model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    assert got == 404
    err = json.loads(text)["error"]
    assert err["code"] == "model_not_found" and "no-such-model" in err["message"]
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    await assert_still_serving(client, model_id)


async def test_auth_missing_and_wrong_key(node, client, model_id):
    body = {"model": model_id, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    got, _, text = await raw(node, "POST", "/v1/chat/completions", body=body, key=False)
    assert got == 401 and json.loads(text)["error"]["type"] == "authentication_error"
    got, _, text = await raw(node, "POST", "/v1/chat/completions", body=body, key=False,
                             headers={"Authorization": "Bearer sk-wrong"})
    assert got == 401
    got, _, _ = await raw(node, "POST", "/v1/chat/completions", body=body, key=False,
                          headers={"x-api-key": node.api_key})
    assert got == 200
    got, _, _ = await raw(node, "GET", "/api/admin/stats", key=False)
    assert got == 401
    bad = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key="sk-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await bad.models.list()
    await assert_still_serving(client, model_id)


async def test_prompt_longer_than_context(node, client, model_id):
    long_prompt = "word " * 2000
    got, _, text = await raw(node, "POST", "/v1/chat/completions", body={
        "model": model_id, "messages": [{"role": "user", "content": long_prompt}]})
    assert got == 400
    err = json.loads(text)["error"]
    assert err["code"] == "context_length_exceeded" and "256" in err["message"]
    # room for the prompt, not for max_tokens: the reply gets what the context has left (as
    # llama-server does; apps send large defaults) and ends with "length" (EOS, id 2, banned)
    got, _, text = await raw(node, "POST", "/v1/completions", body={
        "model": model_id, "prompt": "short", "max_tokens": 10_000, "temperature": 0, "logit_bias": {"2": -100}})
    assert got == 200, text
    reply = json.loads(text)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"] == 256
    await assert_still_serving(client, model_id)


async def test_n_past_the_cap_refused(node, client, model_id):
    got, _, text = await raw(node, "POST", "/v1/chat/completions", body={
        "model": model_id, "messages": [{"role": "user", "content": "x"}], "n": 17})  # schemas.MAX_CHOICES + 1
    assert got == 400
    assert json.loads(text)["error"]["param"] == "n"
    await assert_still_serving(client, model_id)


@pytest.mark.parametrize("host", ["evil.example.com", "printer.lan:8800", "attacker.localhost.evil.com"])
async def test_foreign_host_header_rejected(node, client, model_id, host):
    got, _, text = await raw(node, "GET", "/v1/models", headers={"Host": host})
    assert got == 403
    assert json.loads(text)["error"]["code"] == "forbidden_host"
    await assert_still_serving(client, model_id)


@pytest.mark.parametrize("host", ["localhost:1234", "127.0.0.1", "[::1]:8800",
                                  # an address is no rebinding risk: a phone or WSL reaching a LAN bind
                                  "192.168.1.5:8800", "[fe80::2]", "10.0.0.7"])
async def test_loopback_and_address_host_headers_accepted(node, host):
    got, _, _ = await raw(node, "GET", "/v1/models", headers={"Host": host})
    assert got == 200


async def test_unknown_route_and_method_use_openai_shape(node):
    got, _, text = await raw(node, "GET", "/v1/nope")
    assert got == 404 and "error" in json.loads(text)
    got, _, text = await raw(node, "GET", "/v1/chat/completions")
    assert got == 405 and json.loads(text)["error"]["code"] == "method_not_allowed"


async def test_health_ready_metrics(node):
    assert (await raw(node, "GET", "/health", key=False))[0] == 200
    assert (await raw(node, "GET", "/health/ready", key=False))[0] == 200
    # one request of its own (a histogram has no bucket lines before its first sample: run alone,
    # with -k, the test failed on the module's earlier tests not having run)
    model = node.models.all()[0].id
    assert (await raw(node, "POST", "/v1/chat/completions", body={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))[0] == 200
    got, headers, text = await raw(node, "GET", "/metrics", key=False)
    assert got == 200 and "swarmllm_ttft_seconds_bucket" in text and "swarmllm_requests_total" in text


async def test_a_contributed_slice_loading_keeps_a_serving_node_ready(node):
    """Layers fetched for the swarm (the app's Contribute) must not turn /health/ready to 503
    while the node serves its own model; a configured slice (--layers) still holds it back."""
    from node.inference.pipeline.hosted import HostedSlice

    entry = node.models.all()[0].entry
    for auto_budget, expected in (((2, 2), 200), (None, 503)):
        hosted = HostedSlice(entry, 0, 1, auto_budget=auto_budget)  # loading
        node.slice_host.slices[hosted.key] = hosted
        try:
            assert (await raw(node, "GET", "/health/ready", key=False))[0] == expected
        finally:
            del node.slice_host.slices[hosted.key]
    assert (await raw(node, "GET", "/health/ready", key=False))[0] == 200
    # a node serving only configured slices (--layers, no whole model) stays ready too
    served = node.models.all()[0]
    configured = HostedSlice(entry, 0, 1, state="loaded")
    contributed = HostedSlice(entry, 1, 2, auto_budget=(1, 1))  # loading
    node.slice_host.slices.update({configured.key: configured, contributed.key: contributed})
    was, served.state = served.state, "unloaded"
    try:
        assert not node.models.ready
        assert (await raw(node, "GET", "/health/ready", key=False))[0] == 200
    finally:
        served.state = was
        del node.slice_host.slices[configured.key], node.slice_host.slices[contributed.key]


async def test_usage_identical_cold_and_warm(node, client, model_id):
    """Seed 000 gotcha #400: prompt_tokens is a property of the prompt, cold or warm."""
    body = dict(model=model_id, messages=[{"role": "user", "content": "the same prompt twice"}], max_tokens=3, temperature=0)
    got, _, text = await raw(node, "POST", f"/api/admin/models/{model_id}/unload")
    assert got == 200 and json.loads(text)["model"]["state"] == "unloaded"
    cold = await client.chat.completions.create(**body)
    warm = await client.chat.completions.create(**body)
    assert cold.usage.prompt_tokens == warm.usage.prompt_tokens
    assert cold.choices[0].message.content == warm.choices[0].message.content
    assert node.models.get(model_id).state == "loaded"


async def test_admin_models_load_unload(node, model_id):
    got, _, text = await raw(node, "GET", "/api/admin/models")
    model = json.loads(text)["models"][0]
    assert model["device"] == "cpu" and model["cpu_placement_reason"] in ("no_gpu", "configured_cpu_only")
    assert model["architecture"] == "llama" and model["n_layers"] == 2 and model["quantization"] == "F32"
    assert (await raw(node, "POST", f"/api/admin/models/{model_id}/unload"))[0] == 200
    assert node.models.get(model_id).state == "unloaded"
    got, _, text = await raw(node, "POST", f"/api/admin/models/{model_id}/load")
    assert got == 200 and json.loads(text)["model"]["state"] == "loaded"
    assert (await raw(node, "POST", "/api/admin/models/nope/load"))[0] == 404


async def test_admin_stats_and_requests(node, model_id):
    # its own requests, one served and one refused, so it passes alone and in any order
    got, served, _ = await raw(node, "POST", "/v1/chat/completions", body={
        "model": model_id, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    assert got == 200
    got, refused, _ = await raw(node, "POST", "/v1/chat/completions", body={
        "model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    assert got == 404
    got, _, text = await raw(node, "GET", "/api/admin/stats")
    stats = json.loads(text)
    assert stats["node_id"] == node.node_id and stats["in_flight"] == {"traces": 0, "pipelines": 0}
    got, _, text = await raw(node, "GET", "/api/admin/requests")
    data = json.loads(text)
    assert [r["request_id"] for r in data["recent"][-2:]] == [served["x-request-id"], refused["x-request-id"]]
    ok = data["recent"][-2]
    assert ok["summary"].startswith("DIAG: request complete") and "outcome=ok" in ok["summary"]
    failure = data["failures"][-1]
    assert failure["request_id"] == refused["x-request-id"] and failure["error_type"] == "ModelNotFound"
    assert served["x-request-id"] not in [r["request_id"] for r in data["failures"]]


async def test_empty_prompt(node, client, model_id, monkeypatch):
    body = {"model": model_id, "prompt": "", "max_tokens": 5}
    # this model starts every prompt with BOS: an empty prompt is BOS alone, a valid completion
    got, _, text = await raw(node, "POST", "/v1/completions", body=body)
    assert got == 200
    assert json.loads(text)["usage"]["prompt_tokens"] == 1
    # a model without BOS has nothing to continue from: a client error, not an engine failure
    monkeypatch.setattr(node.models.get(model_id).tokenizer, "add_bos", False)
    got, _, text = await raw(node, "POST", "/v1/completions", body=body)
    assert got == 400
    assert json.loads(text)["error"]["param"] == "prompt"
    monkeypatch.undo()
    await assert_still_serving(client, model_id)


async def test_deeply_nested_json_is_a_client_error(node, client, model_id):
    got, _, text = await raw(node, "POST", "/v1/chat/completions", data="[" * 100_000 + "]" * 100_000,
                             headers={"Content-Type": "application/json"})
    assert got == 400
    assert "nested" in json.loads(text)["error"]["message"]
    await assert_still_serving(client, model_id)


async def test_error_responses_carry_the_request_id(node):
    got, headers, _ = await raw(node, "POST", "/v1/chat/completions", body={
        "model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    assert got == 404
    rid = headers["x-request-id"]
    assert "x-swarm-route" not in headers  # no route was assembled
    failures = json.loads((await raw(node, "GET", "/api/admin/requests"))[2])["failures"]
    assert any(f["request_id"] == rid for f in failures)


async def test_unknown_model_names_do_not_grow_metric_series(node):
    for i in range(5):
        await raw(node, "POST", "/v1/chat/completions", body={
            "model": f"junk-{i}", "messages": [{"role": "user", "content": "x"}]})
    _, _, text = await raw(node, "GET", "/metrics", key=False)
    assert "junk-" not in text
    assert 'model="unknown"' in text


async def test_force_unload_stops_a_running_generation(node, client, model_id, monkeypatch):
    # 5 ms a token (in the model's thread): the unload lands mid-generation however fast the machine
    real_submit = LlamaEngine.submit

    def paced_submit(self, job, channel, is_eog, vocab=None):  # is_eog runs on the batch thread, once a token
        return real_submit(self, job, channel, lambda token: time.sleep(0.005) or is_eog(token), vocab)

    monkeypatch.setattr(LlamaEngine, "submit", paced_submit)
    messages = [{"role": "user", "content": "go"}]
    stream = await client.chat.completions.create(model=model_id, messages=messages, max_tokens=200, temperature=0,
                                                  stream=True)
    first = await stream.__anext__()
    assert first.choices[0].delta.role == "assistant"
    streamed, text_chunks = "", 0
    while text_chunks < 3:  # the generation is under way: tokens have reached the client
        chunk = await stream.__anext__()
        delta = chunk.choices[0].delta.content if chunk.choices else None
        streamed += delta or ""
        text_chunks += bool(delta)
    got, _, _ = await raw(node, "POST", f"/api/admin/models/{model_id}/unload")
    assert got == 409  # in use, not forced
    got, _, text = await raw(node, "POST", f"/api/admin/models/{model_id}/unload?force=1")
    assert got == 200 and json.loads(text)["model"]["state"] == "unloaded"
    # the stream ends with an error event, not a finish_reason: the text so far is no finished reply
    # (it ended with finish_reason "length" until 2026-12-06, and an app took the cut text for the answer)
    chunks = []

    async def read_rest():
        async for chunk in stream:
            chunks.append(chunk)

    with pytest.raises(openai.APIError, match="was unloaded: the reply was cut short"):
        await read_rest()
    for chunk in chunks:
        assert not (chunk.choices and chunk.choices[0].finish_reason), chunk
        streamed += "".join(c.delta.content or "" for c in chunk.choices)
    trace = node.traces.recent[-1]
    assert trace.outcome == "error" and text_chunks <= trace.completion_tokens < 200
    # what reached the client is the greedy text's start (and the model loads again on demand)
    again = await client.chat.completions.create(model=model_id, messages=messages, max_tokens=200, temperature=0)
    assert streamed and again.choices[0].message.content.startswith(streamed)
