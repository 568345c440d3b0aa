"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions (/v1/embeddings:
embed_routes.py); /models and /chat/completions too, as llama-server answers them (an app given the
base URL without /v1 posts there).

Handlers are thin: parse (schemas), then the shared driver (driver.serve: trace, run, stream or
collect) with this dialect's shapes (responses: bodies and chunks).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from node.api import choices_reply, extras
from node.api.appkeys import NODE
from node.api.choices_reply import ChoicesChunks
from node.api.driver import serve
from node.api.errors import read_json
from node.api.responses import StreamChunks, completion_body
from node.api.schemas import parse_completion
from node.api.streaming import SSE_CONTENT_TYPE
from node.api.tool_schemas import async_check_tool_schemas
from node.errors import InvalidRequest
from node.inference.choices import ChoicesRun
from node.inference.generate import CompletionRun
from node.inference.request import CompletionRequest, TokenLogprob

log = logging.getLogger(__name__)

routes = web.RouteTableDef()


def _anthropic_asks(request: web.Request) -> bool:
    """True when the Anthropic SDK (or an app speaking its API) lists the models: it sends this header
    with every request and reads ModelInfo's fields."""
    return "anthropic-version" in request.headers


def _with_model_info(entry: dict[str, Any]) -> dict[str, Any]:
    """A /v1/models entry with Anthropic's ModelInfo fields too (its SDK left them None otherwise)."""
    created = datetime.fromtimestamp(entry["created"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {**entry, "type": "model", "display_name": entry["name"], "created_at": created,
            "lifecycle": "active", "max_input_tokens": entry["context_length"]}


@routes.get("/v1/models")
@routes.get("/models")
async def list_models(request: web.Request) -> web.Response:
    """Models this node can serve (and, with a peer network, the swarm)."""
    models = request.app[NODE].list_openai_models()
    if not _anthropic_asks(request):
        return web.json_response({"object": "list", "data": models})
    page, has_more = _anthropic_models_page([_with_model_info(m) for m in models], request.query)
    return web.json_response({"object": "list", "data": page, "has_more": has_more,
                              "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None})


_MAX_PAGE = 1000  # Anthropic's bound on `limit`


def _anthropic_models_page(models: list[dict[str, Any]], query: Mapping[str, str]) -> tuple[list[dict[str, Any]], bool]:
    """Anthropic's paging of GET /v1/models: the models after `after_id` (or before `before_id`),
    at most `limit` of them (every one without it), and whether more lie beyond. An id no longer
    listed (a peer left between pages) pages from the end: an empty page, not the list again."""
    raw = query.get("limit")
    limit = len(models)
    if raw is not None:
        try:
            limit = int(raw)
        except ValueError:
            limit = 0
        if not 1 <= limit <= _MAX_PAGE:
            raise InvalidRequest(f"`limit` must be an integer between 1 and {_MAX_PAGE}, got {raw!r}", param="limit")
    ids = [m["id"] for m in models]
    if "before_id" in query:
        end = ids.index(query["before_id"]) if query["before_id"] in ids else 0
        start = max(0, end - limit)
        return models[start:end], start > 0
    start = ids.index(query["after_id"]) + 1 if query.get("after_id") in ids else (
        len(ids) if "after_id" in query else 0)
    return models[start:start + limit], start + limit < len(models)


@routes.get("/v1/models/{model_id}")
async def get_model(request: web.Request) -> web.Response:
    """One model by id or name (404 if unknown)."""
    model = request.app[NODE].openai_model(request.match_info["model_id"])
    return web.json_response(_with_model_info(model) if _anthropic_asks(request) else model)


@routes.post("/v1/chat/completions")
@routes.post("/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Chat completion, streaming or not."""
    body = await read_json(request)
    await async_check_tool_schemas(body)
    return await serve_completion(request, parse_completion(body, "chat"),
                                  hide_reasoning=isinstance(body, dict) and extras.reasoning_excluded(body))


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    """Text completion, streaming or not."""
    return await serve_completion(request, parse_completion(await read_json(request), "text"))


class ChatDialect:
    """OpenAI chat.completion / text_completion bodies and chunks (driver.Dialect)."""

    error_shape = "openai"
    stream_content_type = SSE_CONTENT_TYPE
    body_in_worker = True  # the body reads the finished run only

    def __init__(self, completion: CompletionRequest, hide_reasoning: bool = False):
        self.completion = completion
        self.hide_reasoning = hide_reasoning  # OpenRouter's reasoning.exclude: no reasoning_content

    def events(self, run: CompletionRun | ChoicesRun) -> StreamChunks | ChoicesChunks:
        if isinstance(run, ChoicesRun):  # OpenAI's `n` > 1
            return ChoicesChunks(self.completion, run, hide_reasoning=self.hide_reasoning)
        return StreamChunks(self.completion, run.trace, hide_reasoning=self.hide_reasoning)

    def body(self, run: CompletionRun | ChoicesRun, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        if isinstance(run, ChoicesRun):
            return choices_reply.body(self.completion, run, run.logprobs, self.hide_reasoning)
        calls = [*run.tool_calls, run.cut_call] if run.cut_call is not None else run.tool_calls  # as a stream sent it
        return completion_body(self.completion, run.trace, run.content, logprobs, calls,
                               "" if self.hide_reasoning else run.reasoning)


async def serve_completion(request: web.Request, completion: CompletionRequest, *,
                           hide_reasoning: bool = False) -> web.StreamResponse:
    """Serve one chat or text completion through the shared driver."""
    return await serve(request, completion, ChatDialect(completion, hide_reasoning))
