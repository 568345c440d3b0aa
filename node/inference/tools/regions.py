"""How each tool-call format writes its calls, as region readers for the streaming parser.

  hermes   `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes 2 Pro / 3, Qwen 2.5)
  mistral  `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]` (Mistral Nemo)
  llama3   `{"name": ..., "parameters": {...}}` (Llama 3.1-3.3; after `<|python_tag|>` or alone;
           several separated by `;`)
  generic  the whole reply is `{"tool_call": {...}}`, `{"tool_calls": [...]}` or `{"response": "..."}`
           (`{"response": {...}}` under a response_format: the value's JSON text is the content)
"""

from __future__ import annotations

import json

from node.inference.tools.jsonscan import (
    JsonError,
    parse_call,
    partial_string,
    scan_string,
    scan_value,
    skip_ws,
)
from node.inference.tools.parser import Region, Syntax

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_OPEN = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"


def _hermes(text: str, final: bool) -> Region:
    call = parse_call(text, 0, final=final)
    if call is None:
        return Region()
    region = Region([call])
    if not call.done:
        return region
    j = skip_ws(text, call.end)
    rest = text[j:]
    if rest.startswith(HERMES_CLOSE):
        region.end = j + len(HERMES_CLOSE)
    elif HERMES_CLOSE.startswith(rest):
        if final:  # the reply ended right after the object: a call all the same
            region.end = len(text)
    else:  # something else follows the object without the closing tag: the call still stands
        region.end = call.end
    return region


def call_list(text: str, i: int, final: bool, region: Region, name_key: str = "name") -> Region:
    """A JSON array of call objects from s[i] ('[' expected after whitespace); `name_key`: the key
    of each call's name."""
    i = skip_ws(text, i)
    if i >= len(text):
        return region
    if text[i] != "[":
        raise JsonError(f"expected '[' to open the calls, got {text[i]!r}")
    i += 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return region
        if text[i] == "]" and not region.calls:
            region.end = i + 1
            return region
        call = parse_call(text, i, final=final, name_key=name_key)
        if call is None:
            return region
        region.calls.append(call)
        if not call.done:
            return region
        i = skip_ws(text, call.end)
        if i >= len(text):
            return region
        if text[i] == "]":
            region.end = i + 1
            return region
        if text[i] != ",":
            raise JsonError(f"expected ',' or ']' between calls, got {text[i]!r}")
        i += 1


def _mistral(text: str, final: bool) -> Region:
    return call_list(text, 0, final, Region())


def _llama3(text: str, final: bool) -> Region:
    region = Region()
    i = 0
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            if final and region.calls:
                region.end = len(text)
            return region
        if region.calls and text[i] != "{":
            region.end = i  # what follows the calls is content
            return region
        call = parse_call(text, i, final=final)
        if call is None:
            return region
        region.calls.append(call)
        if not call.done:
            return region
        i = skip_ws(text, call.end)
        if i < len(text) and text[i] == ";":
            i += 1


def _generic(text: str, final: bool) -> Region:
    region = Region()
    i = skip_ws(text, 0)
    if i >= len(text):
        return region
    if text[i] != "{":
        raise JsonError("the reply is not a JSON object")
    i = skip_ws(text, i + 1)
    if i >= len(text):
        return region
    if text[i] != '"':
        raise JsonError("expected a key")
    end = scan_string(text, i)
    if end is None:
        return region
    key = json.loads(text[i:end])
    i = skip_ws(text, end)
    if i >= len(text):
        return region
    if text[i] != ":":
        raise JsonError("expected ':'")
    i = skip_ws(text, i + 1)
    if i >= len(text):
        return region
    if key == "tool_call":
        call = parse_call(text, i, final=final)
        if call is None:
            return region
        region.calls.append(call)
        if not call.done:
            return region
        i = call.end
    elif key == "tool_calls":
        call_list(text, i, final, region)
        if region.end is None:
            return region
        i, region.end = region.end, None
    elif key == "response" and text[i] != '"':  # a response_format's JSON (tool_choice "auto"): as written
        end = scan_value(text, i, final=final)
        region.content = text[i: len(text) if end is None else end]
        if end is None:
            region.partial_ok = True
            return region
        i = end
    elif key == "response":
        end = scan_string(text, i)
        region.content = partial_string(text[i + 1: len(text) if end is None else end - 1])
        if end is None:
            region.partial_ok = True  # cut short (max_tokens): the text so far is the reply
            return region
        i = end
    else:
        raise JsonError(f"unexpected key {key!r}: expected tool_call, tool_calls or response")
    i = skip_ws(text, i)
    if i >= len(text):
        region.partial_ok = final  # only the closing brace is missing
        return region
    if text[i] != "}":
        raise JsonError("expected the reply object to end")
    region.end = i + 1
    return region


HERMES = Syntax("hermes", (HERMES_OPEN,), False, _hermes)
MISTRAL = Syntax("mistral", (MISTRAL_OPEN,), False, _mistral)
LLAMA3 = Syntax("llama3", (PYTHON_TAG,), True, _llama3)
GENERIC = Syntax("generic", (), True, _generic)
