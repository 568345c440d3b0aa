"""The grammar of a forced tool call (tool_choice "required" or a named function, or "auto" beside
a response_format): each format's calls in its own syntax, every call's arguments held to its
function's parameters schema. formats.py says which format a template speaks; this module only
writes its calls' grammar."""

from __future__ import annotations

from typing import Any

from node.inference import grammar
from node.inference.request import CompletionRequest, ToolSpec
from node.inference.tools.cohere import cohere_answer, cohere_calls
from node.inference.tools.deepseek_r1 import r1_calls
from node.inference.tools.dsml import block_of, dsml_calls
from node.inference.tools.formats import ToolFormat, answer_schema, has_ref, tools_active
from node.inference.tools.gemma4 import gemma4_call
from node.inference.tools.harmony import call_grammar
from node.inference.tools.minimax import minimax_calls
from node.inference.tools.regions import HERMES_CLOSE, HERMES_OPEN, MISTRAL_OPEN
from node.inference.tools.special import DEEPSEEK_V31, KIMI_K2, glm_call, glm_layout, sectioned_calls
from node.inference.tools.tagged import mistral_args_call, qwen_xml_call

_SECTIONS = {"deepseek_v31": DEEPSEEK_V31, "kimi_k2": KIMI_K2}

_ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "examples", "default"}


def _call_schema(tool: ToolSpec, args_key: str, args: dict[str, Any]) -> dict[str, Any]:
    # arguments are an object whatever the schema leaves out (the API refuses any other type): without
    # it the model may write "s", and the call was lost as text in `content`; `{}` (annotations alone)
    # means no parameters, as an omitted `parameters` does
    if not set(args) - _ANNOTATIONS:
        args = {**args, "type": "object", "properties": {}}
    elif "type" not in args:
        args = {"type": "object", **args}
    return {"type": "object", "properties": {"name": {"const": tool.name}, args_key: args},
            "required": ["name", args_key], "additionalProperties": False}


def _any_call(tools: tuple[ToolSpec, ...] | list[ToolSpec], args_key: str) -> dict[str, Any]:
    """The schema of one call of any of `tools`. Parameters that refer into themselves (`#/$defs/…`
    as pydantic writes nested models, `#/definitions/…`, `#`) get an `$id` of their own when they
    have none: references resolve against the nearest `$id`, so "#" stays their root although they
    sit inside the call's schema (without it, every such tool was a 400)."""
    schemas = [_call_schema(t, args_key, _own_id(i, t)) for i, t in enumerate(tools)]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _own_id(i: int, tool: ToolSpec) -> dict[str, Any]:
    args = tool.parameters
    if "$id" not in args and has_ref(args):
        args = {**args, "$id": f"urn:swarmllm:tool:{i}"}
    return args


def _lenient(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool call's schema with the keywords and formats the grammar cannot hold ignored (llguidance's
    `lenient`; `uniqueItems`, `propertyNames`, `not`, `if`, `format: "path"`, ...), as llama-server's
    grammar ignores them: tools come from apps and MCP servers as they are written, and one such tool
    in a list made every request a 400 although the rest of its schema still holds the call."""
    return {**schema, "x-guidance": {**(schema.get("x-guidance") or {}), "lenient": True}}


def _one_key(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {key: value}, "required": [key], "additionalProperties": False}


def tool_grammar(fmt: ToolFormat, request: CompletionRequest) -> grammar.Spec | None:
    """The grammar the reply must follow, or None (no tools, tool_choice "none", or "auto" with a
    native format and no response_format: the model's own format is parsed without forcing).

    "required": at least one call of any tool (several when parallel_tool_calls); a named function:
    exactly one call of it; the generic format always (with "auto", a `response` is allowed too).
    "auto" with a response_format (the OpenAI Agents SDK's output type beside its tools): calls, or
    an answer that is the response_format's JSON (the generic format's `response` holds it).
    Every call's arguments validate against its function's parameters schema."""
    if not tools_active(request):
        return None
    choice = request.tool_choice
    tools = request.tools
    if choice == "function":
        tools = tuple(t for t in tools if t.name == request.tool_choice_name)
    many = request.parallel_tool_calls and choice != "function"
    call = _any_call(tools, fmt.args_key)
    answer = answer_schema(request)
    if fmt.name == "generic":
        options = [_one_key("tool_call", call)]
        if many:
            options.append(_one_key("tool_calls", {"type": "array", "items": call, "minItems": 1}))
        if choice == "auto":
            options.append(_one_key("response", {"type": "string"} if answer is None else answer))
        return grammar.json_value(_lenient(options[0] if len(options) == 1 else {"anyOf": options}))
    if choice == "auto" and answer is None:
        return None
    if fmt.name == "harmony":
        return call_grammar([(t.name, _lenient(_call_schema(t, "arguments", _own_id(i, t))["properties"]["arguments"]))
                             for i, t in enumerate(tools)], answer)
    calls = _native_calls(fmt, call, None if many else 1, tools)
    if answer is None:
        return calls
    json_answer = grammar.json_value(answer)
    return grammar.alt(cohere_answer(fmt.template, json_answer) if fmt.name == "cohere" else json_answer, calls)


def _native_calls(fmt: ToolFormat, call: dict[str, Any], max_calls: int | None,
                  tools: tuple[ToolSpec, ...]) -> grammar.Spec:
    if fmt.name == "cohere":  # (the coerced object schema: the raw one let `"parameters":"s"` through)
        return cohere_calls(tools, [_call_schema(t, "parameters", _own_id(i, t))["properties"]["parameters"]
                                    for i, t in enumerate(tools)], max_calls)
    if fmt.name in _SECTIONS or fmt.name == "deepseek_r1":
        args = [_lenient(_call_schema(t, "arguments", _own_id(i, t))["properties"]["arguments"])
                for i, t in enumerate(tools)]
        if fmt.name == "deepseek_r1":
            return r1_calls(tools, args, max_calls)
        return sectioned_calls(_SECTIONS[fmt.name], tools, args, max_calls)
    if fmt.name == "dsml":
        return dsml_calls(block_of(fmt.template), tools, max_calls)
    if fmt.name == "minimax_m2":
        return minimax_calls(tools, max_calls)
    if fmt.name in ("qwen_xml", "mistral_args", "glm", "gemma4"):  # the name outside the JSON: one branch a tool
        if fmt.name == "gemma4":
            each = [gemma4_call(t) for t in tools]
        elif fmt.name in ("qwen_xml", "glm"):
            each = [qwen_xml_call(t) if fmt.name == "qwen_xml" else glm_call(t, glm_layout(fmt.template)) for t in tools]
        else:
            each = [mistral_args_call(t, _lenient(_call_schema(t, "arguments", _own_id(i, t))["properties"]["arguments"]))
                    for i, t in enumerate(tools)]
        one = each[0] if len(each) == 1 else grammar.alt(*each)
        return grammar.repeat(one, 1, max_calls, sep=_call_sep(fmt))
    if fmt.name == "hermes":
        # the markers alone in their literals: a vocabulary may hold them as single special tokens
        block = grammar.seq(grammar.literal(HERMES_OPEN), grammar.literal("\n"), grammar.json_value(_lenient(call)),
                            grammar.literal("\n"), grammar.literal(HERMES_CLOSE))
        return grammar.repeat(block, 1, max_calls, sep="\n")
    if fmt.name == "mistral":
        items: dict[str, Any] = {"type": "array", "items": call, "minItems": 1}
        if max_calls is not None:
            items["maxItems"] = max_calls
        return grammar.seq(grammar.literal(MISTRAL_OPEN), grammar.json_value(_lenient(items)))
    return grammar.repeat(grammar.json_value(_lenient(call)), 1, max_calls, sep="; ")  # llama3


def _call_sep(fmt: ToolFormat) -> str:
    """Between two calls: none for Mistral's markers, and none where a GLM template writes no newlines."""
    if fmt.name in ("mistral_args", "gemma4") or (fmt.name == "glm" and glm_layout(fmt.template).name == ""):
        return ""
    return "\n"
