"""Google Gemma 4's tool-call format: its region reader, grammar and history.

  <|tool_call>call:NAME{city:<|"|>Paris<|"|>,days:2,opts:{deep:true,tags:[<|"|>a<|"|>]}}<tool_call|>

One marker pair a call (`<|tool_call>` and `<tool_call|>` are single tokens in Gemma 4's
vocabulary). Detection (`is_gemma4`) and the model turn its template leaves closed (`model_turn`)
are in chat.py: the tokenizer uses the second and may not import this package (import-linter). The arguments are Gemma's own notation, not JSON: keys unquoted (the template writes
them sorted), strings between `<|"|>` marks (a token too), numbers, `true`/`false`/`null`, `{...}`
and `[...]` as in JSON. JSON strings and quoted keys are read as well (the forced grammar writes an
object or array parameter as JSON: its schema holds it that way). Results go back as
`<|tool_response>response:NAME{value:...}<tool_response|>`, written by the template itself.
"""

from __future__ import annotations

import json
import re
from typing import Any

from node.inference import grammar
from node.inference.tools.jsonscan import JsonError, PartialCall, scan_string, skip_ws
from node.inference.tools.parser import Region, Syntax
from node.inference.tools.tagged import _MAX_NAME, _NAME, _args_text, _is_string, _value_schema, string_value

CALL_OPEN, CALL_CLOSE = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'
MARKERS = (CALL_OPEN, CALL_CLOSE, QUOTE, "<|tool_response>", "<tool_response|>", "<|channel>", "<channel|>")
_HEAD = "call:"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_CHARS = re.compile(r"[-+0-9.eE]*")
_WORDS = {"true": True, "false": False, "null": None}
# the newer official template reads OpenAI `tool` messages itself; the older one (-interleaved)
# wants each call's results as `tool_responses` on its assistant message (llama.cpp's workaround)
OPENAI_RESULTS = "{#- OpenAI Chat Completions:"


class _Short(Exception):
    """The text ends inside the value being read."""


def _value(text: str, i: int) -> tuple[Any, int]:
    """The value at text[i] and the index after it; _Short when the text ends inside it."""
    i = skip_ws(text, i)
    if i >= len(text):
        raise _Short
    c = text[i]
    if text.startswith(QUOTE, i):
        k = text.find(QUOTE, i + len(QUOTE))
        if k < 0:
            raise _Short
        return text[i + len(QUOTE):k], k + len(QUOTE)
    if QUOTE.startswith(text[i:]):
        raise _Short
    if c == '"':
        end = scan_string(text, i)
        if end is None:
            raise _Short
        return json.loads(text[i:end]), end
    if c == "{":
        return _dict(text, i + 1)
    if c == "[":
        return _list(text, i + 1)
    for word, value in _WORDS.items():
        if text.startswith(word, i):
            return value, i + len(word)
        if word.startswith(text[i:]):
            raise _Short
    run = _NUMBER_CHARS.match(text, i)
    if run.end() >= len(text):
        raise _Short  # (more of the number may follow)
    raw = run.group()
    if not _NUMBER.fullmatch(raw):
        raise JsonError(f"not a value: {text[i:i + 20]!r}")
    return (float(raw) if any(ch in raw for ch in ".eE") else int(raw)), run.end()


def _key(text: str, i: int) -> tuple[str, int]:
    """A key and the index after its `:`."""
    i = skip_ws(text, i)
    if i >= len(text) or (QUOTE.startswith(text[i:]) and not text.startswith(QUOTE, i)):
        raise _Short
    if text.startswith(('"', QUOTE), i):
        key, i = _value(text, i)
    else:
        k = text.find(":", i)
        raw = text[i:] if k < 0 else text[i:k]
        if any(ch in raw for ch in "{}[],<") or len(raw) > _MAX_NAME:
            raise JsonError(f"not a key: {raw[:40]!r}")
        if k < 0:
            raise _Short
        return raw.strip(), k + 1
    i = skip_ws(text, i)
    if i >= len(text):
        raise _Short
    if text[i] != ":":
        raise JsonError(f"expected ':' after the key, got {text[i]!r}")
    return key, i + 1


def _members(text: str, i: int, out: list[tuple[str, Any]]) -> int:
    """Reads `key:value` members into `out` up to and with the closing `}`; the index after it."""
    first = True
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            raise _Short
        if text[i] == "}":
            return i + 1
        if not first:
            if text[i] != ",":
                raise JsonError(f"expected ',' or '}}', got {text[i]!r}")
            i += 1
        key, i = _key(text, i)
        value, i = _value(text, i)
        out.append((key, value))
        first = False


def _dict(text: str, i: int) -> tuple[dict[str, Any], int]:
    members: list[tuple[str, Any]] = []
    end = _members(text, i, members)
    return dict(members), end


def _list(text: str, i: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            raise _Short
        if text[i] == "]":
            return items, i + 1
        if items:
            if text[i] != ",":
                raise JsonError(f"expected ',' or ']', got {text[i]!r}")
            i += 1
        value, i = _value(text, i)
        items.append(value)


def gemma4(text: str, final: bool) -> Region:
    """One call after `<|tool_call>`: `call:NAME{...}` and the closing `<tool_call|>`."""
    region = Region()
    i = skip_ws(text, 0)
    head = text[i:i + len(_HEAD)]
    if head != _HEAD:
        if len(head) < len(_HEAD) and _HEAD.startswith(head):
            return region
        raise JsonError(f"expected {_HEAD!r}, got {head!r}")
    i += len(_HEAD)
    k = text.find("{", i)
    name = text[i:] if k < 0 else text[i:k]
    if (name and not _NAME.fullmatch(name)) or len(name) > _MAX_NAME or (k >= 0 and not name):
        raise JsonError(f"not a function name: {name[:80]!r}")
    if k < 0:
        return region
    call = PartialCall(name=name, args="{")
    region.calls.append(call)
    members: list[tuple[str, Any]] = []
    try:
        end = _members(text, k + 1, members)
    except _Short:
        call.args = _args_text(members, False)
        return region
    call.args = _args_text(members, True)
    call.done = call.args_done = True
    call.end = end
    j = skip_ws(text, end)
    rest = text[j:]
    if rest.startswith(CALL_CLOSE):
        region.end = j + len(CALL_CLOSE)
    elif CALL_CLOSE.startswith(rest):
        if final:  # the reply ended right after the arguments: a call all the same
            region.end = len(text)
    else:  # something else follows without the closing marker: the call still stands
        region.end = end
    return region


GEMMA4 = Syntax("gemma4", (CALL_OPEN,), False, gemma4)


# --- the grammar (a tool_choice that forces calls) ---

def _param(key: str, prop: Any, root: dict[str, Any], comma: bool) -> grammar.Spec:
    head = grammar.literal(("," if comma else "") + key + ":")
    if _is_string(prop):  # (`<|"|>` alone in its literals: a single token in Gemma 4's vocabulary)
        return grammar.seq(head, grammar.literal(QUOTE), string_value(prop, QUOTE))
    return grammar.seq(head, grammar.json_value(_value_schema(prop, root)))


def gemma4_call(tool: Any) -> grammar.Spec:
    """One call of `tool` as the template writes it: its parameters in sorted order (the template's
    `dictsort`), the required ones always; one branch for each parameter that may come first (the
    ones up to the first required), so a comma stands only between two."""
    root = tool.parameters if isinstance(tool.parameters, dict) else {}
    props = root.get("properties") if isinstance(root.get("properties"), dict) else {}
    required = {k for k in root.get("required", []) if k in props}
    keys = sorted(props)
    later = [_param(k, props[k], root, True) for k in keys]
    branches = []
    for j, key in enumerate(keys):
        tail = [p if keys[n] in required else grammar.repeat(p, 0, 1) for n, p in enumerate(later) if n > j]
        branches.append(grammar.seq(_param(key, props[key], root, False), *tail))
        if key in required:
            break
    body = [branches[0] if len(branches) == 1 else grammar.alt(*branches)] if branches else []
    if body and not required:  # no parameter at all is a call too
        body = [grammar.repeat(body[0], 0, 1)]
    return grammar.seq(grammar.literal(CALL_OPEN), grammar.literal(f"{_HEAD}{tool.name}{{"), *body,
                       grammar.literal("}"), grammar.literal(CALL_CLOSE))


# --- the history ---

def gemma4_history(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """The messages as the template reads them. The newer template takes OpenAI `tool` messages;
    for the older one each assistant turn with calls carries its results as `tool_responses`
    (`{"name", "response"}`, the result's JSON when it is JSON) and the plain answer after them as
    its content, as llama.cpp converts them (its `tool` messages would be a `<|turn>tool` turn the
    model never saw); the call turn keeps its own `reasoning_content` (node.inference.reasoning.
    with_history sets it before the merge)."""
    if OPENAI_RESULTS in template:
        return messages
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        i += 1
        if msg["role"] != "assistant" or not msg.get("tool_calls"):
            out.append(msg)
            continue
        calls = msg["tool_calls"]
        responses = []
        while i < len(messages) and messages[i]["role"] == "tool":
            result = messages[i]
            i += 1
            name = calls[len(responses)]["function"]["name"] if len(responses) < len(calls) else ""
            responses.append({"name": name or result.get("tool_call_id", ""), "response": _result(result["content"])})
        turn = {"role": "assistant", "content": msg.get("content") or "", "tool_calls": calls}
        if msg.get("reasoning_content"):  # the call turn's thoughts (the merged answer's are dropped, as llama.cpp)
            turn["reasoning_content"] = msg["reasoning_content"]
        if responses:
            turn["tool_responses"] = responses
        if (i < len(messages) and messages[i]["role"] == "assistant" and not messages[i].get("tool_calls")
                and messages[i].get("content")):
            turn["content"] = (turn["content"] + messages[i]["content"]) if turn["content"] else messages[i]["content"]
            i += 1
        out.append(turn)
    return out


def _result(content: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content
