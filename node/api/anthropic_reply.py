"""The Anthropic Messages API's reply: the message body and the streamed events (message_start,
content_block_*, message_delta, message_stop, ping) of one run, and the dialect the shared driver
serves /v1/messages with (node.api.anthropic parses the request)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from node.api import anthropic_thinking as thinking
from node.api.errors import to_anthropic
from node.api.json_body import dumps_line
from node.api.streaming import SSE_CONTENT_TYPE
from node.errors import NodeError
from node.inference.generate import CompletionRun
from node.inference.request import Delta, TokenLogprob
from node.inference.tools import partial_object
from node.trace import RequestTrace


def message_id(trace: RequestTrace) -> str:
    return "msg_" + trace.request_id.replace("-", "")


def stop_reason(run: CompletionRun) -> str:
    """Anthropic's stop_reason from the run's finish."""
    trace = run.trace
    if trace.finish_reason == "length":  # also when calls were kept before the cut: the turn is truncated
        return "max_tokens"
    if getattr(run, "stopped_in_call", False) and trace.finish_detail == "stop_sequence":
        return "stop_sequence"  # a call a stop sequence cut is not to be run, whatever came whole before it (r76)
    if run.tool_calls or trace.finish_reason == "tool_calls":
        return "tool_use"
    if trace.finish_detail == "stop_sequence":
        return "stop_sequence"
    return "end_turn"


def _usage(trace: RequestTrace) -> dict[str, int]:
    """Anthropic's accounting: the prompt is `input_tokens` + `cache_read_input_tokens` (its prefix
    found in a KV cache, known once the prompt is placed), as llama-server reports it too."""
    cached = min(trace.cached_tokens or 0, trace.prompt_tokens or 0)
    return {"input_tokens": (trace.prompt_tokens or 0) - cached, "output_tokens": trace.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def _tool_input(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}


def message_body(run: CompletionRun) -> dict[str, Any]:
    """The non-streaming Message."""
    trace = run.trace
    content: list[dict[str, Any]] = [thinking.thinking_block(run.reasoning)] if run.reasoning else []
    if run.content:
        content.append({"type": "text", "text": run.content})
    for call in run.tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _tool_input(call.arguments)})
    if run.cut_call is not None:  # max_tokens cut it: the members written whole, as a stream's client parses them
        call = run.cut_call
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": partial_object(call.arguments)})
    return {"id": message_id(trace), "type": "message", "role": "assistant", "model": trace.model,
            "content": content, "stop_reason": stop_reason(run), "stop_sequence": run.stop_sequence,
            "usage": _usage(trace), "x_swarm": trace.timings()}


def _event(name: str, payload: dict[str, Any]) -> bytes:
    data = dumps_line({"type": name, **payload})
    return f"event: {name}\ndata: {data}\n\n".encode()


class MessageEvents:
    """The streamed events of one Message, as Anthropic sends them (streaming.StreamEvents)."""

    def __init__(self, run: CompletionRun):
        self.run = run
        self._index = -1  # the open content block's index
        self._open: str | None = None  # "thinking" | "text" | "tool_use" | None
        self._tool_index: int | None = None  # the open tool_use block's ToolCallDelta.index

    def opening(self) -> list[bytes]:
        trace = self.run.trace
        message = {"id": message_id(trace), "type": "message", "role": "assistant", "model": trace.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {**_usage(trace), "output_tokens": 0}}
        return [_event("message_start", {"message": message}), _event("ping", {})]

    def _start(self, block: dict[str, Any], kind: str) -> list[bytes]:
        out = self._stop_block()
        self._index += 1
        self._open = kind
        return [*out, _event("content_block_start", {"index": self._index, "content_block": block})]

    def _stop_block(self) -> list[bytes]:
        if self._open is None:
            return []
        sign = [self._block_delta(thinking.signature_delta())] if self._open == "thinking" else []
        self._open = None
        return [*sign, _event("content_block_stop", {"index": self._index})]

    def _block_delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self._index, "delta": delta})

    def delta(self, delta: Delta) -> list[bytes]:
        out: list[bytes] = []
        if delta.reasoning:
            if self._open != "thinking":
                out += self._start(thinking.opening_block(), "thinking")
            out.append(self._block_delta(thinking.thinking_delta(delta.reasoning)))
        if delta.text:
            if self._open != "text":
                out += self._start({"type": "text", "text": ""}, "text")
            out.append(_event("content_block_delta", {"index": self._index,
                                                      "delta": {"type": "text_delta", "text": delta.text}}))
        for piece in delta.tool_calls:
            if self._open != "tool_use" or piece.index != self._tool_index:
                out += self._start({"type": "tool_use", "id": piece.id or "", "name": piece.name or "", "input": {}},
                                   "tool_use")
                self._tool_index = piece.index
            if piece.arguments:
                out.append(_event("content_block_delta", {
                    "index": self._index, "delta": {"type": "input_json_delta", "partial_json": piece.arguments}}))
        return out

    def closing(self) -> list[bytes]:
        trace = self.run.trace
        return [*self._stop_block(),
                _event("message_delta", {"delta": {"stop_reason": stop_reason(self.run),
                                                   "stop_sequence": self.run.stop_sequence},
                                         # cumulative, as Anthropic's: the prompt's cached part is known now
                                         "usage": _usage(trace), "x_swarm": trace.timings()}),
                _event("message_stop", {})]

    def error(self, exc: NodeError) -> list[bytes]:
        return [_event("error", {"error": to_anthropic(exc)["error"]})]


class MessagesDialect:
    """Anthropic Message bodies, events and errors (driver.Dialect)."""

    error_shape = "anthropic"
    stream_content_type = SSE_CONTENT_TYPE
    body_in_worker = True  # the body reads the finished run only
    hide_reasoning = False

    def events(self, run: CompletionRun) -> MessageEvents:
        return MessageEvents(run)

    def body(self, run: CompletionRun, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        return message_body(run)
