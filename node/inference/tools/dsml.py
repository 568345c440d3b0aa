"""DeepSeek V3.2 / V4's DSML tool-call format: its region reader and grammar.

  <｜DSML｜function_calls>                       (V4: `<｜DSML｜tool_calls>`)
  <｜DSML｜invoke name="NAME">
  <｜DSML｜parameter name="K" string="true">raw text</｜DSML｜parameter>
  <｜DSML｜parameter name="N" string="false">JSON</｜DSML｜parameter>
  </｜DSML｜invoke>
  ...
  </｜DSML｜function_calls>

`｜` is the fullwidth bar (U+FF5C); `｜DSML｜` is one token in the models' vocabulary. A value with
`string="true"` is the text as written, one with `string="false"` JSON (read by the parameter's
schema when it is not). Both block names are read whatever the template says; the grammar writes
the template's.
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

DSML = "｜DSML｜"
BLOCKS = ("function_calls", "tool_calls")  # V3.2, V4
OPENS = tuple(f"<{DSML}{b}>" for b in BLOCKS)
CLOSES = tuple(f"</{DSML}{b}>" for b in BLOCKS)
INVOKE_OPEN, INVOKE_CLOSE = f'<{DSML}invoke name="', f"</{DSML}invoke>"
PARAM_OPEN, PARAM_CLOSE = f'<{DSML}parameter name="', f"</{DSML}parameter>"
MARKERS = (*OPENS, *CLOSES, INVOKE_OPEN, INVOKE_CLOSE, PARAM_OPEN, PARAM_CLOSE)
_ATTRS = re.compile(r'\s*string="(true|false)"\s*')


def block_of(template: str) -> str:
    """The block name a DSML template writes: V3.2's `function_calls`, else V4's `tool_calls`."""
    return BLOCKS[0] if f"{BLOCKS[0]}>" in template else BLOCKS[1]


def _head(text: str, j: int) -> ParamHead | None:
    """A parameter's `NAME" string="true|false">`, the mark optional (tagged.Invokes.head)."""
    q = text.find('"', j)
    gt = text.find(">", j)
    if q < 0 or gt < 0:
        return None
    attrs = _ATTRS.fullmatch(text[q + 1:gt])
    if attrs is None and text[q + 1:gt].strip():
        raise JsonError(f"unexpected parameter attributes: {text[q + 1:gt][:40]!r}")
    return text[j:q], gt + 1, None if attrs is None else attrs.group(1) == "true"


_INVOKES = Invokes(CLOSES, INVOKE_OPEN, INVOKE_CLOSE, PARAM_OPEN, PARAM_CLOSE, _head)


def dsml(text: str, final: bool, params: ParamTypes | None = None) -> Region:
    """The invokes of one DSML block (the text after its opening tag)."""
    return invokes(_INVOKES, text, final, params)


def _parameter(key: str, prop: Any, root: dict[str, Any]) -> grammar.Spec:
    string = _is_string(prop)
    head = grammar.literal(f'{PARAM_OPEN}{key}" string="{"true" if string else "false"}">')
    if string:
        return grammar.seq(head, string_value(prop, PARAM_CLOSE), grammar.literal("\n"))
    return grammar.seq(head, grammar.json_value(_value_schema(prop, root)), grammar.literal(PARAM_CLOSE + "\n"))


def dsml_calls(block: str, tools: Any, max_calls: int | None) -> grammar.Spec:
    """A block of one or more invokes (at most `max_calls`) of `tools`."""
    each = [invoke_call(_INVOKES, t, _parameter) for t in tools]
    one = each[0] if len(each) == 1 else grammar.alt(*each)
    return grammar.seq(grammar.literal(f"<{DSML}{block}>\n"), grammar.repeat(one, 1, max_calls),
                       grammar.literal(f"</{DSML}{block}>"))


DSML_SYNTAX = Syntax("dsml", OPENS, False, dsml)
