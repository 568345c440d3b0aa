"""Server-sent events for streaming completions (OpenAI chunk format).

Headers go out once the route is assembled (queue and sched are known); token-level timings
arrive in the last JSON event (`x_swarm`), which is the usage chunk when the client asked for
usage. Exactly one chunk carries a finish_reason, then `data: [DONE]`.
"""

from __future__ import annotations

import json
import logging
import time

from aiohttp import web

from node.api.schemas import CompletionRequest
from node.errors import NodeError
from node.inference.generate import CompletionRun

log = logging.getLogger(__name__)


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def stream_completion(request: web.Request, creq: CompletionRequest, run: CompletionRun) -> web.StreamResponse:
    """Write the SSE stream; records the outcome on the run (ok / cancelled / error)."""
    from node.api.openai import completion_id, usage  # shared formatting helpers

    trace = run.trace
    started = time.monotonic()
    run.stream_outcome, run.stream_error = "error", None
    resp = web.StreamResponse(headers={
        "Content-Type": "text/event-stream; charset=utf-8",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
        **trace.headers(streaming=True),
    })
    chat = creq.kind == "chat"
    base = {
        "id": completion_id(trace, creq.kind),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(trace.created_at),
        "model": trace.model,
        "system_fingerprint": None,
    }
    if creq.include_usage:
        base["usage"] = None

    def chunk(delta_text: str | None, finish: str | None = None, role: bool = False) -> bytes:
        if chat:
            delta: dict = {}
            if role:
                delta["role"] = "assistant"
                delta["content"] = ""
            if delta_text is not None:
                delta["content"] = delta_text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish}
        return _event({**base, "choices": [choice]})

    stage = "role"
    try:
        await resp.prepare(request)
        if chat:
            await resp.write(chunk(None, role=True))
        stage = "token"
        async for delta in run.deltas():
            await resp.write(chunk(delta))
        trace.finished = time.monotonic()
        stage = "finish"
        final = chunk(None, finish=trace.finish_reason)
        if creq.include_usage:
            await resp.write(final)
            await resp.write(_event({**base, "choices": [], "usage": usage(trace), "x_swarm": trace.timings()}))
        else:
            payload = json.loads(final[6:])
            payload["x_swarm"] = trace.timings()
            await resp.write(_event(payload))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        run.stream_outcome = "ok"
        log.info("DIAG: %s stream completed request_id=%s elapsed_ms=%d token_count=%d",
                 "local" if trace.route == "local" else "SSE distributed", trace.request_id,
                 (time.monotonic() - started) * 1000, trace.completion_tokens)
    except ConnectionResetError:
        run.stream_outcome = "cancelled"
        what = {"role": "role delta send failed — client disconnected early",
                "token": "token send failed — channel full or client disconnected",
                "finish": "finish delta send failed — client disconnected at finish"}[stage]
        log.warning("DIAG: local stream %s request_id=%s token_count=%d elapsed_ms=%d", what,
                    trace.request_id, trace.completion_tokens, (time.monotonic() - started) * 1000)
    except NodeError as exc:
        run.stream_error = exc
        log.error("DIAG: local stream generate_stream error — executor error request_id=%s error=%s",
                  trace.request_id, exc.message)
        await _close_with_error(resp, exc)
    except Exception as exc:  # a bug must still end the client's stream with an error, never a hang
        log.exception("DIAG: stream failed unexpectedly request_id=%s", trace.request_id)
        err = NodeError(f"internal error while streaming: {type(exc).__name__}; see the node log")
        run.stream_error = err
        await _close_with_error(resp, err)
    return resp


async def _close_with_error(resp: web.StreamResponse, exc: NodeError) -> None:
    """An OpenAI-shaped error event, [DONE], end of stream (best effort: the client may be gone)."""
    try:
        if not resp.prepared:
            return
        await resp.write(_event(exc.to_openai()))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionResetError:
        pass
