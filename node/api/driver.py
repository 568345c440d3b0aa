"""The one driver of a completion, whichever API dialect asked for it.

OpenAI chat/completions (openai.py), Anthropic Messages (anthropic.py) and OpenAI Responses
(openai_responses.py) each parse their body into the same `CompletionRequest` and hand it here
with their `Dialect` (how the reply and its errors look). The driver opens the `RequestTrace`
(operation from the request), prepares the run, streams it through streaming.stream_completion or
collects it into the dialect's body, and closes the trace exactly once with the outcome and the
error; so headers, the summary line, metrics and the GUI show every dialect's requests alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from aiohttp import web

from node import const
from node.api import json_body
from node.api.appkeys import NODE
from node.api.errors import ErrorShape, error_response
from node.api.streaming import StreamEvents, stream_completion
from node.errors import NodeError
from node.inference.choices import ChoicesRun
from node.inference.generate import CompletionRun
from node.inference.request import CompletionRequest, TokenLogprob
from node.trace import RequestTrace

log = logging.getLogger(__name__)


class Dialect(Protocol):
    """How one API writes a reply."""

    error_shape: ErrorShape  # error bodies in OpenAI's, Anthropic's or Ollama's shape
    stream_content_type: str  # a stream's: SSE (streaming.SSE_CONTENT_TYPE) or Ollama's NDJSON
    body_in_worker: bool  # body() only reads the finished run: it may run on a worker thread
    hide_reasoning: bool  # the thoughts are left out of the reply, their tokens' logprobs too (reasoning.exclude)

    def events(self, run: CompletionRun) -> StreamEvents:
        """The events of a streamed reply (SSE events, or NDJSON lines)."""

    def body(self, run: CompletionRun, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        """The JSON body of a complete reply (the run's text, tool calls and trace are final; the
        logprobs of its tokens when they were asked)."""


def default_operation(completion: CompletionRequest) -> str:
    """The trace's operation when the parser did not name one."""
    return completion.operation or ("chat.completions" if completion.kind == "chat" else "completions")


async def serve(request: web.Request, completion: CompletionRequest, dialect: Dialect) -> web.StreamResponse:
    """Open the trace, run, respond in the dialect, close the trace exactly once."""
    node = request.app[NODE]
    hub = node.traces
    trace = hub.start(RequestTrace(model=completion.model, stream=completion.stream,
                                   operation=default_operation(completion)))
    run = node.new_run(completion, trace)
    outcome, error = "error", None
    try:
        await run.prepare()
        if completion.stream:
            result = await stream_completion(request, run, dialect.events(run), dialect.stream_content_type)
            outcome, error = result.outcome, result.error
            return result.response
        choices: list[list[TokenLogprob]] = [[] for _ in range(trace.choices)]  # OpenAI's `n`: a list each
        async for delta in run.deltas():  # the run keeps the text and tool calls
            if dialect.hide_reasoning and delta.reasoning and not (delta.text or delta.tool_calls):
                continue  # as a stream leaves it out (2026-12-07, review r37: the body listed every thought token)
            choices[delta.choice].extend(delta.logprobs)
        if isinstance(run, ChoicesRun):
            run.logprobs = choices
        logprobs = choices[0]
        trace.finished = time.monotonic()  # the response's timings and the summary line agree
        reply = await _json_reply(dialect, run, logprobs, trace.headers())
        outcome = "ok"
        return reply
    except asyncio.CancelledError:
        outcome = "cancelled"
        # seed-000 marker, kept word for word: the seed's result_tx is the request's reply channel.
        # DEBUG: the summary line (INFO, outcome=cancelled) records it; an editor's autocomplete
        # closes a request per keystroke, and a WARNING each put two lines per keystroke in the log
        log.debug("DIAG: result_tx receiver dropped request_id=%s (client went away)", trace.request_id)
        raise
    except NodeError as exc:
        error = exc
        trace.finished = time.monotonic()  # an error's timings are the summary line's too (total)
        return error_response(exc, headers=trace.headers(), shape=dialect.error_shape)
    except Exception:  # a bug: the client gets a 500 in its dialect's shape, the log gets the traceback
        log.exception("request failed unexpectedly request_id=%s", trace.request_id)
        error = NodeError("internal server error; see the node log for details")
        trace.finished = time.monotonic()
        return error_response(error, headers=trace.headers(), shape=dialect.error_shape)
    finally:
        try:
            await run.close()
        finally:
            hub.finish(trace, outcome, error=error)


def _encoded_body(dialect: Dialect, run: CompletionRun, logprobs: Sequence[TokenLogprob]) -> bytes:
    """The body's bytes, as aiohttp's json_response writes them (json.dumps, UTF-8)."""
    return json_body.encode(dialect.body(run, logprobs))


async def _json_reply(dialect: Dialect, run: CompletionRun, logprobs: Sequence[TokenLogprob],
                      headers: dict[str, str]) -> web.Response:
    """A complete reply. One with many logprobs (each token's top alternatives: megabytes) or many
    tokens is built and encoded on a worker thread, in pieces (json_body): on the loop, which the
    peer links share, 8,100 tokens with top_logprobs 20 (11.7 MB) stalled it 1.3 s. A dialect whose
    body is the loop's (Responses stores it) builds it here and encodes it there. Others are a few
    kilobytes, made here."""
    every = [t for one in run.logprobs for t in one] if isinstance(run, ChoicesRun) else logprobs
    entries = sum(1 + len(t.top) for t in every)
    big = entries > const.REPLY_ON_LOOP_MAX_LOGPROBS or run.trace.completion_tokens > const.REPLY_ON_LOOP_MAX_TOKENS
    loop = asyncio.get_running_loop()
    if big and dialect.body_in_worker:
        data = await loop.run_in_executor(None, _encoded_body, dialect, run, logprobs)
    elif big:
        data = await loop.run_in_executor(None, json_body.encode, dialect.body(run, logprobs))
    else:
        data = _encoded_body(dialect, run, logprobs)
    return web.Response(body=data, content_type="application/json", charset="utf-8", headers=headers)
