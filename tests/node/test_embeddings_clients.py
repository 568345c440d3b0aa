"""What real embedding clients send to /v1/embeddings (and llama-server's own embedding routes), on a
real node on 127.0.0.1 serving the embedded default model: the official `openai` client as LangChain
and LlamaIndex drive it, and raw HTTP as Open WebUI and llama.cpp's scripts send it."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from node.inference.embedder import embed_limit
from node.resources import default_model_path
from tests.support.nodes import default_model_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama,
              pytest.mark.skipif(not default_model_path().exists(),
                                 reason="the embedded default model is not in this checkout")]

# a chunk as an app indexes it: long enough that ids from another tokenizer cannot pass as this model's
CHUNK = ("Open WebUI splits each uploaded document into chunks of about a thousand characters and "
         "embeds every chunk, so a question can find the passages that answer it. ") * 2
# "hello world" in OpenAI's tiktoken cl100k_base (tiktoken's README): what LangChain's
# OpenAIEmbeddings sends for it by default (check_embedding_ctx_length=True)
TIKTOKEN_HELLO_WORLD = [15339, 1917]

node = default_model_node("embedclients")


async def post(node, path, body):
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{node.api.port}{path}", json=body,
                                                    headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status, json.loads(await r.text())


async def tokenize(node, text):
    status, reply = await post(node, "/tokenize", {"content": text})
    assert status == 200
    return reply["tokens"]


async def test_langchain_tiktoken_ids_are_refused_naming_the_setting(node, client, model_id):
    """LangChain's OpenAIEmbeddings sends tiktoken ids as lists of lists; they were embedded as
    whatever text they spell in this model's vocabulary (in it), or refused as "outside the
    vocabulary" with no word of why (past it)."""
    own = await tokenize(node, CHUNK)
    shifted = [t + 1 for t in own]  # the same text in another vocabulary's order
    for ids in (shifted, TIKTOKEN_HELLO_WORLD):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.embeddings.create(model=model_id, input=[ids])
        body = caught.value.body
        assert body["param"] == "input" and "check_embedding_ctx_length=False" in body["message"]
    # this model's own ids are embedded, and equal the text's vector
    by_ids = await client.embeddings.create(model=model_id, input=[own], encoding_format="float")
    by_text = await client.embeddings.create(model=model_id, input=CHUNK, encoding_format="float")
    assert by_ids.data[0].embedding == by_text.data[0].embedding


async def test_llama_server_native_embedding_routes(node, client, model_id):
    """llama.cpp's scripts and apps written for llama-server POST /embedding or /embeddings with
    `content` (no `model`), or `content` to /v1/embeddings, and read `[{index, embedding: [vector]}]`;
    these were a 404, and `content` on /v1/embeddings a 400."""
    want = await client.embeddings.create(model=model_id, input=["hello world", CHUNK], encoding_format="float")
    vectors = [d.embedding for d in want.data]
    for path in ("/embedding", "/embeddings", "/v1/embeddings"):
        status, reply = await post(node, path, {"content": "hello world"})
        assert status == 200, reply
        assert reply == [{"index": 0, "embedding": [vectors[0]]}]
    status, reply = await post(node, "/embeddings", {"input": ["hello world", CHUNK], "model": model_id,
                                                     "embd_normalize": 2})
    assert status == 200 and [r["embedding"] for r in reply] == [[v] for v in vectors]
    assert [r["index"] for r in reply] == [0, 1]
    # llama-server's other normalizations are refused rather than given unit vectors
    status, reply = await post(node, "/embedding", {"content": "hello world", "embd_normalize": -1})
    assert status == 400 and reply["error"]["param"] == "embd_normalize"
    status, reply = await post(node, "/embedding", {"model": model_id})
    assert status == 400 and reply["error"]["param"] == "input"
    for path in ("/embedding", "/embeddings"):  # the key, as on /v1
        async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{node.api.port}{path}",
                                                        json={"content": "x"}) as r:
            assert r.status == 401, path


async def test_nvidia_nim_input_type_and_truncate(node, client, model_id):
    """NVIDIAEmbeddings (langchain-nvidia-ai-endpoints) sends `input_type` and, when set, `truncate`
    (NONE, START, END): each was a 400 "unrecognized request argument"."""
    limit = embed_limit(node.models.get(model_id).n_ctx)
    long_text = "word " * (limit + 200)
    ids = await tokenize(node, long_text)
    assert len(ids) > limit
    status, reply = await post(node, "/v1/embeddings", {"input": [long_text, "hello world"], "model": model_id,
                                                       "encoding_format": "float", "input_type": "passage",
                                                       "truncate": "END"})
    assert status == 200, reply
    head = await client.embeddings.create(model=model_id, input=[ids[:limit], "hello world"], encoding_format="float")
    assert [d["embedding"] for d in reply["data"]] == [d.embedding for d in head.data]
    assert reply["usage"]["prompt_tokens"] == head.usage.prompt_tokens
    status, reply = await post(node, "/v1/embeddings", {"input": long_text, "model": model_id,
                                                       "input_type": "query", "truncate": "START"})
    tail = await client.embeddings.create(model=model_id, input=[ids[-limit:]], encoding_format="float")
    assert status == 200 and reply["data"][0]["embedding"] == tail.data[0].embedding
    # NONE (NIM's default): too long is the 400 it is without `truncate`
    status, reply = await post(node, "/v1/embeddings", {"input": long_text, "model": model_id, "truncate": "NONE"})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    for bad in ({"truncate": "MIDDLE"}, {"input_type": "document"}):
        status, reply = await post(node, "/v1/embeddings", {"input": "x", "model": model_id, **bad})
        assert status == 400 and reply["error"]["param"] == next(iter(bad))
