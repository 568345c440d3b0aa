"""Tool-call formats written with the model's own special tokens: their region readers and grammars.

  glm          `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n...</tool_call>`
               (GLM 4.5-4.7; GLM 4.7 writes no newlines; Ling 3, Spark 2.5 and Laguna write the
               same): one block a call; a value is raw text for a string parameter, JSON otherwise
               (read by the tool's schema, as the Qwen3-Coder XML values are)
  deepseek_v31 `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>...`
               `<｜tool▁calls▁end｜>` (DeepSeek V3.1; fullwidth bars and U+2581 in the tokens)
  kimi_k2      `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX`
               `<|tool_call_argument_begin|>{ARGS}<|tool_call_end|>...<|tool_calls_section_end|>`
               (Kimi K2 Instruct / Thinking)

In the two sectioned formats a call may also open with its own marker without the section's (Kimi
K2 does, as llama.cpp's parser allows), and a missing call or section end is forgiven where the
text that follows tells.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from node.inference import grammar
from node.inference.chat import render_chat
from node.inference.tools.jsonscan import JsonError, PartialCall, call_args, skip_ws
from node.inference.tools.parser import Region, Syntax
from node.inference.tools.tagged import (
    _MAX_NAME,
    _NAME,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParamTypes,
    _args_text,
    _is_string,
    _tag,
    _value_schema,
    parameter_specs,
    read_value,
    string_value,
    waits,
)

ARG_KEY, ARG_KEY_END = "<arg_key>", "</arg_key>"
ARG_VALUE, ARG_VALUE_END = "<arg_value>", "</arg_value>"
GLM_MARKERS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, ARG_KEY, ARG_KEY_END, ARG_VALUE, ARG_VALUE_END)
_NAME_END = re.compile(r"[\s<]")
_PARTIAL_NAME = re.compile(r"[A-Za-z0-9_.:\-]*")


def _check_name(name: str) -> str:
    if not name or not _NAME.fullmatch(name) or len(name) > _MAX_NAME:
        raise JsonError(f"not a function name: {name[:80]!r}")
    return name


def _partial_name(raw: str) -> None:
    """Raises JsonError when the name written so far cannot become one."""
    if len(raw) > _MAX_NAME + 16 or not _PARTIAL_NAME.fullmatch(raw):
        raise JsonError(f"not a function name: {raw[:80]!r}")


# --- GLM ---

def glm(text: str, final: bool, params: ParamTypes | None = None) -> Region:
    """One `<tool_call>` block of the GLM format (the text after the marker)."""
    region = Region()
    i = skip_ws(text, 0)
    m = _NAME_END.search(text, i)
    if m is None:
        _partial_name(text[i:])
        if not final or i >= len(text):
            return region
        end = len(text)
    else:
        end = m.start()
    call = PartialCall(name=_check_name(text[i:end]), args="{")
    region.calls.append(call)
    schemas = (params or {}).get(call.name, {})
    members: list[tuple[str, Any]] = []
    i = end
    while True:
        i = skip_ws(text, i)
        rest = text[i:]
        if rest.startswith(TOOL_CALL_CLOSE):
            call.done = call.args_done = True
            call.end = region.end = i + len(TOOL_CALL_CLOSE)
            break
        if not rest or waits(rest, TOOL_CALL_CLOSE, ARG_KEY):
            if final:  # the reply ended where only the closing tag was missing: a call all the same
                call.done = call.args_done = True
                call.end = region.end = len(text)
            break
        j = _tag(text, i, ARG_KEY)
        k = text.find(ARG_KEY_END, j)
        if k < 0:
            break
        key = text[j:k].strip()
        v = _tag(text, skip_ws(text, k + len(ARG_KEY_END)), ARG_VALUE)
        if v is None:
            break
        end = text.find(ARG_VALUE_END, v)
        if end < 0:
            break
        members.append((key, read_value(text[v:end], schemas.get(key))))
        i = end + len(ARG_VALUE_END)
    call.args = _args_text(members, call.done)
    return region


@dataclass(frozen=True)
class GlmLayout:
    """The whitespace a GLM-family template writes in a call: after the name, between a key and
    its value, after each value, and before `</tool_call>` after the last one."""

    name: str = "\n"
    key: str = "\n"
    value: str = "\n"
    close: str = ""


GLM_46 = GlmLayout()  # GLM 4.5/4.6, Laguna XS: one parameter a line
_PROBE_NAME = "swarmllm_probe_fn"
_LAYOUT = re.compile(re.escape(TOOL_CALL_OPEN + _PROBE_NAME) + r"(\s*)" + re.escape(ARG_KEY) + "a" + re.escape(ARG_KEY_END)
                     + r"(\s*)" + re.escape(ARG_VALUE) + "x" + re.escape(ARG_VALUE_END) + r"(\s*)" + re.escape(ARG_KEY)
                     + ".*?" + re.escape(ARG_VALUE_END) + r"(\s*)" + re.escape(TOOL_CALL_CLOSE), re.S)


@functools.lru_cache(maxsize=32)
def glm_layout(template: str) -> GlmLayout:
    """How `template` lays out a call in the history (GLM 4.7, Spark 2.5 and Laguna S write no
    newlines, GLM 4.6 one parameter a line, Ling 3 its own mix), read from a call it renders; GLM
    4.6's when it cannot tell. (Cheap: the template is compiled when the prompt is rendered, first.)"""
    call = {"id": "call_0", "type": "function", "function": {"name": _PROBE_NAME, "arguments": {"a": "x", "b": 1}}}
    try:
        text = render_chat(template, [{"role": "user", "content": "u"},
                                      {"role": "assistant", "content": "", "tool_calls": [call]}],
                           add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - any failure: the usual layout
        return GLM_46
    m = _LAYOUT.search(text)
    if m is None:
        return GLM_46
    name, key, value, last = m.groups()
    return GlmLayout(name, key, value, last.removeprefix(value))


def _glm_parameter(key: str, prop: Any, root: dict[str, Any], layout: GlmLayout) -> grammar.Spec:
    head = _literals(ARG_KEY, key, ARG_KEY_END, layout.key, ARG_VALUE)
    if _is_string(prop):
        value = [string_value(prop, ARG_VALUE_END)]
    else:
        value = [grammar.json_value(_value_schema(prop, root)), grammar.literal(ARG_VALUE_END)]
    return grammar.seq(*head, *value, *_literals(layout.value))


def _literals(*texts: str) -> list[grammar.Spec]:
    """One literal each (the markers alone in theirs: they may be single special tokens), empty ones left out."""
    return [grammar.literal(t) for t in texts if t]


def glm_call(tool: Any, layout: GlmLayout = GLM_46) -> grammar.Spec:
    """One call of `tool` in the GLM format, laid out as the model's template writes calls."""
    params = parameter_specs(tool, functools.partial(_glm_parameter, layout=layout))
    return grammar.seq(*_literals(TOOL_CALL_OPEN, tool.name + layout.name), *params,
                       *_literals(layout.close if params else "", TOOL_CALL_CLOSE))


# --- DeepSeek V3.1 and Kimi K2: a section of calls, each a name and a JSON object ---

@dataclass(frozen=True)
class Sections:
    begin: str  # opens the section of calls
    end: str  # closes it
    call: str  # opens one call
    sep: str  # between the call's name and its arguments
    call_end: str  # closes one call
    name: Callable[[str], str]  # the function name from what the call writes before `sep`
    prefix: str = ""  # what the call writes before the name (grammar)
    indexed: bool = False  # the call writes `:IDX` after the name (grammar)

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.begin, self.end, self.call, self.sep, self.call_end)


def _kimi_name(raw: str) -> str:
    """`functions.NAME:IDX` (the call's id as Kimi writes it) -> NAME."""
    name = raw.removeprefix("functions.")
    head, colon, idx = name.rpartition(":")
    return head if colon and idx.isdigit() else name


DEEPSEEK_V31 = Sections("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                        "<｜tool▁call▁end｜>", str)
KIMI_K2 = Sections("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                   "<|tool_call_argument_begin|>", "<|tool_call_end|>", _kimi_name, prefix="functions.", indexed=True)


CallReader = Callable[[str, str, int, bool, Region], tuple[int, int] | None]


def _json_call(head: str, text: str, i: int, final: bool, region: Region) -> tuple[int, int] | None:
    """A call that writes its name before the separator and a JSON object after it (at `i`)."""
    call = PartialCall(name=_check_name(head))
    region.calls.append(call)
    end = call_args(text, i, call, final=final)
    return None if end is None else (skip_ws(text, end), end)


def sectioned(s: Sections, text: str, final: bool, read: CallReader = _json_call, head: str = "the name") -> Region:
    """The calls after `s.begin` (a section) or after `s.call` (calls without a section). `read` gets
    `s.name` of what a call writes before `s.sep` (`head` names it in errors) and the index after
    `s.sep`, adds the call to the region and returns where its `s.call_end` may start and where to
    go on when that is left out, None while the call runs past the text."""
    region = Region()
    i = skip_ws(text, 0)
    if i >= len(text):
        return region
    bare = text[i] != "<"  # opened by a call's own marker: the name follows at once
    while True:
        if region.calls or not bare:
            i = skip_ws(text, i)
            rest = text[i:]
            if rest.startswith(s.end):
                region.end = i + len(s.end)
                return region
            if rest.startswith(s.call):
                i += len(s.call)
            elif not rest or waits(rest, s.end, s.call):
                if final and region.calls:  # the section's end was left out: the calls stand
                    region.end = len(text)
                return region
            elif bare:  # what follows calls made without a section is content
                region.end = i
                return region
            else:
                raise JsonError(f"expected {s.call!r} or {s.end!r}, got {rest[:20]!r}")
        k = text.find(s.sep, i)
        if k < 0:
            raw = text[i:]
            lt = raw.find("<")  # (the separator may be starting)
            if lt >= 0 and not s.sep.startswith(raw[lt:]):
                raise JsonError(f"expected {s.sep!r} after {head}, got {raw[lt:lt + 20]!r}")
            _partial_name(raw[: len(raw) if lt < 0 else lt].strip())
            return region
        got = read(s.name(text[i:k].strip()), text, k + len(s.sep), final, region)
        if got is None:
            return region
        j, after = got
        rest = text[j:]
        if rest.startswith(s.call_end):
            i = j + len(s.call_end)
        elif waits(rest, s.call_end) or not rest:
            if not final:
                return region
            i = len(text)
        else:  # the call's end was left out (llama.cpp allows it): what follows tells
            i = after
        region.calls[-1].done, region.calls[-1].end = True, i


def sectioned_calls(s: Sections, tools: Any, arguments: list[dict[str, Any]], max_calls: int | None) -> grammar.Spec:
    """A section of one or more calls (at most `max_calls`) of `tools` (`arguments`: each one's
    schema, made lenient)."""
    each = []
    for tool, args in zip(tools, arguments, strict=True):
        head = [grammar.literal(s.call), grammar.literal(s.prefix + tool.name + (":" if s.indexed else ""))]
        if s.indexed:
            digit = grammar.alt(*(grammar.literal(str(d)) for d in range(10)))
            head.append(grammar.repeat(digit, 1, 3))
        each.append(grammar.seq(*head, grammar.literal(s.sep), grammar.json_value(args), grammar.literal(s.call_end)))
    one = each[0] if len(each) == 1 else grammar.alt(*each)
    return grammar.seq(grammar.literal(s.begin), grammar.repeat(one, 1, max_calls), grammar.literal(s.end))


def deepseek_tools_prompt(tools: Any) -> str:
    """The tool list DeepSeek V3.1's model card puts after the system prompt (its chat template
    renders no tools: without this the model never saw them)."""
    lines = ["## Tools", "You have access to the following tools:"]
    for t in tools:
        lines += ["", f"### {t.name}", f"Description: {t.description or ''}", "",
                  f"Parameters: {json.dumps(t.parameters, ensure_ascii=False)}"]
    s = DEEPSEEK_V31
    lines += ["", "IMPORTANT: ALWAYS adhere to this exact format for tool use:",
              f"{s.begin}{s.call}tool_call_name{s.sep}tool_call_arguments{s.call_end}{{{{additional_tool_calls}}}}{s.end}",
              "", "Where:", "",
              "- `tool_call_name` must be an exact match to one of the available tools",
              "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema",
              "- For multiple tool calls, chain them directly without separators or spaces"]
    return "\n".join(lines)


def _deepseek(text: str, final: bool) -> Region:
    return sectioned(DEEPSEEK_V31, text, final)


def _kimi(text: str, final: bool) -> Region:
    return sectioned(KIMI_K2, text, final)


GLM = Syntax("glm", (TOOL_CALL_OPEN,), False, glm)
DEEPSEEK = Syntax("deepseek_v31", (DEEPSEEK_V31.begin, DEEPSEEK_V31.call), False, _deepseek)
KIMI = Syntax("kimi_k2", (KIMI_K2.begin, KIMI_K2.call), False, _kimi)


def kimi_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history's call ids as Kimi K2 writes them, `functions.NAME:IDX` (IDX: the call's place in
    its turn, as the template numbers the calls it renders), the same for a call and its result:
    the template writes the calls with these ids and each result as `## Return of {tool_call_id}`,
    so with the client's own ids (`call_...`) no result named the call it answers."""
    ids: dict[str, str] = {}
    out = []
    for msg in messages:
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            calls = []
            for i, call in enumerate(msg["tool_calls"]):
                ids[call["id"]] = own = f"functions.{call['function']['name']}:{i}"
                calls.append({**call, "id": own})
            msg = {**msg, "tool_calls": calls}
        elif msg["role"] == "tool":
            msg = {**msg, "tool_call_id": ids.get(msg["tool_call_id"], msg["tool_call_id"])}
        out.append(msg)
    return out
