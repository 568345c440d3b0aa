"""The API shares its event loop with the peer links (heartbeats, relay): a big complete reply is
built and JSON-encoded off that loop, with the bytes json.dumps gives (node/api/json_body.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import aiohttp
import pytest
import pytest_asyncio

from node.api import json_body, response_store, responses
from tests.support.nodes import node_config, openai_client, running_node, tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("api-loop")
    async with running_node(node_config(base / "data", tiny_model(base))) as n:
        yield n


@pytest.fixture
def client(node):  # (sync: the SDK's models are built off the loop)
    return openai_client(node)


def _no_end(served) -> dict[str, int]:
    tok = served.tokenizer
    return {str(t): -100 for t in range(tok.n_vocab) if tok.is_eog(t)}


async def test_a_reply_with_many_logprobs_is_built_and_encoded_off_the_loop(node, client, monkeypatch):
    """200 tokens with top_logprobs 20 (4,200 entries): the body is built on a worker thread (on the
    loop, 8,100 such tokens, 11.7 MB, stalled it 1.3 s) and the client gets json.dumps's bytes."""
    served = node.models.all()[0]
    loop_thread = threading.get_ident()
    built_on: list[int] = []
    real = responses.chat_logprobs

    def recording(items):
        built_on.append(threading.get_ident())
        return real(items)

    monkeypatch.setattr(responses, "chat_logprobs", recording)
    request = {"model": served.id, "max_tokens": 200, "logprobs": True, "top_logprobs": 20,
               "logit_bias": _no_end(served), "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session, session.post(
            f"http://127.0.0.1:{node.api.port}/v1/chat/completions", json=request,
            headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        raw = await r.read()
        assert r.status == 200 and r.headers["Content-Type"] == "application/json; charset=utf-8", raw[:300]
    body = await asyncio.to_thread(json.loads, raw)  # (megabytes: not on the loop the node shares)
    assert len(body["choices"][0]["logprobs"]["content"]) == 200
    assert raw == await asyncio.to_thread(lambda: json.dumps(body).encode())  # what aiohttp's json_response sent before, byte for byte
    assert built_on and loop_thread not in built_on, "the logprobs body was built on the event loop"
    # and the official client reads it as before
    reply = await client.chat.completions.create(**request)
    assert len(reply.choices[0].logprobs.content) == 200
    assert len(reply.choices[0].logprobs.content[0].top_logprobs) == 20


async def test_a_small_reply_is_made_on_the_loop(node, client, monkeypatch):
    """A reply with few logprobs is a few kilobytes: no hop to a worker."""
    served = node.models.all()[0]
    built_on: list[int] = []
    real = responses.chat_logprobs
    monkeypatch.setattr(responses, "chat_logprobs", lambda items: built_on.append(threading.get_ident()) or real(items))
    reply = await client.chat.completions.create(
        model=served.id, max_tokens=4, logprobs=True, top_logprobs=2, messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].logprobs.content and built_on == [threading.get_ident()]


@pytest.mark.parametrize("native", [False, True])
async def test_many_embeddings_are_encoded_off_the_loop_in_pieces(node, monkeypatch, native):
    """2,048 inputs: the vectors' JSON is made on a worker thread a slice at a time (one json.dumps
    there held the GIL, and so the loop, 0.28 s for 2.9 MB), with json.dumps's bytes."""
    served = node.models.all()[0]
    encoded_on: list[int] = []
    real = json_body.encode

    def recording(obj):
        encoded_on.append(threading.get_ident())
        return real(obj)

    monkeypatch.setattr(json_body, "encode", recording)
    inputs = [f"hello world number {i}" for i in range(2048)]
    request = {"model": served.id, ("content" if native else "input"): inputs}
    async with aiohttp.ClientSession() as session, session.post(
            f"http://127.0.0.1:{node.api.port}/{'embedding' if native else 'v1/embeddings'}", json=request,
            headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        raw = await r.read()
        assert r.status == 200 and r.headers["Content-Type"] == "application/json; charset=utf-8", raw[:300]
    body = await asyncio.to_thread(json.loads, raw)  # (megabytes: not on the loop the node shares)
    assert len(body if native else body["data"]) == 2048
    assert raw == await asyncio.to_thread(lambda: json.dumps(body).encode())
    assert encoded_on and threading.get_ident() not in encoded_on, "the vectors were not encoded in pieces off the loop"


async def test_a_long_responses_reply_is_encoded_off_the_loop(node, client, monkeypatch):
    """The Responses body is built on the loop (it is stored there) and, a long one, encoded on a
    worker thread in pieces, with json.dumps's bytes; so is a stored one fetched again (both were
    encoded on the loop until 2026-12-06). Here "long" is any token: the limit is patched to 0."""
    from node import const

    served = node.models.all()[0]
    monkeypatch.setattr(const, "REPLY_ON_LOOP_MAX_TOKENS", 0, raising=False)
    encoded_on: list[int] = []
    real = json_body.encode
    monkeypatch.setattr(json_body, "encode", lambda obj: encoded_on.append(threading.get_ident()) or real(obj))
    measured_on: list[int] = []  # the store measured the reply by dumping it whole (found in review)

    def dumps(obj, **kw):
        if isinstance(obj, dict) and "output" in obj:
            measured_on.append(threading.get_ident())
        return json.dumps(obj, **kw)

    monkeypatch.setattr(response_store, "json", SimpleNamespace(dumps=dumps))
    headers = {"Authorization": f"Bearer {node.api_key}"}
    request = {"model": served.id, "input": "hi", "max_output_tokens": 8, "temperature": 0}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(f"http://127.0.0.1:{node.api.port}/v1/responses", json=request) as r:
            raw = await r.read()
            assert r.status == 200 and r.headers["Content-Type"] == "application/json; charset=utf-8", raw[:300]
        body = json.loads(raw)
        assert body["usage"]["output_tokens"] > 0 and raw == json.dumps(body).encode()
        assert encoded_on and threading.get_ident() not in encoded_on, "the Responses body was encoded on the loop"
        assert threading.get_ident() not in measured_on, "the stored body was encoded on the loop to be measured"
        encoded_on.clear()
        async with session.get(f"http://127.0.0.1:{node.api.port}/v1/responses/{body['id']}") as r:
            again = await r.read()
            assert r.status == 200 and r.headers["Content-Type"] == "application/json; charset=utf-8"
        assert json.loads(again) == body and again == json.dumps(body).encode()
        assert encoded_on and threading.get_ident() not in encoded_on, "the stored response was encoded on the loop"
    reply = await client.responses.create(**request)  # and the official client reads it as before
    assert reply.output_text == body["output"][0]["content"][0]["text"]
