"""Ollama's reply shapes for /api/chat and /api/generate (driver.Dialect): one JSON object per line
(NDJSON, `application/x-ndjson`), each `{"model", "created_at", "message" | "response", "done":
false}`, then one with `done: true`, `done_reason` and the run's timings in nanoseconds (from the
RequestTrace, as every dialect's figures); a complete reply is that last object with the whole text.

A tool call goes out whole, in one line before the last (Ollama parses calls at the end too): its
`arguments` an object, as Ollama's clients read them. A call the token limit cut short (arguments
not JSON) is left out: Ollama's shape has no place for it. A reasoning model's thoughts are
`thinking` beside the text, as Ollama writes them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from node.api.errors import error_body
from node.api.json_body import dumps_line
from node.errors import NodeError
from node.inference.generate import CompletionRun
from node.inference.request import Delta, TokenLogprob, ToolCall
from node.trace import RequestTrace

NDJSON_CONTENT_TYPE = "application/x-ndjson"
_NS_PER_MS = 1_000_000


def created_at() -> str:
    """Now, as Ollama writes `created_at` (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def line(obj: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return dumps_line(obj).encode("utf-8") + b"\n"


def _ns(ms: float | None) -> int:
    return int((ms or 0.0) * _NS_PER_MS)


def done_fields(trace: RequestTrace) -> dict[str, Any]:
    """The last object's `done_reason` and figures: load_duration is the wait before the run had its
    route (queue, a model load, the route's assembly), prompt_eval_duration the time to the first
    token, eval_duration the rest."""
    load_ms = (trace.assembled - trace.admitted) * 1000.0 if trace.assembled is not None else 0.0
    return {"done": True, "done_reason": "length" if trace.finish_reason == "length" else "stop",
            "total_duration": _ns(trace.total_ms), "load_duration": _ns(load_ms),
            "prompt_eval_count": trace.prompt_tokens or 0, "prompt_eval_duration": _ns(trace.ttft_ms),
            "eval_count": trace.completion_tokens, "eval_duration": _ns(trace.decode_ms)}


def tool_calls_json(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """Ollama's `tool_calls`: `{"id", "function": {"index", "name", "arguments": {...}}}`."""
    return [{"id": call.id, "function": {"index": i, "name": call.name, "arguments": json.loads(call.arguments or "{}")}}
            for i, call in enumerate(calls)]


def logprobs_json(items: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """Ollama's `logprobs`: each token's text, logprob and bytes, its `top_logprobs` when asked."""
    return [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes),
             "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(b)} for s, b, lp in t.top]} for t in items]


def _piece(named: str, chat: bool, text: str, thinking: str = "",
           calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A line's model (as the client named it: `tiny:latest`), time and text: chat's `message`,
    generate's `response`."""
    out: dict[str, Any] = {"model": named, "created_at": created_at()}
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        out["message"] = message
    else:
        out["response"] = text
        if thinking:
            out["thinking"] = thinking
    return out


class OllamaEvents:
    """One Ollama stream (streaming.StreamEvents): a line per piece, the tool calls, the last line."""

    def __init__(self, run: CompletionRun, chat: bool, named: str):
        self.run = run
        self.chat = chat
        self.named = named

    def opening(self) -> list[bytes]:
        return []

    def delta(self, delta: Delta) -> list[bytes]:
        if not delta.text and not delta.reasoning and not delta.logprobs:
            return []  # a tool call's pieces: the whole call goes out at the end
        piece = _piece(self.named, self.chat, delta.text, delta.reasoning)
        if delta.logprobs:
            piece["logprobs"] = logprobs_json(delta.logprobs)
        return [line({**piece, "done": False})]

    def closing(self) -> list[bytes]:
        out = []
        if self.run.tool_calls:
            calls = tool_calls_json(self.run.tool_calls)
            out.append(line({**_piece(self.named, self.chat, "", calls=calls), "done": False}))
        out.append(line({**_piece(self.named, self.chat, ""), **done_fields(self.run.trace)}))
        return out

    def error(self, exc: NodeError) -> list[bytes]:
        return [line(error_body(exc, "ollama"))]


class OllamaDialect:
    """/api/chat (`message`) and /api/generate (`response`) replies (driver.Dialect)."""

    error_shape = "ollama"
    stream_content_type = NDJSON_CONTENT_TYPE
    body_in_worker = True  # the body reads the finished run only
    hide_reasoning = False

    def __init__(self, chat: bool, named: str):
        self.chat = chat
        self.named = named

    def events(self, run: CompletionRun) -> OllamaEvents:
        return OllamaEvents(run, self.chat, self.named)

    def body(self, run: CompletionRun, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        calls = tool_calls_json(run.tool_calls) if run.tool_calls else None
        body = {**_piece(self.named, self.chat, run.content, run.reasoning, calls), **done_fields(run.trace)}
        if logprobs:
            body["logprobs"] = logprobs_json(logprobs)
        return body
