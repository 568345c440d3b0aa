"""The Responses API's options: which top-level fields are taken, which are refused with a 400
naming them, and the checks of `text`, `reasoning` and `include`.

`reasoning` and `include` are taken where they change nothing (2026-12-06). Coding agents send them
on every request: Codex CLI sends `reasoning: {effort, summary}` and, with `store: false`,
`include: ["reasoning.encrypted_content"]`. A reasoning model's thoughts come as a reasoning item
with its text in `content`, never encrypted (node.api.openai_responses), and this node runs no
built-in tools and takes no images, so there is nothing to include; only what would be missing from
the reply (`message.output_text.logprobs`) is refused.
"""

from __future__ import annotations

import logging

from node.api.chat_options import effort_kwargs
from node.api.schemas import _response_format as openai_response_format
from node.errors import InvalidRequest, Unsupported
from node.inference.request import ResponseFormat

log = logging.getLogger(__name__)

_KEYS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
         "parallel_tool_calls", "text", "stream", "store", "previous_response_id", "metadata", "user",
         "truncation", "include", "reasoning", "service_tier", "safety_identifier", "prompt_cache_key"}
_UNSUPPORTED = {
    "background": "background mode is not supported by this node",
    "prompt": "prompt templates are not supported by this node",
    "top_logprobs": "logprobs are not supported by the Responses API on this node",
    "max_tool_calls": "max_tool_calls is not supported by this node",
    "conversation": "conversations are not supported by this node; use previous_response_id",
    "stream_options": "stream_options are not supported by the Responses API on this node",
}
_EMPTY = (None, False, [], {})


_EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh")
_SUMMARIES = (None, "auto", "concise", "detailed")
# OpenAI's `include` values; all but the logprobs name things this node never produces
_INCLUDES = {"reasoning.encrypted_content", "web_search_call.action.sources", "web_search_call.results",
             "code_interpreter_call.outputs", "computer_call_output.output.image_url", "file_search_call.results",
             "message.input_image.image_url", "message.output_text.logprobs"}


def check_keys(body: dict) -> None:
    for key, value in body.items():
        if key in _UNSUPPORTED:
            if value in _EMPTY:
                continue
            raise Unsupported(_UNSUPPORTED[key], param=key)
        if key not in _KEYS:
            raise InvalidRequest(f"Unknown parameter: '{key}'.", param=key)


def check_reasoning(value: object) -> None:
    """`reasoning: {effort, summary}`: checked (a reasoning model's thoughts come as a reasoning
    item whatever they say; `effort: "none"` turns thinking off: reasoning_kwargs)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise InvalidRequest("Invalid type for 'reasoning': expected an object.", param="reasoning")
    for key, allowed in (("effort", _EFFORTS), ("summary", _SUMMARIES), ("generate_summary", _SUMMARIES)):
        if value.get(key) not in allowed:
            raise InvalidRequest(f"Invalid value for 'reasoning.{key}': expected one of "
                                 f"{', '.join(a for a in allowed if a)}.", param=f"reasoning.{key}")
    unknown = value.keys() - {"effort", "summary", "generate_summary"}
    if unknown:
        raise InvalidRequest(f"Unknown parameter: 'reasoning.{sorted(unknown)[0]}'.", param="reasoning")



def reasoning_kwargs(value: object) -> dict:
    """The chat template's kwargs from `reasoning` (checked before): its effort, as the chat route's
    reasoning_effort (chat_options.effort_kwargs)."""
    return effort_kwargs(value.get("effort") if isinstance(value, dict) else None)


def check_include(value: object) -> None:
    """`include`: names of things to add to the reply; taken where there is nothing to add."""
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest("Invalid type for 'include': expected a list of strings.", param="include")
    for name in value:
        if name not in _INCLUDES:
            raise InvalidRequest(f"Invalid value for 'include': {name!r} is not a known include.", param="include")
        if name == "message.output_text.logprobs":
            raise Unsupported("include 'message.output_text.logprobs' is not supported by this node: "
                              "logprobs are not supported by the Responses API here", param="include")


def text_format(body: dict) -> ResponseFormat | None:
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InvalidRequest("Invalid type for 'text': expected an object.", param="text")
    if text.get("verbosity") not in (None, "medium"):
        raise Unsupported("text.verbosity is not supported by this node", param="text.verbosity")
    fmt = text.get("format")
    if fmt is None or fmt == {"type": "text"}:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        raise InvalidRequest("Invalid 'text.format.type': expected text, json_object or json_schema.",
                             param="text.format")
    # the chat route's checks (name, schema, strict), on the same fields
    spec = {k: v for k, v in fmt.items() if k != "type"}
    return openai_response_format({"response_format": {"type": fmt["type"], **({"json_schema": spec}
                                                                              if fmt["type"] == "json_schema" else {})}})
