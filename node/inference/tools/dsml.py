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

DSML = "｜DSML｜"
BLOCKS = ("function_calls", "tool_calls")  # V3.2, V4
OPENS = tuple(f"<{DSML}{b}>" for b in BLOCKS)
CLOSES = tuple(f"</{DSML}{b}>" for b in BLOCKS)
INVOKE_OPEN, INVOKE_CLOSE = f'<{DSML}invoke name="', f"</{DSML}invoke>"
PARAM_OPEN, PARAM_CLOSE = f'<{DSML}parameter name="', f"</{DSML}parameter>"
MARKERS = (*OPENS, *CLOSES, INVOKE_OPEN, INVOKE_CLOSE, PARAM_OPEN, PARAM_CLOSE)
_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_ATTRS = re.compile(r'\s*string="(true|false)"\s*')


def block_of(template: str) -> str:
    """The block name a DSML template writes: V3.2's `function_calls`, else V4's `tool_calls`."""
    return BLOCKS[0] if f"{BLOCKS[0]}>" in template else BLOCKS[1]


def _waits(rest: str, *tags: str) -> bool:
    return any(len(rest) < len(t) and t.startswith(rest) for t in tags)


def _value(raw: str, is_string: bool | None, schema: Any) -> Any:
    """A parameter's value: the text itself when it is marked a string (unless the parameter's
    schema says it is not one), JSON when marked not (text that is no JSON stays text), read by the
    schema when unmarked."""
    if is_string is None:
        return read_value(raw, schema)
    if is_string and (schema is None or _is_string(schema)):
        return raw
    return read_value(raw, None)


def dsml(text: str, final: bool, params: ParamTypes | None = None) -> Region:
    """The invokes of one DSML block (the text after its opening tag)."""
    region = Region()
    i = 0
    while True:
        i = skip_ws(text, i)
        rest = text[i:]
        close = next((c for c in CLOSES if rest.startswith(c)), None)
        if close is not None:
            region.end = i + len(close)
            return region
        if not rest or _waits(rest, *CLOSES, INVOKE_OPEN):
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
        call.args = call.args or "{"
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
        q = text.find('"', j)
        gt = text.find(">", j)
        if q < 0 or gt < 0:
            break
        key = text[j:q]
        attrs = _ATTRS.fullmatch(text[q + 1:gt])
        if attrs is None and text[q + 1:gt].strip():
            raise JsonError(f"unexpected parameter attributes: {text[q + 1:gt][:40]!r}")
        end = text.find(PARAM_CLOSE, gt + 1)
        if end < 0:
            break
        is_string = None if attrs is None else attrs.group(1) == "true"
        members.append((key, _value(text[gt + 1:end], is_string, (schemas or {}).get(key))))
        i = end + len(PARAM_CLOSE)
    call.args = _args_text(members, call.done)
    return i


def _parameter(key: str, prop: Any, root: dict[str, Any]) -> grammar.Spec:
    string = _is_string(prop)
    head = grammar.literal(f'{PARAM_OPEN}{key}" string="{"true" if string else "false"}">')
    if string:
        return grammar.seq(head, string_value(prop, PARAM_CLOSE), grammar.literal("\n"))
    return grammar.seq(head, grammar.json_value(_value_schema(prop, root)), grammar.literal(PARAM_CLOSE + "\n"))


def dsml_invoke(tool: Any) -> grammar.Spec:
    """One invoke of `tool` as the template writes it: its required parameters in the schema's
    order, then any of the others."""
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


def dsml_calls(block: str, tools: Any, max_calls: int | None) -> grammar.Spec:
    """A block of one or more invokes (at most `max_calls`) of `tools`."""
    each = [dsml_invoke(t) for t in tools]
    one = each[0] if len(each) == 1 else grammar.alt(*each)
    return grammar.seq(grammar.literal(f"<{DSML}{block}>\n"), grammar.repeat(one, 1, max_calls),
                       grammar.literal(f"</{DSML}{block}>"))


DSML_SYNTAX = Syntax("dsml", OPENS, False, dsml)
