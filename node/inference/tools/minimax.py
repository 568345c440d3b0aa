"""MiniMax M2's tool-call format: its region reader and grammar.

  <minimax:tool_call>
  <invoke name="NAME">
  <parameter name="K">raw text</parameter>
  <parameter name="N">2</parameter>
  </invoke>
  ...
  </minimax:tool_call>

One block holds all the turn's calls (one `<invoke>` each). A value is written raw when it is a
string and as JSON otherwise (the template's `tojson`), so it is read back by its parameter's schema
(tagged.read_value), as Qwen3-Coder's. The thoughts are `<think>...</think>` (the generation prompt
opens them); the turn ends with `[e~[`, which llama.cpp's vocabulary loader makes an end-of-generation
token (src/llama-vocab.cpp), so the node stops there as at any EOG token. MiniMax M3 writes its calls
otherwise (`]<]minimax[>[<invoke name=...>` with each parameter its own tag, nested values as XML)
and M1 as JSON lines in `<tool_calls>`: both are not this format.
"""

from __future__ import annotations

import re
from typing import Any

from node.inference import grammar
from node.inference.tools.jsonscan import JsonError, PartialCall, skip_ws
from node.inference.tools.parser import Region, Syntax
from node.inference.tools.tagged import (
    ParamTypes,
    _args_text,
    _is_string,
    _tag,
    _value_schema,
    read_value,
    string_value,
)

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE_OPEN, INVOKE_CLOSE = '<invoke name="', "</invoke>"
PARAM_OPEN, PARAM_CLOSE = '<parameter name="', "</parameter>"
END = "[e~["  # the end of a turn (an end-of-generation token to llama.cpp)
MARKERS = (OPEN, CLOSE, END, "]~b]", "]~!b[")  # may be control tokens in a MiniMax vocabulary
_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_KEY = re.compile(r"[^\"<>\n]{1,256}")


def is_minimax_m2(template: str) -> bool:
    """MiniMax M2's template: its call block and `<invoke name=`."""
    return OPEN in template and INVOKE_OPEN in template


def _waits(rest: str, *tags: str) -> bool:
    return any(len(rest) < len(t) and t.startswith(rest) for t in tags)


def minimax(text: str, final: bool, params: ParamTypes | None = None) -> Region:
    """The invokes of one `<minimax:tool_call>` block (the text after its opening tag)."""
    region = Region()
    i = 0
    while True:
        i = skip_ws(text, i)
        rest = text[i:]
        if rest.startswith(CLOSE):
            if not region.calls:
                raise JsonError("a call block without calls")
            region.end = i + len(CLOSE)
            return region
        if not rest or _waits(rest, CLOSE, INVOKE_OPEN):
            if final and region.calls:  # the block's end was left out: the calls stand
                region.end = len(text)
            return region
        j = _tag(text, i, INVOKE_OPEN)
        k = text.find('">', j)
        name = text[j:].removesuffix('"') if k < 0 else text[j:k]  # (the `">` may be half written)
        if (name or k >= 0) and not _NAME.fullmatch(name):
            raise JsonError(f"not a function name: {name[:80]!r}")
        if k < 0:
            return region
        call = PartialCall(name=name, args="{")
        region.calls.append(call)
        i = _invoke(text, k + 2, call, (params or {}).get(name))
        if not call.done:
            return region


def _invoke(text: str, i: int, call: PartialCall, schemas: dict[str, Any] | None) -> int:
    """Reads the parameters of `call` from `i`; returns the index after its closing tag (the call done)."""
    members: list[tuple[str, Any]] = []
    while True:
        i = skip_ws(text, i)
        rest = text[i:]
        if rest.startswith(INVOKE_CLOSE):
            call.done = call.args_done = True
            i = call.end = i + len(INVOKE_CLOSE)
            break
        if not rest or _waits(rest, INVOKE_CLOSE, PARAM_OPEN):
            break
        j = _tag(text, i, PARAM_OPEN)
        k = text.find('">', j)
        key = text[j:] if k < 0 else text[j:k]
        if (key or k >= 0) and not _KEY.fullmatch(key.removesuffix('"') if k < 0 else key):
            raise JsonError(f"not a parameter name: {key[:80]!r}")
        if k < 0:
            break
        end = text.find(PARAM_CLOSE, k + 2)
        if end < 0:
            break
        members.append((key, read_value(text[k + 2:end], (schemas or {}).get(key))))
        i = end + len(PARAM_CLOSE)
    call.args = _args_text(members, call.done)
    return i


# --- the grammar (a tool_choice that forces calls) ---

def _parameter(key: str, prop: Any, root: dict[str, Any]) -> grammar.Spec:
    head = grammar.literal(f'{PARAM_OPEN}{key}">')
    if _is_string(prop):
        return grammar.seq(head, string_value(prop, PARAM_CLOSE), grammar.literal("\n"))
    return grammar.seq(head, grammar.json_value(_value_schema(prop, root)), grammar.literal(PARAM_CLOSE + "\n"))


def minimax_invoke(tool: Any) -> grammar.Spec:
    """One invoke of `tool` as the template writes it: its required parameters in the schema's
    order, then any of the others (each at most as often as there are of them)."""
    root = tool.parameters if isinstance(tool.parameters, dict) else {}
    props = root.get("properties") if isinstance(root.get("properties"), dict) else {}
    required = [k for k in root.get("required", []) if k in props]
    optional = [k for k in props if k not in required]
    items = [grammar.literal(f'{INVOKE_OPEN}{tool.name}">\n')]
    items += [_parameter(k, props[k], root) for k in required]
    if optional:
        options = [_parameter(k, props[k], root) for k in optional]
        items.append(grammar.repeat(options[0] if len(options) == 1 else grammar.alt(*options), 0, len(optional)))
    items.append(grammar.literal(INVOKE_CLOSE + "\n"))
    return grammar.seq(*items)


def minimax_calls(tools: Any, max_calls: int | None) -> grammar.Spec:
    """One block of one or more invokes (at most `max_calls`) of `tools`; the block's markers alone
    in their literals (a vocabulary may hold them as single tokens)."""
    each = [minimax_invoke(t) for t in tools]
    one = each[0] if len(each) == 1 else grammar.alt(*each)
    return grammar.seq(grammar.literal(OPEN), grammar.literal("\n"), grammar.repeat(one, 1, max_calls),
                       grammar.literal(CLOSE))


MINIMAX_M2 = Syntax("minimax_m2", (OPEN,), False, minimax)
