"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions.

Handlers are thin: parse (schemas), run (inference.generate.CompletionRun), format (this file and
streaming.py). The RequestTrace is opened and closed here; its figures come from the run.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from node.api.appkeys import NODE
from node.api.errors import error_response, read_json
from node.api.schemas import CompletionRequest, parse_completion
from node.api.streaming import stream_completion
from node.errors import NodeError
from node.trace import RequestTrace

log = logging.getLogger(__name__)

routes = web.RouteTableDef()


def completion_id(trace: RequestTrace, kind: str) -> str:
    """OpenAI-style id derived from the request id."""
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + trace.request_id.replace("-", "")


def usage(trace: RequestTrace) -> dict:
    """Exact token counts: a property of the prompt and the reply, identical cold and warm."""
    prompt = trace.prompt_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": trace.completion_tokens,
            "total_tokens": prompt + trace.completion_tokens}


def completion_body(creq: CompletionRequest, trace: RequestTrace, text: str) -> dict:
    """The non-streaming response body."""
    if creq.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": trace.finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": trace.finish_reason}
        obj = "text_completion"
    return {
        "id": completion_id(trace, creq.kind),
        "object": obj,
        "created": int(trace.created_at),
        "model": trace.model,
        "choices": [choice],
        "usage": usage(trace),
        "system_fingerprint": None,
        "x_swarm": trace.timings(),
    }


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    """Models this node can serve (and, with a peer network, the swarm)."""
    node = request.app[NODE]
    return web.json_response({"object": "list", "data": node.list_openai_models()})


@routes.get("/v1/models/{model_id}")
async def get_model(request: web.Request) -> web.Response:
    """One model by id or name (404 if unknown)."""
    node = request.app[NODE]
    wanted = request.match_info["model_id"]
    for model in node.list_openai_models():
        if model["id"] == wanted or model.get("name") == wanted:
            return web.json_response(model)
    node.models.get(wanted)  # raises ModelNotFound with the standard message
    raise AssertionError("unreachable")


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Chat completion, streaming or not."""
    creq = parse_completion(await read_json(request), "chat")
    return await serve_completion(request, creq)


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    """Text completion, streaming or not."""
    creq = parse_completion(await read_json(request), "text")
    return await serve_completion(request, creq)


async def serve_completion(request: web.Request, creq: CompletionRequest) -> web.StreamResponse:
    """Open the trace, run, respond, close the trace exactly once."""
    node = request.app[NODE]
    hub = node.traces
    trace = hub.start(RequestTrace(model=creq.model, stream=creq.stream,
                                   operation="chat.completions" if creq.kind == "chat" else "completions"))
    run = node.new_run(creq, trace)
    outcome, error = "error", None
    try:
        await run.prepare()
        if creq.stream:
            resp = await stream_completion(request, creq, run)
            outcome = run.stream_outcome
            error = run.stream_error
            return resp
        text = "".join([delta async for delta in run.deltas()])
        trace.finished = time.monotonic()  # the response's timings and the summary line agree
        outcome = "ok"
        return web.json_response(completion_body(creq, trace, text), headers=trace.headers())
    except asyncio.CancelledError:
        outcome = "cancelled"
        log.warning("DIAG: result_tx receiver dropped request_id=%s (client went away)", trace.request_id)
        raise
    except NodeError as exc:
        error = exc
        return error_response(exc, headers=trace.headers())
    except Exception:  # a bug: the client gets a 500 in the OpenAI shape, the log gets the traceback
        log.exception("request failed unexpectedly request_id=%s", trace.request_id)
        error = NodeError("internal server error; see the node log for details")
        return error_response(error, headers=trace.headers())
    finally:
        try:
            await run.close()
        finally:
            hub.finish(trace, outcome,
                       error_type=type(error).__name__ if error is not None else None,
                       error_message=error.message if error is not None else None)
