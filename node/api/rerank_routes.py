"""Reranking over HTTP: llama-server's POST /rerank, /reranking, /v1/rerank and /v1/reranking.

The body is Jina's / Cohere's (`model`, `query`, `documents` as strings or `{"text": ...}` objects,
`top_n`, `return_documents`), what Open WebUI's external reranker, AnythingLLM and LlamaIndex's /
LangChain's Jina- and Cohere-style rerankers send; the reply `{model, object: "list", usage,
results: [{index, relevance_score, document?: {text}}]}`, best first, cut to `top_n`. A body with
`texts` instead of `documents` is HF text-embeddings-inference's form and gets its reply, a list of
`{index, score, text?}` (`return_text`), as llama-server gives it. `model` may be left out: the first
reranker held whole here. Scoring: node.inference.rerank.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from node import const
from node.api.appkeys import NODE
from node.api.embed_routes import serve_traced_json
from node.api.errors import read_json
from node.api.llama_native import _default_model
from node.errors import InvalidRequest
from node.inference.rerank import RerankRequest, RerankResult, run_rerank
from node.trace import RequestTrace

log = logging.getLogger(__name__)

routes = web.RouteTableDef()


def _documents(body: dict[str, Any], key: str) -> list[str]:
    docs = body.get(key)
    if not isinstance(docs, list) or not docs:
        raise InvalidRequest(f"`{key}` must be a non-empty array of strings", param=key)
    if len(docs) > const.RERANK_MAX_DOCUMENTS:
        raise InvalidRequest(f"`{key}` has {len(docs)} documents; at most {const.RERANK_MAX_DOCUMENTS} "
                             "in one request", param=key)
    out = []
    for i, doc in enumerate(docs):
        if isinstance(doc, dict) and isinstance(doc.get("text"), str):
            doc = doc["text"]  # Cohere's and Jina's `{"text": ...}` documents
        if not isinstance(doc, str):
            raise InvalidRequest(f"`{key}[{i}]` must be a string or an object with a string `text`",
                                 param=f"{key}[{i}]")
        out.append(doc)
    return out


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"`{key}` must be a boolean", param=key)
    return bool(value)


def _default_reranker(request: web.Request, named: Any) -> str:
    """The model named, else the first reranker held whole here (else llama_native's default,
    whose refusal says it is not a reranker)."""
    if named is None:
        for served in request.app[NODE].models.whole_models():
            if served.tokenizer is not None and served.tokenizer.reranker:
                return served.id
    return _default_model(request, named)


def parse_rerank(request: web.Request, body: Any) -> RerankRequest:
    """A rerank body as a RerankRequest (400s naming the field); other fields are ignored, as
    llama-server does (Cohere's `max_chunks_per_doc`, Jina's `truncation`...)."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    query = body.get("query")
    if not isinstance(query, str):
        raise InvalidRequest("`query` must be provided, as a string", param="query")
    tei = "texts" in body and "documents" not in body
    documents = _documents(body, "texts" if tei else "documents")
    top_n = body.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 1):
        raise InvalidRequest("`top_n` must be a positive integer", param="top_n")
    return RerankRequest(model=_default_reranker(request, body.get("model")), query=query, documents=documents,
                         top_n=top_n, return_documents=_flag(body, "return_text" if tei else "return_documents"),
                         tei=tei)


def rerank_body(rerank: RerankRequest, result: RerankResult) -> Any:
    """The reply: best first (ties in input order), cut to top_n."""
    order = sorted(range(len(result.scores)), key=lambda i: -result.scores[i])[:rerank.top_n]
    if rerank.tei:
        return [{"index": i, "score": result.scores[i],
                 **({"text": rerank.documents[i]} if rerank.return_documents else {})} for i in order]
    results = [{"index": i, "relevance_score": result.scores[i],
                **({"document": {"text": rerank.documents[i]}} if rerank.return_documents else {})} for i in order]
    return {"model": result.model, "object": "list",
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
            "results": results}


@routes.post("/rerank")
@routes.post("/reranking")
@routes.post("/v1/rerank")
@routes.post("/v1/reranking")
async def rerank(request: web.Request) -> web.Response:
    """Score documents against a query with a reranker held whole here (llama.cpp rank pooling)."""
    node = request.app[NODE]
    hub = node.traces
    body = await read_json(request)
    trace = hub.start(RequestTrace(model=str(body.get("model") or "") if isinstance(body, dict) else "",
                                   operation="rerank"))

    async def produce() -> Any:
        parsed = parse_rerank(request, body)
        trace.model = parsed.model
        result = await run_rerank(node.models, parsed, trace, node.short_id)
        return lambda: rerank_body(parsed, result)  # (the documents, return_documents: maybe megabytes)

    return await serve_traced_json(node, trace, produce)
