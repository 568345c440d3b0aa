"""Embeddings over HTTP: OpenAI's POST /v1/embeddings and llama-server's own embedding routes.

llama-server answers POST /embedding (legacy) and /embeddings with its native shape,
`[{"index": i, "embedding": [[...vector...]]}, ...]` (one vector per input, pooled, as ours), and
so does its /v1/embeddings when the body gives `content` instead of `input`. The native routes take
`content` or `input` (the same shapes as /v1/embeddings), `model` optional (the first model held
whole, as llama_native), and `embd_normalize` 2 (Euclidean, the only normalization this node does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web

from node.api import json_body
from node.api.appkeys import NODE
from node.api.embedding_schemas import parse_embeddings
from node.api.errors import ErrorShape, error_response, read_json
from node.api.llama_native import _default_model
from node.api.responses import embeddings_body
from node.errors import InvalidRequest, NodeError, ShuttingDown, Unsupported
from node.inference.embeddings import EmbeddingRequest, EmbeddingResult, run_embeddings
from node.trace import RequestTrace

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

EUCLIDEAN = 2  # llama-server's `embd_normalize` for L2, its default and this node's only one


async def serve_traced_json(node: Any, trace: RequestTrace,
                            produce: Callable[[], Awaitable[Callable[[], Any]]],
                            shape: ErrorShape = "openai") -> web.Response:
    """One traced request whose reply is one JSON body (embeddings, rerank): `produce()` does the
    work and gives the function that builds the body, which runs off the loop with its encoding, in
    pieces (thousands of floats, megabytes of documents: one json.dumps holds the GIL throughout,
    2,048 inputs' vectors, 2.9 MB, stalled the loop 0.28 s from a worker thread). Errors in the
    OpenAI shape (or `shape`'s); the trace is finished either way."""
    hub = node.traces
    outcome, error = "error", None
    try:
        if node.stopping:
            raise ShuttingDown("the node is shutting down; try another node or again later")
        build = await produce()
        trace.finished = time.monotonic()
        data = await asyncio.get_running_loop().run_in_executor(None, lambda: json_body.encode(build()))
        outcome = "ok"
        return web.Response(body=data, content_type="application/json", charset="utf-8", headers=trace.headers())
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    except NodeError as exc:
        error = exc
        trace.finished = time.monotonic()  # an error's timings are the summary line's too (total)
        return error_response(exc, headers=trace.headers(), shape=shape)
    except Exception:  # a bug: a 500 in the OpenAI shape, the traceback in the log
        log.exception("request failed unexpectedly request_id=%s", trace.request_id)
        error = NodeError("internal server error; see the node log for details")
        trace.finished = time.monotonic()
        return error_response(error, headers=trace.headers(), shape=shape)
    finally:
        hub.finish(trace, outcome, error=error)


async def serve_embeddings(request: web.Request, embedding: EmbeddingRequest,
                           render: Callable[[EmbeddingResult], Any], shape: ErrorShape = "openai") -> web.Response:
    """Run one embeddings request (traced) and write `render(result)` as JSON."""
    node = request.app[NODE]
    trace = node.traces.start(RequestTrace(model=embedding.model, operation="embeddings"))

    async def produce() -> Callable[[], Any]:
        result = await run_embeddings(node.models, embedding, trace, node.short_id, remote=node.embedder)
        return lambda: render(result)

    return await serve_traced_json(node, trace, produce, shape)


def native_body(result: EmbeddingResult) -> list[dict[str, Any]]:
    """llama-server's native reply: each input's pooled vector, as a list of one vector."""
    # (run in the executor: a float32 array's rows become lists of floats here)
    return [{"index": i, "embedding": [np.asarray(vector, dtype="<f4").tolist()]} for i, vector in enumerate(result.vectors)]


def parse_native(request: web.Request, body: Any) -> EmbeddingRequest:
    """A llama-server native embeddings body as the /v1/embeddings request it means."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    out = dict(body)
    if "input" not in out and "content" in out:
        out["input"] = out.pop("content")
    elif "input" not in out:
        raise InvalidRequest('"input" or "content" must be provided', param="input")
    normalize = out.pop("embd_normalize", None)
    if normalize is not None and (type(normalize) is not int or normalize != EUCLIDEAN):
        raise Unsupported(f"`embd_normalize` {normalize!r} is not supported: this node's vectors are of unit "
                          f"Euclidean length ({EUCLIDEAN}, llama-server's default)", param="embd_normalize")
    out.pop("encoding_format", None)  # llama-server writes floats in this shape whatever it says
    out["model"] = _default_model(request, body.get("model"))
    return parse_embeddings(out)


@routes.post("/v1/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    """Embeddings of one or more inputs from a model held whole here (llama.cpp embedding mode), or
    by a peer holding it whole (remote embeddings). A body with `content` and no `input` is
    llama-server's native form and gets its native reply, as llama-server gives it."""
    body = await read_json(request)
    if isinstance(body, dict) and "content" in body and "input" not in body:
        return await serve_embeddings(request, parse_native(request, body), native_body)
    embedding = parse_embeddings(body)
    return await serve_embeddings(request, embedding,
                                  lambda result: embeddings_body(result, embedding.encoding_format))


@routes.post("/embedding")
@routes.post("/embeddings")
async def native_embeddings(request: web.Request) -> web.Response:
    """llama-server's native embeddings: `content` (or `input`), the reply a list of
    `{index, embedding: [vector]}`."""
    return await serve_embeddings(request, parse_native(request, await read_json(request)), native_body)
