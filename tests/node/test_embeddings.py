"""POST /v1/embeddings on a real node on 127.0.0.1 serving the embedded default model, driven by the
official `openai` client; the vectors are checked against llama-cpp-python's own `Llama.embed`."""

from __future__ import annotations

import base64
import json
import struct

import aiohttp
import openai
import pytest

from node.inference.llamacpp import load as load_llama_cpp
from node.resources import default_model_path
from tests.support.nodes import default_model_node, node_config, running_node, tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama,
              pytest.mark.skipif(not default_model_path().exists(),
                                 reason="the embedded default model is not in this checkout")]

TEXTS = ["def add(a, b):\n    return a + b", "hello world", "import os"]


@pytest.fixture(scope="module")
def reference():
    """llama-cpp-python's own embeddings of TEXTS (mean pooling: the default model declares none;
    L2-normalized; flash attention, as llama-server's default `auto` takes on the CPU and the node's
    embedding context does), and its token ids for each text."""
    llama_cpp = load_llama_cpp()
    ref = llama_cpp.Llama(model_path=str(default_model_path()), embedding=True,
                          pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_threads=1, verbose=False,
                          flash_attn=True)
    try:
        assert ref.pooling_type() == llama_cpp.LLAMA_POOLING_TYPE_MEAN
        vectors = [ref.embed(text, normalize=True) for text in TEXTS]  # unit length, as OpenAI's
        tokens = [ref.tokenize(text.encode("utf-8")) for text in TEXTS]
        n_embd = ref.n_embd()
    finally:
        ref.close()
    return {"vectors": vectors, "tokens": tokens, "n_embd": n_embd}


node = default_model_node("embed")


async def post(node, body, *, key=True):
    headers = {"Authorization": f"Bearer {node.api_key}"} if key else {}
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{node.api.port}/v1/embeddings",
                                                    json=body, headers=headers) as r:
        return r.status, json.loads(await r.text())


def close(a, b, tol=1e-5):
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tol


async def test_float_and_base64_agree_and_match_llama_cpp(client, model_id, reference):
    floats = await client.embeddings.create(model=model_id, input=TEXTS[0], encoding_format="float")
    assert floats.object == "list" and floats.model == model_id and len(floats.data) == 1
    vector = floats.data[0].embedding
    assert len(vector) == reference["n_embd"]
    assert close(vector, reference["vectors"][0])
    # the SDK asks for base64 by default and decodes it; decode a raw base64 reply by hand as well
    sdk_default = await client.embeddings.create(model=model_id, input=TEXTS[0])
    assert close(list(sdk_default.data[0].embedding), vector, 0)
    raw = await client.embeddings.with_raw_response.create(model=model_id, input=TEXTS[0], encoding_format="base64")
    encoded = json.loads(raw.http_response.text)["data"][0]["embedding"]
    assert isinstance(encoded, str)
    decoded = list(struct.unpack(f"<{reference['n_embd']}f", base64.b64decode(encoded)))
    assert close(decoded, vector, 0)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == len(reference["tokens"][0])
    # unit length (they were not: norm 34.5 here, while OpenAI's and llama-server's are 1)
    assert abs(sum(x * x for x in vector) - 1.0) < 1e-5


async def test_list_of_strings_in_order_with_index(client, model_id, reference):
    reply = await client.embeddings.create(model=model_id, input=TEXTS, encoding_format="float")
    assert [d.index for d in reply.data] == list(range(len(TEXTS)))
    for got, want in zip(reply.data, reference["vectors"], strict=True):
        assert close(got.embedding, want)
    assert not close(reply.data[0].embedding, reply.data[1].embedding)
    total = sum(len(t) for t in reference["tokens"])
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == total


async def test_token_ids_equal_the_strings(client, model_id, reference):
    one = await client.embeddings.create(model=model_id, input=reference["tokens"][1], encoding_format="float")
    assert close(one.data[0].embedding, reference["vectors"][1])
    assert one.usage.prompt_tokens == len(reference["tokens"][1])
    many = await client.embeddings.create(model=model_id, input=reference["tokens"], encoding_format="float")
    for got, want in zip(many.data, reference["vectors"], strict=True):
        assert close(got.embedding, want)


async def test_dimensions(client, model_id, reference):
    same = await client.embeddings.create(model=model_id, input="x", dimensions=reference["n_embd"],
                                          encoding_format="float")
    assert len(same.data[0].embedding) == reference["n_embd"]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model=model_id, input="x", dimensions=reference["n_embd"] // 2)
    assert caught.value.body["param"] == "dimensions" and "dimensions" in caught.value.body["message"]


@pytest.mark.parametrize(("body", "param"), [
    ({}, "input"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": ["ok", 3.5]}, "input"),
    ({"input": [[1, "a"]]}, "input"),
    ({"input": {"text": "x"}}, "input"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": "word " * 1200}, "input"),  # longer than the context (the default model's: 1024)
    ({"input": [10**9]}, "input"),  # outside the vocabulary
    ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "x", "dimensions": "big"}, "dimensions"),
    ({"input": "x", "temperature": 1}, "temperature"),
])
async def test_bad_inputs_are_400_naming_the_parameter(node, model_id, body, param):
    status, reply = await post(node, {"model": model_id, **body})
    assert status == 400
    err = reply["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and err["message"]


async def test_unknown_model_is_404_and_auth_is_required(node, client):
    with pytest.raises(openai.NotFoundError):
        await client.embeddings.create(model="no-such-model", input="x")
    status, reply = await post(node, {"model": "x", "input": "x"}, key=False)
    assert status == 401 and reply["error"]["message"]


async def test_trace_is_recorded_and_model_reloads_on_demand(node, client, model_id, reference):
    await client.embeddings.create(model=model_id, input="trace me", encoding_format="float")
    recent = [t for t in node.traces.recent if t.operation == "embeddings"]
    assert recent and recent[-1].outcome == "ok" and recent[-1].route == "local"
    assert recent[-1].model == model_id and recent[-1].prompt_tokens
    served = node.models.get(model_id)
    assert served.engine.embedder is not None
    await node.models.async_unload(model_id)
    assert served.engine is None
    reply = await client.embeddings.create(model=model_id, input=TEXTS[2], encoding_format="float")
    assert close(reply.data[0].embedding, reference["vectors"][2])


async def test_model_held_as_slices_is_refused_409(tmp_path):
    model = tiny_model(tmp_path)
    async with running_node(node_config(tmp_path / "data", model, layers="0-0")) as sliced:
        mid = sliced.models.all()[0].id
        assert not sliced.models.all()[0].whole
        status, reply = await post(sliced, {"model": mid, "input": "x"})
    assert status == 409
    assert "whole" in reply["error"]["message"] and reply["error"]["param"] == "model"
