"""Tool-call formats that write the call's name outside JSON: their region readers and grammars.

  qwen_xml      `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`
                (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano, StepFun 3.5 Flash): one block a call; a
                value is written raw when it is a string and as JSON otherwise (the template's
                `tojson` for objects and arrays, Python's `str` for numbers and booleans)
  mistral_args `[TOOL_CALLS]NAME[ARGS]{...}` (Mistral Small 3.2, Ministral 3, Magistral, Devstral:
                one marker a call; Small 3.2's history writes `[CALL_ID]id` before `[ARGS]`, read
                and ignored); Nemo's `[TOOL_CALLS][{...}]` list is read too

A call's arguments are rebuilt as JSON text that only grows (`{"p": v` per parameter closed, then
`}`), so a stream sends each parameter once it is whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from node.inference import grammar
from node.inference.tools.jsonscan import JsonError, PartialCall, call_args, skip_ws
from node.inference.tools.parser import Region, Syntax
from node.inference.tools.regions import call_list

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
MISTRAL_OPEN, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.:\-]+")
_MAX_NAME = 128  # a name longer than any tool's (64) by far: not a call

ParamTypes = dict[str, dict[str, Any]]  # tool name -> parameter name -> its schema


def param_schemas(tools: Any) -> ParamTypes:
    """Each offered tool's parameter schemas (how a raw value is read back)."""
    out: ParamTypes = {}
    for t in tools:
        props = t.parameters.get("properties") if isinstance(t.parameters, dict) else None
        out[t.name] = props if isinstance(props, dict) else {}
    return out


def _tag(text: str, i: int, lit: str) -> int | None:
    """The index after `lit` at text[i], None when the text ends inside it; JsonError otherwise."""
    got = text[i:i + len(lit)]
    if got == lit:
        return i + len(lit)
    if len(got) < len(lit) and lit.startswith(got):
        return None
    raise JsonError(f"expected {lit!r}, got {got!r}")


def _is_string(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and kind and all(k in ("string", "null") for k in kind)):
        return True
    return kind is None and ("enum" in schema and all(isinstance(v, str) for v in schema["enum"]))


def read_value(raw: str, schema: Any) -> Any:
    """A parameter's value as the template wrote it: raw text for a string, JSON otherwise (Python's
    `True`/`False`/`None` too, as Jinja's `string` filter writes them); text that is no JSON stays text."""
    if _is_string(schema):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        pass
    return {"True": True, "False": False, "None": None}.get(raw.strip(), raw)


def _args_text(members: list[tuple[str, Any]], done: bool) -> str:
    body = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}" for k, v in members)
    return "{" + body + ("}" if done else "")


def _strip_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    return value[:-1] if value.endswith("\n") else value


def _name_until(text: str, i: int, end: str) -> tuple[str, int]:
    """The function name from `i` up to `end` (its index, -1 while not written yet); JsonError when
    what is written cannot be a name."""
    k = text.find(end, i)
    name = text[i:] if k < 0 else text[i:k]
    if (name and not _NAME.fullmatch(name)) or len(name) > _MAX_NAME or (k >= 0 and not name):
        raise JsonError(f"not a function name: {name[:80]!r}")
    return name, k


def waits(rest: str, *tags: str) -> bool:
    """`rest` may still become one of `tags` (it is a proper prefix of one)."""
    return any(len(rest) < len(t) and t.startswith(rest) for t in tags)


def marked_value(raw: str, is_string: bool | None, schema: Any) -> Any:
    """A parameter's value: the text itself when it is marked a string (unless the parameter's
    schema says it is not one), JSON when marked not (text that is no JSON stays text), read by the
    schema when unmarked."""
    if is_string is None:
        return read_value(raw, schema)
    if is_string and (schema is None or _is_string(schema)):
        return raw
    return read_value(raw, None)


ParamHead = tuple[str, int, bool | None]  # a parameter's name, where its value starts, its string mark


@dataclass(frozen=True)
class Invokes:
    """The tags of a block of `<invoke name="NAME">` calls, each parameter a tag of its own (MiniMax
    M2, DSML)."""

    closes: tuple[str, ...]  # the block's closing tag(s)
    invoke_open: str  # up to the name; `">` follows it
    invoke_close: str
    param_open: str
    param_close: str
    head: Callable[[str, int], ParamHead | None]  # reads a parameter's head after `param_open` at i; None: unwritten
    needs_calls: bool = False  # a block without calls is malformed


_INVOKE_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


def invokes(m: Invokes, text: str, final: bool, params: ParamTypes | None = None) -> Region:
    """The invokes of one block (the text after its opening tag)."""
    region = Region()
    i = 0
    while True:
        i = skip_ws(text, i)
        rest = text[i:]
        close = next((c for c in m.closes if rest.startswith(c)), None)
        if close is not None:
            if m.needs_calls and not region.calls:
                raise JsonError("a call block without calls")
            region.end = i + len(close)
            return region
        if not rest or waits(rest, *m.closes, m.invoke_open):
            if final and region.calls:  # the block's end was left out: the calls stand
                region.end = len(text)
            return region
        j = _tag(text, i, m.invoke_open)
        k = text.find('">', j)
        name = text[j:].removesuffix('"') if k < 0 else text[j:k]  # (the `">` may be half written)
        if (name or k >= 0) and not _INVOKE_NAME.fullmatch(name):
            raise JsonError(f"not a function name: {name[:80]!r}")
        if k < 0:
            return region
        call = PartialCall(name=name, args="{")
        region.calls.append(call)
        i = _invoke(m, text, k + 2, call, (params or {}).get(name))
        if not call.done:
            return region


def _invoke(m: Invokes, text: str, i: int, call: PartialCall, schemas: dict[str, Any] | None) -> int:
    """Reads the parameters of `call` from `i`; returns the index after its closing tag (the call done)."""
    members: list[tuple[str, Any]] = []
    while True:
        i = skip_ws(text, i)
        rest = text[i:]
        if rest.startswith(m.invoke_close):
            call.done = call.args_done = True
            i = call.end = i + len(m.invoke_close)
            break
        if not rest or waits(rest, m.invoke_close, m.param_open):
            break
        head = m.head(text, _tag(text, i, m.param_open))
        if head is None:
            break
        key, start, is_string = head
        end = text.find(m.param_close, start)
        if end < 0:
            break
        members.append((key, marked_value(text[start:end], is_string, (schemas or {}).get(key))))
        i = end + len(m.param_close)
    call.args = _args_text(members, call.done)
    return i


def qwen_xml(text: str, final: bool, params: ParamTypes | None = None) -> Region:
    """One `<tool_call>` block of the Qwen3-Coder XML format (the text after the marker)."""
    region = Region()
    i = _tag(text, skip_ws(text, 0), FUNCTION_OPEN)
    if i is None:
        return region
    name, k = _name_until(text, i, ">")
    if k < 0:
        return region
    call = PartialCall(name=name, args="{")
    region.calls.append(call)
    schemas = (params or {}).get(name, {})
    members: list[tuple[str, Any]] = []
    i = k + 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            break
        if text.startswith("</", i):
            j = _tag(text, i, FUNCTION_CLOSE)
            if j is None:
                break
            call.done = call.args_done = True
            call.end = i = j
            break
        j = _tag(text, i, PARAMETER_OPEN)
        if j is None:
            break
        k = text.find(">", j)
        if k < 0:
            break
        key = text[j:k]
        end = text.find(PARAMETER_CLOSE, k + 1)
        if end < 0:
            break
        members.append((key, read_value(_strip_newline(text[k + 1:end]), schemas.get(key))))
        i = end + len(PARAMETER_CLOSE)
    call.args = _args_text(members, call.done)
    if not call.done:
        return region
    i = skip_ws(text, i)
    rest = text[i:]
    if rest.startswith(TOOL_CALL_CLOSE):
        region.end = i + len(TOOL_CALL_CLOSE)
    elif TOOL_CALL_CLOSE.startswith(rest):
        if final:
            region.end = len(text)
    else:  # something else follows without the closing tag: the call still stands
        region.end = call.end
    return region


def mistral_args(text: str, final: bool) -> Region:
    """One `NAME[ARGS]{...}` call after `[TOOL_CALLS]` (or Nemo's list of call objects)."""
    i = skip_ws(text, 0)
    if i < len(text) and text[i] == "[":
        return call_list(text, i, final, Region())
    region = Region()
    name, k = _name_until(text, i, "[")
    if k < 0:
        return region
    call = PartialCall(name=name)
    region.calls.append(call)
    if text.startswith("[C", k) or CALL_ID.startswith(text[k:]):
        j = _tag(text, k, CALL_ID)
        if j is None:
            return region
        k = text.find("[", j)
        if k < 0:
            return region
    j = _tag(text, k, ARGS)
    if j is None:
        return region
    end = call_args(text, j, call, final=final)
    if end is not None:
        call.done = True
        call.end = region.end = end
    return region


QWEN_XML = Syntax("qwen_xml", (TOOL_CALL_OPEN,), False, qwen_xml)
MISTRAL_ARGS = Syntax("mistral_args", (MISTRAL_OPEN,), False, mistral_args)


# --- grammars (a tool_choice that forces calls) ---

def _value_schema(prop: Any, root: dict[str, Any]) -> dict[str, Any]:
    """A parameter's own schema, carrying the definitions of its tool's parameters (its `$ref`s point there)."""
    schema = dict(prop) if isinstance(prop, dict) else {}
    for key in ("$defs", "definitions"):
        if key in root and key not in schema:
            schema[key] = root[key]
    return {**schema, "x-guidance": {**(schema.get("x-guidance") or {}), "lenient": True}}


def string_value(prop: Any, stop: str) -> grammar.Spec:
    """A string parameter's raw value up to and with `stop` (the formats that write strings unquoted):
    one of its `enum` / `const` strings where it names them, as written (free text let the model
    write any value, and a tiny or unsure one never end it), else any text."""
    schema = prop if isinstance(prop, dict) else {}
    values = schema.get("enum") if isinstance(schema.get("enum"), list) else \
        [schema["const"]] if "const" in schema else None
    if values and all(isinstance(v, str) and v and stop not in v for v in values):
        choice = grammar.literal(values[0]) if len(values) == 1 else grammar.alt(*map(grammar.literal, values))
        return grammar.seq(choice, grammar.literal(stop))
    return grammar.free_text(stop=stop)


def _xml_parameter(key: str, prop: Any, root: dict[str, Any]) -> grammar.Spec:
    head = grammar.literal(f"{PARAMETER_OPEN}{key}>\n")
    if _is_string(prop):
        value = string_value(prop, f"\n{PARAMETER_CLOSE}")  # the stop is written, then the newline
        return grammar.seq(head, value, grammar.literal("\n"))
    return grammar.seq(head, grammar.json_value(_value_schema(prop, root)), grammar.literal(f"\n{PARAMETER_CLOSE}\n"))


ParamSpec = Callable[[str, Any, dict[str, Any]], grammar.Spec]  # (name, its schema, the tool's parameters) -> its grammar


def parameter_specs(tool: Any, parameter: ParamSpec) -> list[grammar.Spec]:
    """`tool`'s parameters, each as `parameter` writes it: the required ones in the schema's order,
    then any of the others (each at most as often as there are of them)."""
    root = tool.parameters if isinstance(tool.parameters, dict) else {}
    props = root.get("properties") if isinstance(root.get("properties"), dict) else {}
    required = [k for k in root.get("required", []) if k in props]
    optional = [k for k in props if k not in required]
    items = [parameter(k, props[k], root) for k in required]
    if optional:
        options = [parameter(k, props[k], root) for k in optional]
        items.append(grammar.repeat(options[0] if len(options) == 1 else grammar.alt(*options), 0, len(optional)))
    return items


def invoke_call(m: Invokes, tool: Any, parameter: ParamSpec) -> grammar.Spec:
    """One invoke of `tool` as the MiniMax M2 and DSML templates write it."""
    return grammar.seq(grammar.literal(f'{m.invoke_open}{tool.name}">\n'), *parameter_specs(tool, parameter),
                       grammar.literal(m.invoke_close + "\n"))


def qwen_xml_call(tool: Any) -> grammar.Spec:
    """One call of `tool` in the Qwen3-Coder XML format."""
    return grammar.seq(grammar.literal(TOOL_CALL_OPEN), grammar.literal(f"\n{FUNCTION_OPEN}{tool.name}>\n"),
                       *parameter_specs(tool, _xml_parameter),
                       grammar.literal(f"{FUNCTION_CLOSE}\n"), grammar.literal(TOOL_CALL_CLOSE))


def mistral_args_call(tool: Any, arguments: dict[str, Any]) -> grammar.Spec:
    """One call of `tool` as `[TOOL_CALLS]NAME[ARGS]{...}` (`arguments`: its schema, made lenient)."""
    return grammar.seq(grammar.literal(MISTRAL_OPEN), grammar.literal(tool.name), grammar.literal(ARGS),
                       grammar.json_value(arguments))
