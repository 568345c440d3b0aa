"""The `messages` of an OpenAI chat body parsed into the internal message shape
(CompletionRequest.messages): roles, text content, an assistant's tool calls and the tool results
that answer them; every problem a 400 naming the message."""

from __future__ import annotations

import json
from typing import Any

from node.api import chat_options
from node.api.errors import parse_json_text
from node.errors import InvalidRequest, Unsupported
from node.inference.request import ToolCall
from node.inference.tools import unfinished_object

ROLES = ("system", "user", "assistant", "developer", "tool")
IMAGE_LEFT_OUT = "[an image was left out: this model reads text only]"  # in a tool's result, every dialect


def _message_content(msg: dict, index: int) -> str:
    content = msg.get("content")
    if content is None:  # empty (llama-server and vLLM take it; OpenAI requires it but for assistant turns)
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if msg.get("role") == "tool" and isinstance(part, dict) and part.get("type") == "image_url" \
                    and isinstance(part.get("image_url"), dict):
                # a tool's picture (Zed's agent reading an image file): the model is told it was left
                # out, as on /v1/messages. A 400 failed that request and every later one, the image
                # staying in the history; an image a user sends is still a 400 (they expect it seen)
                texts.append(IMAGE_LEFT_OUT)
                continue
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise Unsupported(f"messages[{index}].content: only text parts are supported, got {kind}",
                                  param=f"messages[{index}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequest(f"messages[{index}].content must be a string or a list of text parts",
                         param=f"messages[{index}].content")


def _history_calls(msg: dict, i: int) -> tuple[ToolCall, ...]:
    calls = msg.get("tool_calls")
    if calls is None or calls == []:
        return ()
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise InvalidRequest(f"`{where}` must be a list", param=where)
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function" \
                or not isinstance(call.get("function"), dict):
            raise InvalidRequest(f"`{at}` must be {{\"id\", \"type\": \"function\", \"function\": "
                                 "{\"name\", \"arguments\"}}", param=at)
        call_id, fn = call.get("id"), call["function"]
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequest(f"`{at}.id` must be a non-empty string", param=f"{at}.id")
        name, arguments = fn.get("name"), fn.get("arguments", "{}")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"`{at}.function.name` must be a non-empty string", param=f"{at}.function.name")
        if isinstance(arguments, dict):  # some clients send the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            raise InvalidRequest(f"`{at}.function.arguments` must be a JSON text (a string)",
                                 param=f"{at}.function.arguments")
        value = call_arguments(arguments, f"`{at}.function.arguments`", f"{at}.function.arguments")
        if not isinstance(value, dict):
            raise InvalidRequest(f"`{at}.function.arguments` must encode a JSON object",
                                 param=f"{at}.function.arguments")
        out.append(ToolCall(call_id, name, arguments or "{}"))
    return tuple(out)


def call_arguments(text: str, what: str, param: str) -> object:
    """A tool call's arguments text parsed as the body is (`parse_json_text`: deep nesting and a lone
    surrogate escape were a 500 with a traceback, 2026-12-07, review r37). An assistant turn echoed
    back may hold a call max_tokens cut short (returned so by OpenAI and llama-server): its text,
    an unfinished object, is taken as it is ({} here; the template gets the text)."""
    try:
        return parse_json_text(text or "{}", what)
    except InvalidRequest as exc:
        if isinstance(exc.__cause__, json.JSONDecodeError) and unfinished_object(text):
            return {}
        raise InvalidRequest(exc.message, param=param) from exc.__cause__


def parse_messages(body: dict) -> tuple[dict, ...]:
    """The internal message shape (CompletionRequest.messages): {"role", "content"}; assistant
    messages with calls add "tool_calls" (ToolCall tuple); tool messages add "tool_call_id" and the
    "name" of the call they answer, which must be an earlier assistant message's call."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("`messages` must be a non-empty list", param="messages")
    out: list[dict] = []
    calls_by_id: dict[str, str] = {}
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = msg.get("role")
        if role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}", param=f"messages[{i}].role")
        if "function_call" in msg and msg["function_call"] is not None:
            raise Unsupported(f"messages[{i}].function_call (legacy) is not supported: use tool_calls",
                              param=f"messages[{i}].function_call")
        entry: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                 "content": _message_content(msg, i)}
        if "tool_calls" in msg and role != "assistant" and msg["tool_calls"]:
            raise InvalidRequest(f"messages[{i}].tool_calls is only allowed on assistant messages",
                                 param=f"messages[{i}].tool_calls")
        if role == "assistant":
            thoughts = chat_options.history_reasoning(msg, i)
            if thoughts is not None:
                entry["reasoning_content"] = thoughts
            calls = _history_calls(msg, i)
            if calls:
                entry["tool_calls"] = calls
                calls_by_id.update((c.id, c.name) for c in calls)
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequest(f"messages[{i}].tool_call_id is required on tool messages",
                                     param=f"messages[{i}].tool_call_id")
            if call_id not in calls_by_id:
                raise InvalidRequest(f"messages[{i}] answers tool call {call_id!r}, which no earlier assistant "
                                     "message made", param=f"messages[{i}].tool_call_id")
            entry["tool_call_id"] = call_id
            entry["name"] = calls_by_id[call_id]
        out.append(entry)
    return tuple(out)
