"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings.

Handlers are thin: parse (schemas), then the shared driver (driver.serve: trace, run, stream or
collect) with this dialect's shapes (responses: bodies and chunks).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from node.api.appkeys import NODE
from node.api.driver import serve
from node.api.errors import error_response, read_json
from node.api.responses import StreamChunks, completion_body, embeddings_body
from node.api.schemas import parse_completion, parse_embeddings
from node.api.tool_schemas import async_check_tool_schemas
from node.errors import NodeError, ShuttingDown
from node.inference.embeddings import run_embeddings
from node.inference.generate import CompletionRun
from node.inference.request import CompletionRequest, TokenLogprob
from node.trace import RequestTrace

log = logging.getLogger(__name__)

routes = web.RouteTableDef()


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    """Models this node can serve (and, with a peer network, the swarm)."""
    node = request.app[NODE]
    return web.json_response({"object": "list", "data": node.list_openai_models()})


@routes.get("/v1/models/{model_id}")
async def get_model(request: web.Request) -> web.Response:
    """One model by id or name (404 if unknown)."""
    return web.json_response(request.app[NODE].openai_model(request.match_info["model_id"]))


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Chat completion, streaming or not."""
    body = await read_json(request)
    await async_check_tool_schemas(body)
    return await serve_completion(request, parse_completion(body, "chat"))


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    """Text completion, streaming or not."""
    return await serve_completion(request, parse_completion(await read_json(request), "text"))


class ChatDialect:
    """OpenAI chat.completion / text_completion bodies and chunks (driver.Dialect)."""

    anthropic_errors = False

    def __init__(self, completion: CompletionRequest):
        self.completion = completion

    def events(self, run: CompletionRun) -> StreamChunks:
        return StreamChunks(self.completion, run.trace)

    def body(self, run: CompletionRun, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        calls = [*run.tool_calls, run.cut_call] if run.cut_call is not None else run.tool_calls  # as a stream sent it
        return completion_body(self.completion, run.trace, run.content, logprobs, calls)


async def serve_completion(request: web.Request, completion: CompletionRequest) -> web.StreamResponse:
    """Serve one chat or text completion through the shared driver."""
    return await serve(request, completion, ChatDialect(completion))


@routes.post("/v1/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    """Embeddings of one or more inputs from a model held whole here (llama.cpp embedding mode), or
    by a peer holding it whole (remote embeddings)."""
    embedding = parse_embeddings(await read_json(request))
    node = request.app[NODE]
    hub = node.traces
    trace = hub.start(RequestTrace(model=embedding.model, operation="embeddings"))
    outcome, error = "error", None
    try:
        if node.stopping:
            raise ShuttingDown("the node is shutting down; try another node or again later")
        result = await run_embeddings(node.models, embedding, trace, node.short_id, remote=node.embedder)
        trace.finished = time.monotonic()
        loop = asyncio.get_running_loop()  # thousands of floats: format them off the loop
        text = await loop.run_in_executor(
            None, lambda: json.dumps(embeddings_body(result, embedding.encoding_format)))
        outcome = "ok"
        return web.Response(text=text, content_type="application/json", headers=trace.headers())
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    except NodeError as exc:
        error = exc
        return error_response(exc, headers=trace.headers())
    except Exception:  # a bug: a 500 in the OpenAI shape, the traceback in the log
        log.exception("request failed unexpectedly request_id=%s", trace.request_id)
        error = NodeError("internal server error; see the node log for details")
        return error_response(error, headers=trace.headers())
    finally:
        hub.finish(trace, outcome, error=error)
