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
from node.inference.tools.jsonscan import JsonError
from node.inference.tools.parser import Region, Syntax
from node.inference.tools.tagged import (
    Invokes,
    ParamHead,
    ParamTypes,
    _is_string,
    _value_schema,
    invoke_call,
    invokes,
    string_value,
)

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE_OPEN, INVOKE_CLOSE = '<invoke name="', "</invoke>"
PARAM_OPEN, PARAM_CLOSE = '<parameter name="', "</parameter>"
END = "[e~["  # the end of a turn (an end-of-generation token to llama.cpp)
MARKERS = (OPEN, CLOSE, END, "]~b]", "]~!b[")  # may be control tokens in a MiniMax vocabulary
_KEY = re.compile(r"[^\"<>\n]{1,256}")


def is_minimax_m2(template: str) -> bool:
    """MiniMax M2's template: its call block and `<invoke name=`."""
    return OPEN in template and INVOKE_OPEN in template


def _head(text: str, j: int) -> ParamHead | None:
    """A parameter's `NAME">` (tagged.Invokes.head)."""
    k = text.find('">', j)
    key = text[j:] if k < 0 else text[j:k]
    if (key or k >= 0) and not _KEY.fullmatch(key.removesuffix('"') if k < 0 else key):
        raise JsonError(f"not a parameter name: {key[:80]!r}")
    return None if k < 0 else (key, k + 2, None)


_INVOKES = Invokes((CLOSE,), INVOKE_OPEN, INVOKE_CLOSE, PARAM_OPEN, PARAM_CLOSE, _head, needs_calls=True)


def minimax(text: str, final: bool, params: ParamTypes | None = None) -> Region:
    """The invokes of one `<minimax:tool_call>` block (the text after its opening tag)."""
    return invokes(_INVOKES, text, final, params)


# --- the grammar (a tool_choice that forces calls) ---

def _parameter(key: str, prop: Any, root: dict[str, Any]) -> grammar.Spec:
    head = grammar.literal(f'{PARAM_OPEN}{key}">')
    if _is_string(prop):
        return grammar.seq(head, string_value(prop, PARAM_CLOSE), grammar.literal("\n"))
    return grammar.seq(head, grammar.json_value(_value_schema(prop, root)), grammar.literal(PARAM_CLOSE + "\n"))


def minimax_calls(tools: Any, max_calls: int | None) -> grammar.Spec:
    """One block of one or more invokes (at most `max_calls`) of `tools`; the block's markers alone
    in their literals (a vocabulary may hold them as single tokens)."""
    each = [invoke_call(_INVOKES, t, _parameter) for t in tools]
    one = each[0] if len(each) == 1 else grammar.alt(*each)
    return grammar.seq(grammar.literal(OPEN), grammar.literal("\n"), grammar.repeat(one, 1, max_calls),
                       grammar.literal(CLOSE))


MINIMAX_M2 = Syntax("minimax_m2", (OPEN,), False, minimax)
