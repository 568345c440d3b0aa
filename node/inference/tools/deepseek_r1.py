"""DeepSeek R1 and its distills (R1-Distill-Llama / -Qwen, llama.cpp's fixed R1 template): their
tool-call format, region reader, grammar, prompt and history.

  deepseek_r1  `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{ARGS}\\n```
               <｜tool▁call▁end｜>` (further calls after a `\\n`) `<｜tool▁calls▁end｜>`

The same fullwidth-bar tokens as DeepSeek V3.1 (special.py), but the call writes its type before
the separator and the name and a fenced JSON block after it. A call may open with its own marker
without the section's, the fences and a call's or the section's end may be left out (llama.cpp's
parser allows it); the text that follows tells. The distills' own templates render no tools (the
tool list goes before the system prompt's text, as llama.cpp's fixed template writes it; after it
until 2026-12-06); R1-Distill-Llama's writes a call's arguments as they are (a string) and only for
a turn whose content is none.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from node.inference import grammar
from node.inference.chat import render_chat
from node.inference.tools.jsonscan import PartialCall, call_args, skip_ws
from node.inference.tools.parser import Region, Syntax
from node.inference.tools.special import DEEPSEEK_V31, _check_name, _partial_name, sectioned
from node.inference.tools.tagged import waits

BEGIN, END = DEEPSEEK_V31.begin, DEEPSEEK_V31.end
CALL, SEP, CALL_END = DEEPSEEK_V31.call, DEEPSEEK_V31.sep, DEEPSEEK_V31.call_end
MARKERS = DEEPSEEK_V31.markers
FENCE, FENCE_JSON = "```", "```json"
KIND = "function"  # the call's type, before the separator


def is_r1(template: str) -> bool:
    """An R1-family template: V3.1's markers with a ```json block after the name."""
    return BEGIN in template and SEP in template and FENCE_JSON in template


def _name_end(text: str, i: int) -> int:
    """Where the name that starts at `i` ends (a newline, a fence or the arguments), or -1."""
    ends = [k for k in (text.find(c, i) for c in ("\n", "`", "{")) if k >= 0]
    return min(ends) if ends else -1


def _r1_call(kind: str, text: str, n: int, final: bool, region: Region) -> tuple[int, int] | None:
    """One call after its type and the separator: the name, then the (fenced) arguments (special.sectioned's `read`)."""
    _check_name(kind)  # the type ("function")
    n = skip_ws(text, n)
    m = _name_end(text, n)
    if m < 0:
        _partial_name(text[n:].strip())
        if not final:
            return None
        m = len(text)
    call = PartialCall(name=_check_name(text[n:m].strip()))
    region.calls.append(call)
    j = skip_ws(text, m)
    if waits(text[j:], FENCE_JSON) and not final:
        return None
    for fence in (FENCE_JSON, FENCE):
        if text.startswith(fence, j):
            j = skip_ws(text, j + len(fence))
            break
    end = call_args(text, j, call, final=final)
    if end is None:
        return None
    j = skip_ws(text, end)
    if text.startswith(FENCE, j):
        j = skip_ws(text, j + len(FENCE))
    elif waits(text[j:], FENCE) and j < len(text) and not final:
        return None
    return j, j


def r1(text: str, final: bool) -> Region:
    """The calls after `BEGIN` (a section) or after `CALL` (calls without a section)."""
    return sectioned(DEEPSEEK_V31, text, final, _r1_call, head="the call's type")


def r1_calls(tools: Any, arguments: list[dict[str, Any]], max_calls: int | None) -> grammar.Spec:
    """A section of one or more calls (at most `max_calls`) of `tools`, written as the templates
    write them (`arguments`: each tool's schema, made lenient); the markers alone in their literals."""
    each = [grammar.seq(grammar.literal(CALL), grammar.literal(KIND), grammar.literal(SEP),
                        grammar.literal(f"{tool.name}\n{FENCE_JSON}\n"), grammar.json_value(args),
                        grammar.literal(f"\n{FENCE}"), grammar.literal(CALL_END))
            for tool, args in zip(tools, arguments, strict=True)]
    one = each[0] if len(each) == 1 else grammar.alt(*each)
    return grammar.seq(grammar.literal(BEGIN), grammar.repeat(one, 1, max_calls, sep="\n"), grammar.literal(END))


def renders_tools(template: str) -> bool:
    """Whether the template shows the tools itself (llama.cpp's fixed R1 template; the distills' do not)."""
    return "tools" in template


def r1_tools_prompt(tools: Any) -> str:
    """The tool list and the call syntax, as llama.cpp's fixed R1 template writes them."""
    listed = json.dumps([{"name": t.name, **({"description": t.description} if t.description else {}),
                          "parameters": t.parameters} for t in tools], ensure_ascii=False, indent=2)
    return (f"You can call any of the following function tools to satisfy the user's requests: {listed}\n\n"
            f"Example function tool call syntax:\n\n{BEGIN}{CALL}{KIND}{SEP}example_function_name\n{FENCE_JSON}\n"
            f'{{\n  "arg1": "some_value"\n  ...\n}}\n{FENCE}\n{CALL_END}{END}')


_PROBE_ARGS = {"swarmllm_probe": 1}


@functools.lru_cache(maxsize=32)
def _string_arguments(template: str) -> bool:
    """Whether the template writes a call's arguments as they are (R1-Distill-Llama: `+ arguments +`,
    which fails on an object) rather than with `tojson`: tried once on a short chat."""
    call = {"id": "call_0", "type": KIND, "function": {"name": "f", "arguments": _PROBE_ARGS}}
    try:
        render_chat(template, [{"role": "user", "content": "u"},
                               {"role": "assistant", "content": None, "tool_calls": [call]}],
                    add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - any failure: try the arguments as text
        return True
    return False


def r1_history(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """Assistant turns with calls as the R1 templates read them: content none (R1-Distill-Llama
    renders calls only then, llama.cpp's fixed template only when it is empty, and R1-Distill-Qwen
    writes the text as a turn after them), a turn's text beside its calls a plain turn of its own
    before them (until 2026-12-06 it stayed: those two templates rendered no call, and the model saw
    results for a call it never made); the arguments a JSON string where the template does not write
    them with `tojson`."""
    as_text = _string_arguments(template)
    out = []
    for msg in messages:
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            calls = msg["tool_calls"]
            if as_text:
                calls = [{**c, "function": {**c["function"], "arguments": _text(c["function"]["arguments"])}}
                         for c in calls]
            if msg.get("content"):
                out.append({k: v for k, v in msg.items() if k != "tool_calls"})
            msg = {"role": "assistant", "content": None, "tool_calls": calls}
        out.append(msg)
    return out


def _text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


DEEPSEEK_R1 = Syntax("deepseek_r1", (BEGIN, CALL), False, r1)
