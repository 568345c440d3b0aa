"""The Anthropic Messages and OpenAI Responses APIs on the distributed route: a random-weight model
split over two real nodes on 127.0.0.1, driven by the official SDKs. Greedy text equals llama.cpp's
on the whole file, streamed or not; the route shows in the headers and the trace."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from tests.pipeline.swarm import llama_greedy, run, split_model, start_slice_node, wait_for_route, wait_peers

pytestmark = [pytest.mark.llama, pytest.mark.slow]

PROMPT = "tell me about the swarm"
N = 12


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    base = tmp_path_factory.mktemp("dialects2")
    model = split_model(base)
    a = start_slice_node(base, "a", model, "0-2")
    b = start_slice_node(base, "b", model, "3-5", bootstrap=[a.peer_port])
    try:
        async def ready():
            for p in (a, b):
                await p.async_wait_ready()
            await wait_peers(a, 1)
            return await wait_for_route(a, "split6")
        model_id = run(ready())
        yield {"model": model, "model_id": model_id, "a": a, "expected": llama_greedy(model, PROMPT, N)}
    finally:
        for p in (a, b):
            p.terminate()


def test_messages_distributed(swarm):
    a, model_id, expected = swarm["a"], swarm["model_id"], swarm["expected"]
    client = anthropic.Anthropic(base_url=a.base, api_key=a.api_key, max_retries=0, timeout=120)
    raw = client.messages.with_raw_response.create(model=model_id, max_tokens=N, messages=[{"role": "user", "content": PROMPT}],
                                                   extra_body={"temperature": 0})
    msg = raw.parse()
    assert raw.headers["x-swarm-route"] == "distributed" and raw.headers["x-swarm-segments"] == "2"
    text = "".join(b.text for b in msg.content)
    assert text == expected
    assert msg.stop_reason == ("max_tokens" if msg.usage.output_tokens == N else "end_turn")
    with client.messages.stream(model=model_id, max_tokens=N, messages=[{"role": "user", "content": PROMPT}],
                                extra_body={"temperature": 0}) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == expected and final.usage.output_tokens == msg.usage.output_tokens
    assert final.stop_reason == msg.stop_reason


def test_responses_distributed(swarm):
    a, model_id, expected = swarm["a"], swarm["model_id"], swarm["expected"]
    client = openai.OpenAI(base_url=a.base + "/v1", api_key=a.api_key, max_retries=0, timeout=120)
    raw = client.responses.with_raw_response.create(model=model_id, input=PROMPT, max_output_tokens=N, temperature=0)
    resp = raw.parse()
    assert raw.headers["x-swarm-route"] == "distributed"
    assert resp.output_text == expected
    with client.responses.stream(model=model_id, input=PROMPT, max_output_tokens=N, temperature=0) as stream:
        events = list(stream)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected
    assert events[-1].type == ("response.incomplete" if resp.status == "incomplete" else "response.completed")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    follow = client.responses.create(model=model_id, input="and then?", previous_response_id=resp.id,
                                     max_output_tokens=2, temperature=0)
    assert follow.usage.input_tokens > resp.usage.input_tokens + resp.usage.output_tokens
    status, body = a.get("/api/admin/requests")
    assert status == 200
    trace = next(t for t in json.loads(body)["recent"] if t["request_id"] == raw.headers["x-request-id"])
    assert trace["operation"] == "responses" and trace["route"] == "distributed" and trace["outcome"] == "ok"
    assert len(trace["segments"]) == 2
