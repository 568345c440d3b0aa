"""The OpenAI Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

`input` (a string or items: messages with input_text parts, function_call and
function_call_output items), `instructions`, `previous_response_id` (the conversation kept on the
node: response_store) become the same `CompletionRequest` the chat route builds, served by the
shared driver; this module writes the Response object and its typed stream events (each with a
sequence_number). Built-in tools, reasoning, background mode and the like are refused with a 400
naming them (responses_options.py); `reasoning` and `include` are taken where they change nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from node.api import json_body
from node.api.driver import serve
from node.api.errors import read_json
from node.api.history import link_tool_results
from node.api.message_schemas import call_arguments
from node.api.response_store import ResponseStore
from node.api.responses_options import (
    check_include,
    check_keys,
    check_reasoning,
    reasoning_kwargs,
    text_format,
)
from node.api.schemas import _integer, _number
from node.api.streaming import SSE_CONTENT_TYPE
from node.api.tool_schemas import async_check_tool_schemas, dialect_tools
from node.errors import InvalidRequest, NodeError, NotFound, Unsupported
from node.inference.generate import CompletionRun
from node.inference.request import CompletionRequest, Delta, TokenLogprob, ToolCall, ToolSpec
from node.inference.sampling import SamplingParams
from node.trace import RequestTrace

log = logging.getLogger(__name__)

routes = web.RouteTableDef()
STORE: web.AppKey[ResponseStore] = web.AppKey("response_store", ResponseStore)


def install(app: web.Application) -> None:
    """Give the app its response store."""
    app[STORE] = ResponseStore()


# --- the request ------------------------------------------------------------------------------


def _parts_text(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"Invalid type for '{where}': expected a string or a list of content parts.", param=where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind in kinds and isinstance(part.get("text", part.get("refusal")), str):
            texts.append(part.get("text", part.get("refusal")))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise Unsupported(f"'{where}[{i}]': {kind} content is not supported by this node", param=where)
        else:
            raise InvalidRequest(f"Invalid value for '{where}[{i}].type': expected one of {', '.join(kinds)}, "
                                 f"got {kind!r}.", param=where)
    return "".join(texts)


def _input_messages(raw: Any) -> list[dict]:
    """`input` as internal messages."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("Invalid 'input': expected a string or a non-empty list of items.", param="input")
    out: list[dict] = []
    thoughts = ""  # a reasoning item's text: the next assistant turn's reasoning_content
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if thoughts and out and out[-1]["role"] == "assistant" and "reasoning_content" not in out[-1]:
            out[-1] = {**out[-1], "reasoning_content": thoughts}
            thoughts = ""
        if isinstance(item, dict) and (item.get("type", "message") == "function_call_output"
                                       or item.get("role") in ("user", "system", "developer")):
            thoughts = ""  # a reasoning item belongs to the assistant items right after it only
        if not isinstance(item, dict):
            raise InvalidRequest(f"Invalid type for '{where}': expected an object.", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidRequest(f"Invalid value for '{where}.role': expected user, assistant, system or "
                                     "developer.", param="input")
            kinds = ("output_text", "refusal") if role == "assistant" else ("input_text",)
            text = _parts_text(item.get("content"), f"{where}.content", kinds)
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if not all(isinstance(v, str) and v for v in (call_id, name)) or not isinstance(args, str):
                raise InvalidRequest(f"'{where}': a function_call needs call_id, name and arguments (strings).",
                                     param="input")
            value = call_arguments(args, f"'{where}.arguments'", "input")  # a call cut short is taken
            if not isinstance(value, dict):
                raise InvalidRequest(f"Invalid '{where}.arguments': must encode a JSON object.", param="input")
            call = ToolCall(call_id, name, args or "{}")
            if out and out[-1]["role"] == "assistant":  # a message and its calls are one assistant turn
                out[-1] = {**out[-1], "tool_calls": [*out[-1].get("tool_calls", ()), call]}
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "reasoning":
            # an earlier turn's thoughts, as stateless clients (store false: Codex CLI) send the output
            # back: its assistant turn's reasoning_content, for the templates that show them (Qwen3's
            # inside a tool loop), as previous_response_id keeps them; its text, or else its summary
            parts = item.get("content") or item.get("summary") or []
            thoughts = "".join(p.get("text", "") for p in parts if isinstance(p, dict)
                               and isinstance(p.get("text"), str)) if isinstance(parts, list) else ""
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequest(f"Missing required parameter: '{where}.call_id'.", param="input")
            output = _parts_text(item.get("output"), f"{where}.output", ("input_text",))
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            raise Unsupported(f"'{where}': {kind} input items are not supported by this node", param="input")
    if thoughts and out and out[-1]["role"] == "assistant" and "reasoning_content" not in out[-1]:
        out[-1] = {**out[-1], "reasoning_content": thoughts}
    return out


def _tools(body: dict) -> tuple[tuple[ToolSpec, ...], str, str | None]:
    raw = body.get("tools")
    raw = [] if raw is None else raw
    choice = body.get("tool_choice")
    if not isinstance(raw, list):
        raise InvalidRequest("Invalid type for 'tools': expected a list.", param="tools")
    if not raw:
        if choice not in (None, "none", "auto"):
            raise InvalidRequest("Invalid 'tool_choice': tools must be given to choose one.", param="tool_choice")
        return (), choice or "auto", None
    if not isinstance(raw, list):
        raise InvalidRequest("Invalid type for 'tools': expected a list.", param="tools")
    functions = []
    for i, tool in enumerate(raw):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise Unsupported(f"tools[{i}]: {kind} tools are not supported by this node (only function tools)",
                              param="tools")
        unknown = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if unknown:
            raise InvalidRequest(f"Unknown parameter: 'tools[{i}].{sorted(unknown)[0]}'.", param="tools")
        functions.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    # the chat route's checks (names, the JSON schemas), its errors in this API's words
    tools = dialect_tools(functions, {"parameters": "parameters", "name": "name", "description": "description",
                                      "strict": "strict"})
    if choice is None or choice in ("auto", "none", "required"):
        return tuple(tools), choice or "auto", None
    if isinstance(choice, dict) and choice.get("type") == "function":
        if choice.get("name") not in {t.name for t in tools}:
            raise InvalidRequest(f"Invalid 'tool_choice': {choice.get('name')!r} is not one of the tools.",
                                 param="tool_choice")
        return tuple(tools), "function", choice["name"]
    raise Unsupported(f"tool_choice {choice!r} is not supported by this node", param="tool_choice")


def parse_responses(body: Any, store: ResponseStore) -> tuple[CompletionRequest, ResponseOptions]:
    """Validate a /v1/responses body; the prior conversation comes from the store."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    check_keys(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    if "input" not in body:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    stream, store_it = body.get("stream", False), body.get("store", True)
    for key, value in (("stream", stream), ("store", store_it)):
        if not isinstance(value, bool):
            raise InvalidRequest(f"Invalid type for '{key}': expected a boolean.", param=key)
    if body.get("truncation") not in (None, "disabled"):
        raise Unsupported("truncation 'auto' is not supported by this node", param="truncation")
    check_reasoning(body.get("reasoning"))
    check_include(body.get("include"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("Invalid type for 'instructions': expected a string.", param="instructions")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidRequest("Invalid type for 'metadata': expected an object.", param="metadata")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidRequest("Invalid type for 'parallel_tool_calls': expected a boolean.", param="parallel_tool_calls")
    prior: tuple[dict, ...] = ()
    previous = body.get("previous_response_id")
    if previous is not None:
        entry = store.get(previous) if isinstance(previous, str) else None
        if entry is None:
            raise InvalidRequest(f"Previous response with id '{previous}' not found.", param="previous_response_id",
                                 code="previous_response_not_found")
        prior = entry.messages
    new = tuple(_input_messages(body["input"]))
    new = tuple(link_tool_results([*prior, *new], "input")[len(prior):])
    tools, tool_choice, tool_name = _tools(body)
    response_format = text_format(body)
    params = SamplingParams(max_tokens=_integer(body, "max_output_tokens", 1, 1 << 24),
                            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                            top_p=_number(body, "top_p", 1.0, 0.0, 1.0))
    system = ({"role": "system", "content": instructions},) if instructions else ()
    completion = CompletionRequest("chat", model, stream, False, params, messages=system + prior + new,
                                   response_format=response_format, tools=tools, tool_choice=tool_choice,
                                   tool_choice_name=tool_name, parallel_tool_calls=parallel, operation="responses",
                                   template_kwargs=reasoning_kwargs(body.get("reasoning")))
    echo = {
        "instructions": instructions, "max_output_tokens": params.max_tokens, "metadata": metadata or {},
        "parallel_tool_calls": parallel, "previous_response_id": previous, "store": store_it,
        "temperature": params.temperature, "top_p": params.top_p,
        "text": {"format": body["text"]["format"] if response_format is not None else {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
        "truncation": "disabled", "user": body.get("user"), "reasoning": {"effort": None, "summary": None},
    }
    return completion, ResponseOptions(echo, prior + new, store_it)


class ResponseOptions:
    """What the reply echoes of the request, and what to store after it."""

    def __init__(self, echo: dict[str, Any], conversation: tuple[dict, ...], store: bool):
        self.echo = echo
        self.conversation = conversation  # without the instructions: they do not carry over
        self.store = store


# --- the reply --------------------------------------------------------------------------------


def response_id(trace: RequestTrace) -> str:
    return "resp_" + trace.request_id.replace("-", "")


def _message_item(trace: RequestTrace, text: str, status: str, index: int = 0) -> dict[str, Any]:
    """A message output item; `index` tells apart the message items of one streamed reply (text, a
    call, more text)."""
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" \
        else []
    suffix = f"_{index}" if index else ""
    return {"id": "msg_" + trace.request_id.replace("-", "") + suffix, "type": "message", "status": status,
            "role": "assistant", "content": content}


def _reasoning_item(trace: RequestTrace, text: str, status: str) -> dict[str, Any]:
    """A reasoning model's thoughts (node.inference.reasoning) as a reasoning item, its text in
    `content` (reasoning_text, as OpenAI's open-weight models write it), no summary."""
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"id": "rs_" + trace.request_id.replace("-", ""), "type": "reasoning", "status": status,
            "summary": [], "content": content}


def _call_item(trace: RequestTrace, index: int, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"id": f"fc_{trace.request_id.replace('-', '')}_{index}", "type": "function_call", "status": status,
            "call_id": call_id, "name": name, "arguments": arguments}


def _usage(trace: RequestTrace) -> dict[str, Any]:
    prompt = trace.prompt_tokens or 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": trace.cached_tokens or 0},
            "output_tokens": trace.completion_tokens, "output_tokens_details": {"reasoning_tokens": trace.reasoning_tokens},
            "total_tokens": prompt + trace.completion_tokens}


def response_object(trace: RequestTrace, options: ResponseOptions, status: str, output: list[dict],
                    *, usage: bool) -> dict[str, Any]:
    """The Response object (in progress, or final with usage)."""
    incomplete = status == "incomplete"
    return {"id": response_id(trace), "object": "response", "created_at": int(trace.created_at), "status": status,
            "background": False, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": trace.model, "output": output, **options.echo,
            "usage": _usage(trace) if usage else None, "x_swarm": trace.timings() if usage else None}


def _final_status(run: CompletionRun) -> str:
    return "incomplete" if run.trace.finish_reason == "length" else "completed"  # calls kept before a cut too


def _final_output(run: CompletionRun) -> list[dict]:
    calls = [*run.tool_calls, run.cut_call] if run.cut_call is not None else run.tool_calls  # as a stream sent it
    out = [_reasoning_item(run.trace, run.reasoning, "completed")] if run.reasoning else []
    out += [_message_item(run.trace, run.content, "completed")] if run.content or not (calls or out) else []
    out += [_call_item(run.trace, i, c.id, c.name, c.arguments, "completed") for i, c in enumerate(calls)]
    if out:
        out[-1]["status"] = _final_status(run)  # the item the budget cut is incomplete, as OpenAI marks it
    return out


def _remember(store: ResponseStore, run: CompletionRun, options: ResponseOptions, body: dict[str, Any]) -> None:
    if not options.store:
        return
    reply: dict[str, Any] = {"role": "assistant", "content": run.content}
    if run.reasoning:  # the template shows or drops it, as a chat's reasoning_content
        reply["reasoning_content"] = run.reasoning
    calls = [*run.tool_calls, run.cut_call] if run.cut_call is not None else run.tool_calls  # as returned
    if calls:
        reply["tool_calls"] = list(calls)
    store.put(body["id"], body, (*options.conversation, reply))


def _sse(payload: dict[str, Any]) -> bytes:
    data = json_body.dumps_line(payload)
    return f"event: {payload['type']}\ndata: {data}\n\n".encode()


class ResponseEvents:
    """The typed stream events of one Response (streaming.StreamEvents); sequence_number on each."""

    def __init__(self, run: CompletionRun, options: ResponseOptions, store: ResponseStore):
        self.run, self.options, self.store = run, options, store
        self._seq = 0
        self._items: list[dict] = []  # output items so far (the open one last)
        self._open: str | None = None  # "reasoning" | "message" | "function_call"
        self._call_index: int | None = None  # ToolCallDelta.index of the open function_call
        self._calls = 0

    def _ev(self, kind: str, **fields: Any) -> bytes:
        event = _sse({"type": kind, "sequence_number": self._seq, **fields})
        self._seq += 1
        return event

    def opening(self) -> list[bytes]:
        snapshot = response_object(self.run.trace, self.options, "in_progress", [], usage=False)
        return [self._ev("response.created", response=snapshot), self._ev("response.in_progress", response=snapshot)]

    def _close_item(self, status: str = "completed") -> list[bytes]:
        if self._open is None:
            return []
        index, item = len(self._items) - 1, self._items[-1]
        out: list[bytes] = []
        if self._open == "reasoning":
            part = item["content"][0]
            out += [self._ev("response.reasoning_text.done", item_id=item["id"], output_index=index,
                             content_index=0, text=part["text"]),
                    self._ev("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                             part=part)]
        elif self._open == "message":
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out += [self._ev("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                             text=text, logprobs=[]),
                    self._ev("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                             part=part)]
        else:
            out.append(self._ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                arguments=item["arguments"], name=item["name"]))
        item["status"] = status
        out.append(self._ev("response.output_item.done", output_index=index, item=item))
        self._open = None
        return out

    def delta(self, delta: Delta) -> list[bytes]:
        trace, out = self.run.trace, []
        if delta.reasoning:  # the thoughts come first, in one item
            if self._open != "reasoning":
                out += self._close_item()
                item = _reasoning_item(trace, "", "in_progress")
                self._items.append(item)
                self._open = "reasoning"
                out += [self._ev("response.output_item.added", output_index=len(self._items) - 1,
                                 item={**item, "content": []}),
                        self._ev("response.content_part.added", item_id=item["id"], output_index=len(self._items) - 1,
                                 content_index=0, part={"type": "reasoning_text", "text": ""})]
                item["content"] = [{"type": "reasoning_text", "text": ""}]
            item = self._items[-1]
            item["content"][0]["text"] += delta.reasoning
            out.append(self._ev("response.reasoning_text.delta", item_id=item["id"], output_index=len(self._items) - 1,
                                content_index=0, delta=delta.reasoning))
        if delta.text:
            if self._open != "message":
                out += self._close_item()
                item = _message_item(trace, "", "in_progress", sum(i["type"] == "message" for i in self._items))
                self._items.append(item)
                self._open = "message"
                index = len(self._items) - 1
                out += [self._ev("response.output_item.added", output_index=index, item={**item, "content": []}),
                        self._ev("response.content_part.added", item_id=item["id"], output_index=index,
                                 content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                        "logprobs": []})]
                item["content"] = [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]
            item = self._items[-1]
            item["content"][0]["text"] += delta.text
            out.append(self._ev("response.output_text.delta", item_id=item["id"], output_index=len(self._items) - 1,
                                content_index=0, delta=delta.text, logprobs=[]))
        for piece in delta.tool_calls:
            if self._open != "function_call" or piece.index != self._call_index:
                out += self._close_item()
                item = _call_item(trace, self._calls, piece.id or "", piece.name or "", "", "in_progress")
                self._calls += 1
                self._items.append(item)
                self._open, self._call_index = "function_call", piece.index
                out.append(self._ev("response.output_item.added", output_index=len(self._items) - 1,
                                    item=dict(item)))
            if piece.arguments:
                item = self._items[-1]
                item["arguments"] += piece.arguments
                out.append(self._ev("response.function_call_arguments.delta", item_id=item["id"],
                                    output_index=len(self._items) - 1, delta=piece.arguments))
        return out

    def closing(self) -> list[bytes]:
        status = _final_status(self.run)
        out = self._close_item(status)  # the last item: incomplete when the budget cut it
        body = response_object(self.run.trace, self.options, status, self._items, usage=True)
        _remember(self.store, self.run, self.options, body)
        out.append(self._ev("response.completed" if status == "completed" else "response.incomplete", response=body))
        return out

    def error(self, exc: NodeError) -> list[bytes]:
        failed = response_object(self.run.trace, self.options, "failed", self._items, usage=False)
        failed["error"] = {"code": exc.code or "server_error", "message": exc.message}
        return [self._ev("error", code=exc.code, message=exc.message, param=exc.param),
                self._ev("response.failed", response=failed)]


class ResponsesDialect:
    """Response objects and events; OpenAI-shaped errors (driver.Dialect)."""

    error_shape = "openai"
    stream_content_type = SSE_CONTENT_TYPE
    body_in_worker = False  # the body is stored (the store is the loop's): built there, a big one encoded off it
    hide_reasoning = False

    def __init__(self, options: ResponseOptions, store: ResponseStore):
        self.options, self.store = options, store

    def events(self, run: CompletionRun) -> ResponseEvents:
        return ResponseEvents(run, self.options, self.store)

    def body(self, run: CompletionRun, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        body = response_object(run.trace, self.options, _final_status(run), _final_output(run), usage=True)
        _remember(self.store, run, self.options, body)
        return body


@routes.post("/v1/responses")
@routes.post("/responses")  # llama-server's alias (a base URL without /v1)
async def create_response(request: web.Request) -> web.StreamResponse:
    """A model response to `input` (after the conversation of `previous_response_id`), streamed or whole."""
    store = request.app[STORE]
    body = await read_json(request)
    await async_check_tool_schemas(body)
    completion, options = parse_responses(body, store)
    return await serve(request, completion, ResponsesDialect(options, store))


def _stored(request: web.Request) -> tuple[str, dict[str, Any]]:
    rid = request.match_info["response_id"]
    entry = request.app[STORE].get(rid)
    if entry is None:
        raise NotFound(f"Response with id '{rid}' not found.")
    return rid, entry.body


@routes.get("/v1/responses/{response_id}")
async def get_response(request: web.Request) -> web.Response:
    """A stored response (404 when unknown, expired or created with store=false), encoded off the
    loop (json_body: a long reply's text and reasoning)."""
    data = await asyncio.get_running_loop().run_in_executor(None, json_body.encode, _stored(request)[1])
    return web.Response(body=data, content_type="application/json", charset="utf-8")


@routes.delete("/v1/responses/{response_id}")
async def delete_response(request: web.Request) -> web.Response:
    """Forget a stored response."""
    rid, _ = _stored(request)
    request.app[STORE].pop(rid)
    return web.json_response({"id": rid, "object": "response.deleted", "deleted": True})

