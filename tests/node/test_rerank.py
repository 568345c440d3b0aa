"""POST /v1/rerank (and llama-server's /rerank, /reranking, /v1/reranking) on a real node on 127.0.0.1
serving tiny random rerankers (qwen3 with a classifier head and rank pooling, as Qwen3-Reranker's
GGUF) and a tiny chat model, driven over raw HTTP as Open WebUI's external reranker, AnythingLLM and
the Jina / Cohere-style rerankers of LlamaIndex and LangChain send it. A random model's scores are
arbitrary: checked are determinism, order and top_n against the scores, a document's score alone,
and the score of a pair against llama-cpp-python's own rank pooling of the same tokens."""

from __future__ import annotations

import json
from types import SimpleNamespace

import aiohttp
import openai
import pytest
import pytest_asyncio

from node.inference.llamacpp import load as load_llama_cpp
from node.inference.synth import SynthSpec
from node.logs import TRACE
from tests.support.nodes import TINY, node_config, openai_client, running_node, tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

RERANKER = SynthSpec(arch="qwen3", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512,
                     n_ctx=256, rerank=True, name="tiny-reranker")
TEMPLATE = "<s>query: {query}\ndocument: {document}</s>"
TEMPLATED = RERANKER.replace(rerank_template=TEMPLATE, seed=1, name="tiny-reranker-templated")
QUERY = "what is the model"
DOCS = ["the model is a swarm of peers", "hello world", "import data from the file",
        "a token is a number", "the test has a name"]
ROUTES = ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    models = tmp_path_factory.mktemp("rerank-models")
    paths = [tiny_model(models, RERANKER, "tiny-reranker.gguf"), tiny_model(models, TEMPLATED, "templated.gguf"),
             tiny_model(models, TINY, "tiny-chat.gguf")]
    async with running_node(node_config(tmp_path_factory.mktemp("rerank") / "data", *paths)) as n:
        yield n


def model_id(node, name: str) -> str:
    return next(m.id for m in node.models.all() if m.entry.path.name == name)


async def post(node, path, body, *, key=True):
    headers = {"Authorization": f"Bearer {node.api_key}"} if key else {}
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{node.api.port}{path}", json=body,
                                                    headers=headers) as r:
        return r.status, json.loads(await r.text())


async def rerank(node, body, path="/v1/rerank"):
    status, reply = await post(node, path, body)
    assert status == 200, reply
    return reply


async def test_scores_order_top_n_documents_and_routes(node):
    """Every document scored, best first; top_n the best n of the same scores; the same request the
    same scores; a document's score equals its score alone; `{"text"}` documents as strings;
    return_documents; usage; the four routes llama-server answers on."""
    model = model_id(node, "tiny-reranker.gguf")
    body = {"model": model, "query": QUERY, "documents": DOCS}
    full = await rerank(node, body)
    assert full["object"] == "list" and full["model"] == model
    results = full["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert len(set(scores)) > 1  # (a head of one label would score every pair 1.0)
    assert all("document" not in r for r in results)
    by_index = {r["index"]: r["relevance_score"] for r in results}
    for path in ROUTES:
        assert await rerank(node, body, path) == full  # deterministic, on every route
    top = await rerank(node, {**body, "top_n": 2, "return_documents": True,
                              "documents": [DOCS[0], *({"text": d} for d in DOCS[1:])]})
    assert [(r["index"], r["relevance_score"]) for r in top["results"]] == \
        [(r["index"], r["relevance_score"]) for r in results[:2]]
    assert [r["document"] for r in top["results"]] == [{"text": DOCS[r["index"]]} for r in results[:2]]
    assert (await rerank(node, {**body, "top_n": 99}))["results"] == results
    for i in (0, 3):  # alone: the same score (each pair is decoded on its own)
        alone = await rerank(node, {**body, "documents": [DOCS[i]]})
        assert alone["results"] == [{"index": 0, "relevance_score": by_index[i]}]
    assert full["usage"]["prompt_tokens"] == full["usage"]["total_tokens"] > 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """llama-cpp-python's own rank pooling (flash attention, as llama-server's default `auto` takes
    on the CPU and the node's embedding context does) of [BOS] "hello" "world"."""
    llama_cpp = load_llama_cpp()
    path = tiny_model(tmp_path_factory.mktemp("rerank-ref"), RERANKER, "tiny-reranker.gguf")
    ref = llama_cpp.Llama(model_path=str(path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
                          n_threads=1, n_ctx=256, flash_attn=True, verbose=False)
    try:
        pair = [ref.token_bos(), *ref.tokenize(b"hello", add_bos=False), *ref.tokenize(b"world", add_bos=False)]
        assert ref.tokenize(b"hello world") == pair  # (so embed() scores exactly this pair)
        return {"pair": pair, "score": ref.embed("hello world", normalize=False)[0]}
    finally:
        ref.close()


async def test_pair_is_scored_as_llama_cpp_ranks_it(node, reference):
    """No rerank template: the pair is [BOS] query document (this vocabulary adds no EOS or SEP), as
    llama-server builds it; its score is llama-cpp-python's rank pooling of those tokens, and usage
    counts them."""
    query, doc, pair, want = "hello", "world", reference["pair"], reference["score"]
    reply = await rerank(node, {"model": model_id(node, "tiny-reranker.gguf"), "query": query, "documents": [doc]})
    assert reply["results"][0]["relevance_score"] == pytest.approx(want, abs=1e-5)
    assert reply["usage"]["prompt_tokens"] == len(pair)


async def test_rerank_template_and_tei_shape(node):
    """A GGUF's rerank template makes the pair (specials parsed, as llama-server's); `texts` is TEI's
    form and gets its reply; `model` left out is the first reranker held whole."""
    model = model_id(node, "templated.gguf")
    reply = await rerank(node, {"model": model, "query": "q {document}", "documents": ["hello world"]})
    filled = "<s>query: q {document}\ndocument: hello world</s>"  # (the query's `{document}` stays text)
    status, tokens = await post(node, "/tokenize", {"model": model, "content": filled, "parse_special": True})
    assert status == 200, tokens
    assert tokens["tokens"][0] == 1 and tokens["tokens"][-1] == 2  # <s> and </s> as the specials
    assert reply["usage"]["prompt_tokens"] == len(tokens["tokens"])
    tei = await rerank(node, {"model": model, "query": QUERY, "texts": DOCS, "return_text": True, "top_n": 3})
    jina = await rerank(node, {"model": model, "query": QUERY, "documents": DOCS, "top_n": 3})
    assert tei == [{"index": r["index"], "score": r["relevance_score"], "text": DOCS[r["index"]]}
                   for r in jina["results"]]
    default = await rerank(node, {"query": QUERY, "documents": DOCS})
    assert default["model"] == model_id(node, "tiny-reranker.gguf")


@pytest.mark.parametrize(("body", "param"), [
    ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY}, "documents"),
    ({"query": QUERY, "documents": "hello"}, "documents"),
    ({"query": QUERY, "documents": ["hello", 2]}, "documents[1]"),
    ({"query": QUERY, "documents": [{"content": "hello"}]}, "documents[0]"),
    ({"documents": DOCS}, "query"),
    ({"query": ["a"], "documents": DOCS}, "query"),
    ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": "2"}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "return_documents": "yes"}, "return_documents"),
])
async def test_invalid_bodies_are_400s_naming_the_field(node, body, param):
    status, reply = await post(node, "/v1/rerank", {"model": model_id(node, "tiny-reranker.gguf"), **body})
    assert status == 400, reply
    assert reply["error"]["param"] == param


async def test_refusals(node):
    """A pair over the context is a 400 naming the document; a model that is not a reranker a 400
    naming it; an unknown model a 404; the API key as on /v1; embeddings of a reranker stay a 400
    after a rerank made its rank-pooling context."""
    model = model_id(node, "tiny-reranker.gguf")
    status, reply = await post(node, "/v1/rerank", {"model": model, "query": QUERY,
                                                    "documents": ["hello", "the model " * 200]})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded", reply
    assert "documents[1]" in reply["error"]["message"]
    chat = model_id(node, "tiny-chat.gguf")
    status, reply = await post(node, "/v1/rerank", {"model": chat, "query": QUERY, "documents": DOCS})
    assert status == 400 and reply["error"]["param"] == "model", reply
    assert chat in reply["error"]["message"] and "not a reranker" in reply["error"]["message"]
    status, reply = await post(node, "/v1/rerank", {"model": "no-such-model", "query": QUERY, "documents": DOCS})
    assert status == 404 and reply["error"]["code"] == "model_not_found", reply
    for path in ("/rerank", "/v1/rerank"):
        status, _ = await post(node, path, {"model": model, "query": QUERY, "documents": DOCS}, key=False)
        assert status == 401
    await rerank(node, {"model": model, "query": QUERY, "documents": DOCS})
    status, reply = await post(node, "/v1/embeddings", {"model": model, "input": "hello"})
    assert status == 400 and "reranker" in reply["error"]["message"], reply


async def test_reranker_held_as_slices_is_a_409(tmp_path):
    """Reranking runs only where the reranker is held whole (peers do not rerank for others)."""
    model = tiny_model(tmp_path, RERANKER, "tiny-reranker.gguf")
    async with running_node(node_config(tmp_path / "data", model, layers="0-0")) as sliced:
        served = sliced.models.all()[0]
        assert not served.whole
        status, reply = await post(sliced, "/v1/rerank", {"model": served.id, "query": QUERY, "documents": DOCS})
    assert status == 409, reply
    assert "whole" in reply["error"]["message"] and reply["error"]["param"] == "model"


async def test_a_rerank_is_a_request_line_of_its_own_in_the_report_with_no_content(node, caplog):
    """Found hunting the report's privacy (2026-12-06): a rerank's `DIAG: request complete` line had no
    word of what it was (a chat that produced no tokens, to a reader). Now `op=rerank`, its timings,
    and neither the query nor a document, in the report or the log (at -vvv)."""
    caplog.set_level(TRACE)
    await rerank(node, {"model": model_id(node, "tiny-reranker.gguf"), "query": "QUERY-ZEBRA-1",
                        "documents": ["DOC-ZEBRA-2 one", {"text": "DOC-ZEBRA-3 two"}]})
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{node.api.port}/api/admin/diagnostics",
                                                   headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        text = await r.text()
    recent = text.split("-- recent requests --")[1].split("-- served for others --")[0]
    [line] = [ln for ln in recent.splitlines() if " op=rerank " in ln][-1:]
    assert "outcome=ok" in line and "total_ms=" in line and "queue_ms=" in line, line
    assert "ZEBRA" not in text
    assert not [rec for rec in caplog.records if "ZEBRA" in rec.getMessage()]


@pytest.fixture
def sdk_ready():  # (outside the loop: the SDK builds its types at first use)
    openai_client(SimpleNamespace(api=SimpleNamespace(port=0), api_key="unused"))


async def test_wrong_kind_is_refused_before_the_model_loads(tmp_path, sdk_ready):
    """Embeddings of a reranker, and reranking with a chat model, are 400s the GGUF's metadata
    decides: the model is not loaded for them (embeddings of a reranker loaded it first, a
    multi-GB load for a 400, until 2026-12-06)."""
    models = [tiny_model(tmp_path, RERANKER, "tiny-reranker.gguf"), tiny_model(tmp_path, TINY, "tiny-chat.gguf")]
    async with running_node(node_config(tmp_path / "data", *models)) as n:
        reranker, chat = (next(m for m in n.models.all() if m.entry.path.name == name)
                          for name in ("tiny-reranker.gguf", "tiny-chat.gguf"))
        for served in (reranker, chat):  # (all load at start; an idle unload leaves them so)
            await n.models.async_unload(served.id)
        assert reranker.state == chat.state == "unloaded"
        client = openai_client(n)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.embeddings.create(model=reranker.id, input="hello")
        assert caught.value.body["param"] == "model" and "reranker" in caught.value.body["message"]
        status, reply = await post(n, "/v1/rerank", {"model": chat.id, "query": QUERY, "documents": DOCS})
        assert status == 400 and "not a reranker" in reply["error"]["message"], reply
        assert reranker.state == chat.state == "unloaded"


async def test_a_chat_or_completion_asked_of_a_reranker_is_a_400_naming_it(node):
    """Found in the GUI hunt (2026-12-06): /v1/chat/completions of a reranker answered 200 with noise
    (its head was read as a vocabulary). Now a 400 on `model` saying what the model does, as
    /v1/embeddings of a reranker says; the Anthropic route goes through the same run."""
    model = model_id(node, "tiny-reranker.gguf")
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"}),
                       ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})):
        status, reply = await post(node, path, {"model": model, "max_tokens": 4, **body})
        assert status == 400, (path, reply)
        error = reply["error"]
        assert "is a reranker" in error["message"] and "/v1/rerank" in error["message"], (path, reply)
