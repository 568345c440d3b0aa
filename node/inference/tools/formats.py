"""Tool-call formats: which one a chat template speaks, how the prompt is given to it, and the
grammar that makes a reply a valid call.

Native formats (the template renders `tools` itself and the model was trained to answer so):
Hermes 2 Pro / Hermes 3 / Qwen 2.5 / Qwen 3 / Granite 4 (`<tool_call>` JSON), Llama 3.1-3.3 (JSON with
"parameters"), Mistral Nemo (`[TOOL_CALLS][...]`), Mistral Small 3.2 / Ministral 3 / Devstral
(`[TOOL_CALLS]name[ARGS]{...}`), Qwen3-Coder / Qwen3.5 / Nemotron 3 Nano (`<function=name>` XML with
`<parameter=p>` values; tagged.py), GLM 4.5-4.7 / Ling 3 / Spark 2.5 / Laguna (`<tool_call>name<arg_key>`),
DeepSeek V3.1 (`<｜tool▁calls▁begin｜>`), Kimi K2 (`<|tool_calls_section_begin|>`; special.py), DeepSeek
V3.2 / V4 (`<｜DSML｜function_calls>`; dsml.py), DeepSeek R1 and its distills (`function<｜tool▁sep｜>name`
and a fenced JSON block; deepseek_r1.py), gpt-oss (harmony channels; harmony.py), Gemma 4
(`<|tool_call>call:name{k:<|"|>v<|"|>}<tool_call|>`; gemma4.py), MiniMax M2 (`<minimax:tool_call>`
`<invoke name="name">` `<parameter name="k">v</parameter>`; minimax.py), Command R7B / Cohere2 MoE
(`<|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]<|END_ACTION|>`; cohere.py). Any other template —
the embedded default model's plain ChatML
among them — gets the generic format, as llama.cpp's generic handler does: the tools are described
in a compact system message, and the reply is one JSON object, `{"tool_call": {...}}` (or
`{"tool_calls": [...]}` when parallel calls are allowed) or `{"response": "..."}`, enforced by the
grammar whenever tools are offered (a model that was never taught the format still answers in it).

Messages handed to a native template follow the shape Hugging Face templates expect: assistant
`tool_calls` as `{"id", "type": "function", "function": {"name", "arguments": <object>}}` (the
arguments as an object: the templates write them with `tojson`), tool results as `{"role":
"tool", "tool_call_id", "name", "content"}`, and the `tool_calls` key only on messages that have
calls (Llama's templates test `'tool_calls' in message`). Mistral's template wants 9-character
alphanumeric ids: each id is mapped to one, the same for a call and its result.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from node.inference.chat import is_gemma4, render_chat
from node.inference.request import CompletionRequest, ToolCall, ToolSpec
from node.inference.sampling import SamplingParams
from node.inference.tools.cohere import COHERE, cohere_history, is_cohere
from node.inference.tools.cohere import MARKERS as COHERE_MARKERS
from node.inference.tools.deepseek_r1 import (
    DEEPSEEK_R1,
    is_r1,
    r1_history,
    r1_tools_prompt,
    renders_tools,
)
from node.inference.tools.deepseek_r1 import MARKERS as R1_MARKERS
from node.inference.tools.dsml import DSML, DSML_SYNTAX, dsml
from node.inference.tools.gemma4 import GEMMA4, gemma4_history
from node.inference.tools.gemma4 import MARKERS as GEMMA4_MARKERS
from node.inference.tools.harmony import (
    HARMONY,
    TOKENS,
    harmony_history,
    harmony_tools,
    is_harmony,
)
from node.inference.tools.minimax import MARKERS as MINIMAX_MARKERS
from node.inference.tools.minimax import MINIMAX_M2, is_minimax_m2, minimax
from node.inference.tools.parser import Syntax, ToolCallParser
from node.inference.tools.regions import (
    GENERIC,
    HERMES,
    HERMES_CLOSE,
    HERMES_OPEN,
    LLAMA3,
    MISTRAL,
    MISTRAL_OPEN,
    PYTHON_TAG,
)
from node.inference.tools.special import (
    ARG_KEY,
    DEEPSEEK,
    DEEPSEEK_V31,
    GLM,
    GLM_MARKERS,
    KIMI,
    KIMI_K2,
    deepseek_tools_prompt,
    glm,
    kimi_history,
)
from node.inference.tools.tagged import (
    ARGS,
    CALL_ID,
    FUNCTION_OPEN,
    MISTRAL_ARGS,
    QWEN_XML,
    TOOL_CALL_OPEN,
    param_schemas,
    qwen_xml,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolFormat:
    name: str  # hermes | llama3 | mistral | mistral_args | qwen_xml | glm | deepseek_v31 | deepseek_r1 | kimi_k2 | dsml
    # | harmony | gemma4 | minimax_m2 | cohere | generic
    syntax: Syntax
    native: bool  # the template renders the tools and the calls itself
    args_key: str = "arguments"
    special_markers: tuple[str, ...] = ()  # markers that may be control tokens (rendered empty)
    # call openers that also end a reasoning model's thoughts when tools are offered: these models may
    # call at the end of their thoughts without closing them (llama.cpp's kimi-k2, deepseek (DSML),
    # qwen3-coder (Qwen3.5) and ling3 parsers end the reasoning there; node.inference.reasoning)
    thought_ends: tuple[str, ...] = ()
    template: str = field(default="", compare=False, repr=False)  # (glm, dsml, cohere: the grammar writes its layout)


FORMATS = {
    "hermes": ToolFormat("hermes", HERMES, True, special_markers=(HERMES_OPEN, HERMES_CLOSE)),
    "llama3": ToolFormat("llama3", LLAMA3, True, args_key="parameters", special_markers=(PYTHON_TAG,)),
    "mistral": ToolFormat("mistral", MISTRAL, True, special_markers=(MISTRAL_OPEN,)),
    "mistral_args": ToolFormat("mistral_args", MISTRAL_ARGS, True, special_markers=(MISTRAL_OPEN, ARGS, CALL_ID)),
    "qwen_xml": ToolFormat("qwen_xml", QWEN_XML, True, special_markers=(TOOL_CALL_OPEN, HERMES_CLOSE),
                           thought_ends=QWEN_XML.markers),
    "glm": ToolFormat("glm", GLM, True, special_markers=GLM_MARKERS, thought_ends=GLM.markers),
    "deepseek_v31": ToolFormat("deepseek_v31", DEEPSEEK, True, special_markers=DEEPSEEK_V31.markers,
                               thought_ends=DEEPSEEK.markers),
    "deepseek_r1": ToolFormat("deepseek_r1", DEEPSEEK_R1, True, special_markers=R1_MARKERS,
                              thought_ends=DEEPSEEK_R1.markers),
    "kimi_k2": ToolFormat("kimi_k2", KIMI, True, special_markers=KIMI_K2.markers, thought_ends=KIMI.markers),
    "harmony": ToolFormat("harmony", HARMONY, True, special_markers=TOKENS),
    "dsml": ToolFormat("dsml", DSML_SYNTAX, True, special_markers=(DSML,), thought_ends=DSML_SYNTAX.markers),
    "gemma4": ToolFormat("gemma4", GEMMA4, True, special_markers=GEMMA4_MARKERS),
    "minimax_m2": ToolFormat("minimax_m2", MINIMAX_M2, True, special_markers=MINIMAX_MARKERS,
                             thought_ends=MINIMAX_M2.markers),
    "cohere": ToolFormat("cohere", COHERE, True, special_markers=COHERE_MARKERS, thought_ends=(COHERE.markers[0],)),
    "generic": ToolFormat("generic", GENERIC, False),
}


# `<tool_call>` followed by something other than a JSON object: GLM 4.5-4.7, Ling 3 and Spark
# (`name<arg_key>`: their own format), MiniMax M3 (`<invoke name=`), Apriel (`<tool_calls>[`): not Hermes
# (its parser read none of their calls); the last two get the generic format until they have their own
_NOT_HERMES = ("<arg_key>", "<invoke", "<tool_calls>", FUNCTION_OPEN)


def detect_format(template: str | None) -> ToolFormat:
    """The format a chat template speaks, from its source (generic when none is recognised)."""
    t = template or ""
    # (DeepSeek V3.1's template renders no tools: prompt_inputs adds them; DeepSeek V3 and the R1
    # distills write `function<｜tool▁sep｜>name` and a ```json block: not this format)
    if DEEPSEEK_V31.begin in t and DEEPSEEK_V31.sep in t and "```json" not in t:
        return FORMATS["deepseek_v31"]
    if is_r1(t):  # DeepSeek R1 and its distills (deepseek_r1.py)
        return dataclasses.replace(FORMATS["deepseek_r1"], template=t)
    if "dsml_token" in t and DSML in t:  # DeepSeek V3.2 / V4 (llama.cpp's test)
        return dataclasses.replace(FORMATS["dsml"], template=t)
    if "tools" not in t:
        return FORMATS["generic"]
    if is_harmony(t):  # gpt-oss (harmony.py)
        return FORMATS["harmony"]
    if is_gemma4(t):  # Gemma 4 (gemma4.py)
        return dataclasses.replace(FORMATS["gemma4"], template=t)
    if is_minimax_m2(t):  # MiniMax M2 (minimax.py)
        return FORMATS["minimax_m2"]
    if is_cohere(t):  # Command R7B, Cohere2 MoE (cohere.py; the grammar writes the answer's wrapper)
        return dataclasses.replace(FORMATS["cohere"], template=t)
    if TOOL_CALL_OPEN in t and FUNCTION_OPEN in t and "<parameter=" in t:
        return FORMATS["qwen_xml"]
    if TOOL_CALL_OPEN in t and ARG_KEY in t:
        return dataclasses.replace(FORMATS["glm"], template=t)
    if KIMI_K2.begin in t and KIMI_K2.call in t:
        return FORMATS["kimi_k2"]
    if "<tool_call>" in t and not any(m in t for m in _NOT_HERMES):
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in t and ARGS in t:
        return FORMATS["mistral_args"]
    if "[TOOL_CALLS]" in t:
        return FORMATS["mistral"]
    # (Functionary 3.1 has Llama's header and ipython but writes `<function=name>{...}</function>`)
    if "<|start_header_id|>" in t and FUNCTION_OPEN not in t and ("ipython" in t or '"parameters"' in t):
        return FORMATS["llama3"]
    return FORMATS["generic"]


def chat_format(template: str | None) -> ToolFormat:
    """detect_format, where a native format's template shows a tool it is given (the generic format,
    which lists them in the system message, where it shows none): Command R7B's default template
    renders the tools only beside `documents` (its tool_use template, chat_template's pick, renders
    them), and with it every tool offered was hidden from the model until 2026-12-06. Tried once a
    template, off the loop (a render)."""
    fmt = detect_format(template)
    if not fmt.native or not template or _shows_tools(template):
        return fmt
    return FORMATS["generic"]


def chat_template(request: CompletionRequest, default: str | None, tool_use: str | None) -> tuple[str | None, ToolFormat]:
    """The template a chat renders with, and its format (blocking: a probe render, once a template): the
    model's `tool_use` template (a GGUF's `tokenizer.chat_template.tool_use`) when the reply may call
    tools and that template shows them itself, as llama.cpp picks it; else the default. (Found in review,
    2026-12-06: taken for any request with tools, it gave a `tool_choice: "none"` request Hermes 2 Pro's
    call instructions with an empty tool list, and Command R/R+, whose tool_use format is generic here,
    an empty "Available Tools" and an `Action:` syntax beside the generic one the grammar forces.)"""
    if tool_use and tools_active(request):
        fmt = chat_format(tool_use)
        if fmt.native:
            return tool_use, fmt
    return default, chat_format(default)


@functools.lru_cache(maxsize=32)
def _shows_tools(template: str) -> bool:
    fmt = detect_format(template)
    probe = CompletionRequest("chat", "", False, False, SamplingParams(),
                              messages=({"role": "user", "content": "hi"},), tools=(ToolSpec(_PROBE),))
    try:
        messages, tools = prompt_inputs(fmt, probe, template)
        shown = _PROBE in render_chat(template, messages, tools=tools)
    except Exception:  # noqa: BLE001 - a template that fails here fails the real render too, which reports it
        return True
    if not shown:  # (once a template: every plain chat logged it, found in review)
        log.info("DIAG: template shows no tools format=%s using=generic", fmt.name)
    return shown


def tools_active(request: CompletionRequest) -> bool:
    """Whether the reply may call tools (tools offered and tool_choice is not "none")."""
    return bool(request.tools) and request.tool_choice != "none"


def thought_ends(fmt: ToolFormat, request: CompletionRequest) -> tuple[str, ...]:
    """The call openers that end this request's thoughts: none when it may call no tool."""
    return fmt.thought_ends if tools_active(request) else ()


# --- the prompt ---

def prompt_inputs(fmt: ToolFormat, request: CompletionRequest, template: str | None,
                  history: Callable[[list[dict], list[dict]], list[dict]] | None = None,
                  prefilled: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) to render with the model's template: the template's `tools` variable is
    None when no tool may be called (tool_choice "none": the tools are not shown). `history`
    (node.inference.reasoning.with_history): given the messages and their rendered forms, one for
    each, it gives the rendered ones their earlier thoughts, before a format's history merges or
    splits turns (Gemma 4's older template merges the answer after a call's results into the call's
    turn: applied after, each thought landed one turn off, until 2026-12-06). `prefilled`: the last
    message is the reply's start (node.inference.prefill), left out here, before a history can merge
    it into an earlier turn (Gemma 4's older template did: the caller's `[:-1]` then removed the
    calls, their results and the prefill)."""
    messages = list(request.messages)
    if prefilled:
        messages = messages[:-1]
    active = tools_active(request)
    if fmt.native:
        tools = [_openai_tool(t) for t in request.tools] if active else None
        out = [_native_message(fmt, m) for m in messages]
        if history is not None:
            out = history(messages, out)
        if fmt.name == "kimi_k2":
            out = kimi_history(out)
        if fmt.name == "cohere":
            out = cohere_history(out)
        if fmt.name == "deepseek_r1":
            out = r1_history(out, fmt.template)
            if active and not renders_tools(fmt.template):
                _system_head(out, r1_tools_prompt(request.tools))  # (before the system text, as llama.cpp's)
        if active and fmt.name == "deepseek_v31":
            _system_head(out, deepseek_tools_prompt(request.tools), after=True)
        if fmt.name == "harmony":
            return harmony_history(messages, out), harmony_tools(tools)
        if fmt.name == "gemma4":
            out = gemma4_history(out, fmt.template)
        return out, tools
    system_ok, tool_ok = _template_roles(template) if template else (True, True)
    out = [_generic_message(m, "tool" if tool_ok else "user") for m in messages]
    if history is not None:
        out = history(messages, out)
    if active:
        _system_head(out, generic_system_prompt(request))
    if not system_ok and out and out[0]["role"] == "system":  # (Gemma 2): the system text opens the first user turn
        system = out.pop(0)["content"]
        if out and out[0]["role"] == "user":
            out[0] = {**out[0], "content": system + "\n\n" + out[0]["content"]}
        else:
            out.insert(0, {"role": "user", "content": system})
    return out, None


def _system_head(out: list[dict[str, Any]], text: str, after: bool = False) -> None:
    """`text` joined to the first system message (before its own text, or `after` it), or as one."""
    if out and out[0]["role"] == "system":
        own = out[0]["content"]
        out[0] = {**out[0], "content": (own + "\n\n" + text) if after else (text + "\n\n" + own)}
    else:
        out.insert(0, {"role": "system", "content": text})


_PROBE = "swarmllm-probe-7f3a"


@functools.lru_cache(maxsize=32)
def _template_roles(template: str) -> tuple[bool, bool]:
    """(system messages render, tool results after a plain assistant turn render) under this
    template, tried once on a short chat. The generic format's calls are the assistant's text, so a
    template that wants a `tool` message to answer its own `tool_calls` (MiniMax M2/M3; gpt-oss did until it got its own format)
    raised, and one that knows no `tool` role (Phi 3.5) left the result out; Gemma 2 raises on a
    system message. Until 2026-12-06 every tools request on such a model was a 400 or lost the results."""
    def renders(messages: list[dict[str, Any]]) -> bool:
        try:
            return _PROBE in render_chat(template, messages)
        except Exception:  # noqa: BLE001 - any failure means: not this way (the real render reports its own)
            return False
    user = {"role": "user", "content": "hi"}
    system_ok = renders([{"role": "system", "content": _PROBE}, user])
    tool_ok = renders([user, {"role": "assistant", "content": "x"},
                       {"role": "tool", "content": _PROBE, "tool_call_id": "call_0", "name": "f"}])
    return system_ok or not renders([{"role": "user", "content": _PROBE}]), tool_ok


def _openai_tool(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = tool.parameters
    return {"type": "function", "function": function}


def _native_message(fmt: ToolFormat, msg: dict[str, Any]) -> dict[str, Any]:
    role = msg["role"]
    if role == "assistant" and msg.get("tool_calls"):
        calls = [{"id": _render_id(fmt, c.id), "type": "function",
                  "function": {"name": c.name, "arguments": _arguments_object(c)}} for c in msg["tool_calls"]]
        return {"role": "assistant", "content": msg.get("content") or "", "tool_calls": calls}
    if role == "tool":
        return {"role": "tool", "content": msg.get("content") or "",
                "tool_call_id": _render_id(fmt, msg.get("tool_call_id", "")), "name": msg.get("name", "")}
    return {"role": role, "content": msg.get("content") or ""}


def _generic_message(msg: dict[str, Any], result_role: str) -> dict[str, Any]:
    role = msg["role"]
    if role == "assistant" and msg.get("tool_calls"):
        calls = msg["tool_calls"]
        reply = generic_reply(calls)
        content = msg.get("content") or ""
        return {"role": "assistant", "content": (content + "\n" + reply) if content else reply}
    if role == "tool":
        content = msg.get("content") or ""
        if result_role == "user":
            content = _compact({"tool_response": {"name": msg.get("name", ""), "content": content}})
            return {"role": "user", "content": content}
        # (templates read these: Solar Open's failed without tool_call_id)
        return {"role": "tool", "content": content, "tool_call_id": msg.get("tool_call_id", ""),
                "name": msg.get("name", "")}
    return {"role": role, "content": msg.get("content") or ""}


def generic_reply(calls: list[ToolCall] | tuple[ToolCall, ...]) -> str:
    """How the generic format writes these calls (as the model is asked to)."""
    objs = [{"name": c.name, "arguments": _arguments_object(c)} for c in calls]
    return _compact({"tool_call": objs[0]} if len(objs) == 1 else {"tool_calls": objs})


def generic_system_prompt(request: CompletionRequest) -> str:
    """The compact description of the tools and of the reply's JSON (the default model's context
    is short: every token counts)."""
    tools = [t for t in request.tools if request.tool_choice != "function" or t.name == request.tool_choice_name]
    listed = _compact([{"name": t.name, **({"description": t.description} if t.description else {}),
                        "parameters": t.parameters} for t in tools])
    call = '{"tool_call":{"name":..,"arguments":{..}}}'
    answer = answer_schema(request)
    if answer is not None:
        return (f'Tools: {listed}\nAnswer schema: {_compact(answer)}\nReply in JSON: {{"response":{{..}}}} '
                f"(the answer) or, to call a tool, {call}")
    if request.tool_choice == "auto":
        return f'Tools: {listed}\nReply in JSON: {{"response":".."}} or, to call a tool, {call}'
    return f"Tools: {listed}\nReply in JSON: {call}"


def _arguments_object(call: ToolCall) -> Any:
    try:
        return json.loads(call.arguments)
    except ValueError:  # validated at the API; a peer's history could still hold anything
        return call.arguments


_ALNUM = string.ascii_letters + string.digits


def _render_id(fmt: ToolFormat, call_id: str) -> str:
    if fmt.name not in ("mistral", "mistral_args"):
        return call_id
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    digest = hashlib.sha256(call_id.encode()).digest()
    return "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:9])


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --- the grammar (forced.py writes a forced call's) ---

def has_ref(schema: Any) -> bool:
    """Whether a JSON schema holds a `$ref` anywhere."""
    if isinstance(schema, dict):
        return "$ref" in schema or any(has_ref(v) for v in schema.values())
    return isinstance(schema, list) and any(has_ref(v) for v in schema)


def answer_schema(request: CompletionRequest) -> dict[str, Any] | None:
    """Under tool_choice "auto", the JSON a reply that calls no tool must be (`response_format`:
    json_object any object, json_schema its schema), or None (free text). A schema that refers into
    itself gets an `$id` of its own, as a tool's parameters do (`_any_call`)."""
    fmt = request.response_format
    if request.tool_choice != "auto" or fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object" or fmt.schema is None:
        return {"type": "object"}
    schema = fmt.schema
    if isinstance(schema, dict) and "$id" not in schema and has_ref(schema):
        schema = {**schema, "$id": "urn:swarmllm:answer"}
    return schema


def new_parser(fmt: ToolFormat, request: CompletionRequest, request_id: str = "", opened: str = "") -> ToolCallParser:
    """The reply's parser; `opened`: an opener of the format's own readers that the prompt ends with
    (Cohere's answer wrapper: cohere.opened_answer), the reply starting inside its region."""
    answers = fmt.syntax.at_start and fmt.name != "generic" and answer_schema(request) is not None
    syntax = fmt.syntax
    if fmt.name in ("qwen_xml", "glm", "dsml", "minimax_m2"):  # values are written raw: the parameters' schemas tell a string from a number
        reader = {"qwen_xml": qwen_xml, "glm": glm, "dsml": dsml, "minimax_m2": minimax}[fmt.name]
        syntax = dataclasses.replace(syntax, region=functools.partial(reader, params=param_schemas(request.tools)))
    return ToolCallParser(syntax, request_id=request_id, known=tuple(t.name for t in request.tools),
                          answers=answers, opened=opened if opened in dict(syntax.readers) else "")
