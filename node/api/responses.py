"""The OpenAI response shapes, written once: ids, usage, the non-streaming body, the SSE chunks.

Both the non-streaming handler (openai.py) and the stream writer (streaming.py) build their bodies
here; neither imports the other's module.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from node.api.json_body import dumps_line
from node.errors import NodeError
from node.inference.embeddings import EmbeddingResult
from node.inference.request import CompletionRequest, Delta, TokenLogprob, ToolCall, ToolCallDelta
from node.trace import RequestTrace

DONE_EVENT = b"data: [DONE]\n\n"


def completion_id(trace: RequestTrace, kind: str) -> str:
    """OpenAI-style id derived from the request id."""
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + trace.request_id.replace("-", "")


def usage(trace: RequestTrace) -> dict[str, Any]:
    """Exact token counts: a property of the prompt and the reply, identical cold and warm; and, as
    OpenAI reports it, how many prompt tokens came from the prefix cache (when the route knows)."""
    prompt = trace.prompt_tokens or 0
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": trace.completion_tokens,
                           "total_tokens": prompt + trace.completion_tokens}
    if trace.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": trace.cached_tokens}
    if trace.reasoning_tokens:  # a reasoning model's thoughts, as OpenAI counts them
        out["completion_tokens_details"] = {"reasoning_tokens": trace.reasoning_tokens}
    return out


def chat_logprobs(items: Sequence[TokenLogprob]) -> dict[str, Any]:
    """Chat's `choices[].logprobs`: one entry per token, its top alternatives, bytes as integers."""
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes),
                         "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(b)} for s, b, lp in t.top]}
                        for t in items],
            "refusal": None}


def completion_logprobs(items: Sequence[TokenLogprob], prompt_chars: int) -> dict[str, Any]:
    """The legacy completions shape; text_offset counts characters from the start of the prompt (echo
    off), as OpenAI's and llama-cpp-python's do."""
    return {"tokens": [t.token for t in items], "token_logprobs": [t.logprob for t in items],
            "top_logprobs": [{s: lp for s, _b, lp in t.top} for t in items],
            "text_offset": [prompt_chars + t.text_offset for t in items]}


def logprobs_field(completion: CompletionRequest, items: Sequence[TokenLogprob]) -> dict[str, Any] | None:
    """A choice's `logprobs` in the request's dialect (None when not asked)."""
    if completion.params.logprobs is None:
        return None
    return chat_logprobs(items) if completion.kind == "chat" else completion_logprobs(items, len(completion.prompt))


def tool_calls_json(calls: list[ToolCall] | tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """message.tool_calls: OpenAI's shape."""
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def tool_call_deltas_json(deltas: tuple[ToolCallDelta, ...] | list[ToolCallDelta]) -> list[dict[str, Any]]:
    """delta.tool_calls: the first piece of a call carries id, type and name; later ones only
    `function.arguments`."""
    out = []
    for d in deltas:
        if d.id is not None:
            out.append({"index": d.index, "id": d.id, "type": "function",
                        "function": {"name": d.name, "arguments": d.arguments}})
        else:
            out.append({"index": d.index, "function": {"arguments": d.arguments}})
    return out


def completion_body(completion: CompletionRequest, trace: RequestTrace, text: str,
                    logprobs: Sequence[TokenLogprob] = (),
                    tool_calls: list[ToolCall] | tuple[ToolCall, ...] = (), reasoning: str = "") -> dict[str, Any]:
    """The non-streaming response body (content null when the reply is only tool calls; a reasoning
    model's thoughts in reasoning_content, as llama-server writes them, when it wrote any)."""
    return choices_body(completion, trace, [choice_json(completion, 0, trace.finish_reason, text, logprobs,
                                                        tool_calls, reasoning)])


def choice_json(completion: CompletionRequest, index: int, finish_reason: str | None, text: str,
                logprobs: Sequence[TokenLogprob] = (), tool_calls: list[ToolCall] | tuple[ToolCall, ...] = (),
                reasoning: str = "") -> dict[str, Any]:
    """One entry of a body's `choices` (OpenAI's `n`: one per choice, `index` 0..n-1)."""
    lp = logprobs_field(completion, logprobs)
    if completion.kind != "chat":
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish_reason}
    message: dict[str, Any] = {"role": "assistant", "content": text if (text or not tool_calls) else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls_json(tool_calls)
    return {"index": index, "message": message, "logprobs": lp, "finish_reason": finish_reason}


def choices_body(completion: CompletionRequest, trace: RequestTrace, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """The body around its choices: id, model, usage (every choice's tokens), the timings."""
    return {
        "id": completion_id(trace, completion.kind),
        "object": "chat.completion" if completion.kind == "chat" else "text_completion",
        "created": int(trace.created_at),
        "model": trace.model,
        "choices": choices,
        "usage": usage(trace),
        "system_fingerprint": None,
        "x_swarm": trace.timings(),
    }


def sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + dumps_line(payload).encode() + b"\n\n"


class StreamChunks:
    """The chunk events of one streamed completion (chat.completion.chunk or text_completion);
    the OpenAI chat dialect's streaming.StreamEvents.

    Exactly one chunk carries a finish_reason; the token-level timings (`x_swarm`) ride on the last
    JSON event: the usage chunk when the client asked for usage, else the finish chunk."""

    def __init__(self, completion: CompletionRequest, trace: RequestTrace, *, hide_reasoning: bool = False,
                 index: int = 0):
        self._index = index  # the choice's (OpenAI's `n`: choices_reply.ChoicesChunks has one of these each)
        self._hide_reasoning = hide_reasoning  # the thoughts are not sent (OpenRouter's reasoning.exclude)
        self._chat = completion.kind == "chat"
        self._completion = completion
        self._trace = trace
        self._include_usage = completion.include_usage
        self._opened = False  # the assistant-role chunk has gone out
        self._base: dict[str, Any] = {
            "id": completion_id(trace, completion.kind),
            "object": "chat.completion.chunk" if self._chat else "text_completion",
            "created": int(trace.created_at),
            "model": trace.model,
            "system_fingerprint": None,
        }
        if completion.include_usage:
            self._base["usage"] = None
        # A plain text chunk (no logprobs, no finish) is most of a stream's events: its JSON is the
        # same bytes around the text every time, rendered once here (byte for byte what _chunk gives).
        marker = "\x00"
        sample = self._chunk({"content": marker}, None).decode()
        cut = sample.rindex(json.dumps(marker, ensure_ascii=False))  # the text is the last string in it
        self._text_head = sample[:cut].encode()
        self._text_tail = sample[cut + len(json.dumps(marker, ensure_ascii=False)):].encode()

    def opening(self) -> list[bytes]:
        """Nothing yet: a chat stream's assistant-role delta goes with the reply's first piece, when
        it is known whether the reply is text (content "") or tool calls (content null, as OpenAI's
        first delta of a tool-call reply: the openai SDK's stream helpers accumulate that value,
        so a tool-call-only reply streamed ended with content "" where the whole one had None)."""
        return []

    def _role(self, content: str | None) -> list[bytes]:
        """The assistant-role chunk, once, before the first piece of a chat reply."""
        if not self._chat or self._opened:
            return []
        self._opened = True
        return [self._chunk({"role": "assistant", "content": content}, None)]

    def delta(self, delta: Delta) -> list[bytes]:
        """A chunk of generated text (with the logprobs of its tokens when they were asked), and one of
        tool-call pieces (chat only); none for an empty delta."""
        if delta.reasoning and self._hide_reasoning:  # its tokens' logprobs go with it
            if not (delta.text or delta.tool_calls):
                return []
            delta = dataclasses.replace(delta, reasoning="")
        if delta.reasoning or delta.text or delta.logprobs:
            out = self._role("")
        elif delta.tool_calls and self._chat and not self._opened:  # OpenAI's first delta of a tool-call reply
            self._opened = True
            return [self._chunk({"role": "assistant", "content": None,
                                 "tool_calls": tool_call_deltas_json(delta.tool_calls)}, None)]
        else:
            out = []
        if delta.reasoning and self._chat:  # a reasoning model's thoughts: their own chunk, as llama-server's
            out.append(self._chunk({"reasoning_content": delta.reasoning}, None,
                                   logprobs=logprobs_field(self._completion, delta.logprobs) if not delta.text else None))
            if delta.text:
                out.append(self._chunk({"content": delta.text}, None,
                                       logprobs=logprobs_field(self._completion, delta.logprobs)))
        elif delta.logprobs:
            out.append(self._chunk({"content": delta.text}, None, logprobs=logprobs_field(self._completion, delta.logprobs)))
        elif delta.text:
            out.append(self._text_chunk(delta.text))
        if delta.tool_calls:
            out.append(self._chunk({"tool_calls": tool_call_deltas_json(delta.tool_calls)}, None))
        return out

    def error(self, exc: NodeError) -> list[bytes]:
        """An OpenAI-shaped error event, then [DONE]."""
        return [sse_event(exc.to_openai()), DONE_EVENT]

    def closing(self) -> list[bytes]:
        """The events after the last text: the finish chunk, usage if asked, [DONE]."""
        trace = self._trace
        if self._include_usage:
            return [*self.finish(trace.finish_reason), self.usage_event(), DONE_EVENT]
        return [*self.finish(trace.finish_reason, x_swarm=trace.timings()), DONE_EVENT]

    def finish(self, finish_reason: str | None, **extra: Any) -> list[bytes]:
        """The choice's finish chunk (after its role chunk when it wrote nothing)."""
        opening = self._role("")  # a reply of nothing: the role chunk still comes first
        return [*opening, self._chunk({}, finish_reason, **extra)]

    def usage_event(self) -> bytes:
        """The usage chunk (stream_options.include_usage), with the timings."""
        trace = self._trace
        return sse_event({**self._base, "choices": [], "usage": usage(trace), "x_swarm": trace.timings()})

    def _text_chunk(self, text: str) -> bytes:
        return self._text_head + dumps_line(text).encode() + self._text_tail

    def _chunk(self, delta: dict[str, Any], finish: str | None, logprobs: dict[str, Any] | None = None,
               **extra: Any) -> bytes:
        if self._chat:
            choice = {"index": self._index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": self._index, "text": delta.get("content", ""), "logprobs": logprobs, "finish_reason": finish}
        return sse_event({**self._base, "choices": [choice], **extra})


def embeddings_body(result: EmbeddingResult, encoding_format: str) -> dict[str, Any]:
    """The /v1/embeddings body; base64 is the vector as little-endian float32 bytes, as OpenAI sends it."""
    data = []
    for index, vector in enumerate(result.vectors):  # float32 rows
        if encoding_format == "base64":
            embedding: Any = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        else:
            embedding = np.asarray(vector, dtype="<f4").tolist()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return {"object": "list", "data": data, "model": result.model,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}
