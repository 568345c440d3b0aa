"""Reading JSON that is still being written: where a value ends, and tool-call objects in part.

A model's reply arrives a few characters at a time; the tool-call parsers re-read the text of the
call being written after each piece. Nothing here decodes more than it must: a call's arguments
stay the raw text the model wrote (that text, once complete, is what OpenAI's `arguments` holds).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

WS = " \t\n\r"
_NUMBER_CHARS = set("+-0123456789.eE")
_LITERALS = ("true", "false", "null")
_TRAILING_ESCAPE = re.compile(r"(\\u[0-9a-fA-F]{0,3}|\\)$")
_TRAILING_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}$")


class JsonError(ValueError):
    """The text cannot become valid JSON however it continues."""


def skip_ws(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in WS:
        i += 1
    return i


def scan_string(s: str, i: int) -> int | None:
    """s[i] is '"': the index after the closing quote, or None if the string is not finished."""
    n = len(s)
    i += 1
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        if c < " ":
            raise JsonError("control character in a string")
        i += 1
    return None


def scan_value(s: str, i: int, *, final: bool = False) -> int | None:
    """The index after the JSON value starting at s[i] (no leading whitespace), or None if the
    text ends inside it. `final`: the text will not grow (a number may end at the end)."""
    n = len(s)
    if i >= n:
        return None
    c = s[i]
    if c == '"':
        return scan_string(s, i)
    if c in "{[":
        stack = [c]
        i += 1
        while i < n:
            c = s[i]
            if c == '"':
                end = scan_string(s, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                stack.append(c)
            elif c in "}]":
                if not stack or (c == "}") != (stack[-1] == "{"):
                    raise JsonError(f"unbalanced {c!r}")
                stack.pop()
                if not stack:
                    return i + 1
            i += 1
        return None
    if c in _NUMBER_CHARS:
        j = i
        while j < n and s[j] in _NUMBER_CHARS:
            j += 1
        return j if (j < n or final) else None
    for word in _LITERALS:
        if s.startswith(word, i):
            return i + len(word)
        if word.startswith(s[i:]):
            return None
    raise JsonError(f"unexpected {c!r}")


def unfinished_object(raw: str) -> bool:
    """Whether `raw` is a JSON object the text ends inside (as a call max_tokens cut short leaves
    its arguments), not text that is malformed whatever follows."""
    i = skip_ws(raw, 0)
    if i >= len(raw) or raw[i] != "{":
        return False
    try:
        return scan_value(raw, i) is None
    except JsonError:
        return False


def partial_string(raw: str) -> str:
    """The decoded text of a JSON string's body written so far (no quotes; an escape that is not
    finished is left out)."""
    raw = _TRAILING_ESCAPE.sub("", raw)
    if _TRAILING_HIGH_SURROGATE.search(raw):
        raw = raw[:-6]
    return json.loads('"' + raw + '"')


@dataclass
class PartialCall:
    """A tool-call object `{"name": ..., "arguments": {...}}` as far as it is written."""

    name: str | None = None
    args: str | None = None  # the raw text of the arguments value so far
    args_done: bool = False
    call_id: str | None = None
    done: bool = False  # the object is closed
    end: int = 0  # index after the object (when done)


ARGS_KEYS = ("arguments", "parameters")


def parse_call(s: str, i: int, *, final: bool = False, name_key: str = "name") -> PartialCall | None:
    """The call object starting at s[i] (after whitespace), or None if nothing of it is written
    yet; `name_key`: the key of its name (Cohere's `tool_name`). Raises JsonError when the text is
    not a call object."""
    i = skip_ws(s, i)
    n = len(s)
    if i >= n:
        return None
    if s[i] != "{":
        raise JsonError(f"expected a call object, got {s[i]!r}")
    call = PartialCall()
    i += 1
    first = True
    while True:
        i = skip_ws(s, i)
        if i >= n:
            return call
        if s[i] == "}" and first:
            call.done, call.end = True, i + 1
            return call
        if not first:
            if s[i] == "}":
                call.done, call.end = True, i + 1
                return call
            if s[i] != ",":
                raise JsonError(f"expected ',' or '}}' in a call object, got {s[i]!r}")
            i = skip_ws(s, i + 1)
            if i >= n:
                return call
        first = False
        if s[i] != '"':
            raise JsonError(f"expected a key in a call object, got {s[i]!r}")
        end = scan_string(s, i)
        if end is None:
            return call
        key = json.loads(s[i:end])
        i = skip_ws(s, end)
        if i >= n:
            return call
        if s[i] != ":":
            raise JsonError("expected ':' after a key")
        i = skip_ws(s, i + 1)
        if i >= n:
            return call
        end = scan_value(s, i, final=final)
        if key in ARGS_KEYS and call.args is None:
            call.args = s[i:] if end is None else s[i:end]
            call.args_done = end is not None
        elif key == name_key and end is not None:
            name = json.loads(s[i:end])
            if not isinstance(name, str):
                raise JsonError("a call's name must be a string")
            call.name = name
        elif key == "id" and end is not None:
            value = json.loads(s[i:end])
            call.call_id = value if isinstance(value, str) else None
        if end is None:
            return call
        i = end


def call_args(text: str, j: int, call: PartialCall, *, final: bool = False) -> int | None:
    """Reads the arguments object of `call` starting at text[j] (after whitespace) into call.args
    (the raw text so far; args_done once closed): the index after it, or None while it is not
    finished (call.args stays None when nothing of it is written yet). Raises JsonError when what
    is there is not an object."""
    j = skip_ws(text, j)
    if j >= len(text):
        return None
    if text[j] != "{":
        raise JsonError(f"expected the arguments object, got {text[j]!r}")
    end = scan_value(text, j, final=final)
    call.args = text[j: len(text) if end is None else end]
    call.args_done = end is not None
    return end


def partial_object(raw: str) -> dict:
    """The members of a JSON object cut short (a call's arguments the token budget ended) that were
    written whole, as a streaming client's partial parse reads them: `{"a": 1, "b": "Pa` is
    {"a": 1}. {} when none are, or the text is not the start of an object."""
    cuts: list[tuple[int, str]] = []  # (prefix length, closers) where the text may end cleanly
    stack: list[str] = []
    i, n = skip_ws(raw, 0), len(raw)
    while i < n:
        c = raw[i]
        if c == '"':
            try:
                end = scan_string(raw, i)
            except JsonError:
                end = None
            if end is None:
                break
            i = end
            cuts.append((i, "".join(reversed(stack))))  # after a value (after a key it will not parse)
            continue
        if c in "{[":
            stack.append("}" if c == "{" else "]")
            cuts.append((i + 1, "".join(reversed(stack))))
        elif c in "}]":
            if not stack:
                break
            stack.pop()
            cuts.append((i + 1, "".join(reversed(stack))))
        elif c == ",":
            cuts.append((i, "".join(reversed(stack))))
        i += 1
    for length, closers in reversed(cuts):
        try:
            value = json.loads(raw[:length] + closers)
        except ValueError:
            continue
        return value if isinstance(value, dict) else {}
    return {}
