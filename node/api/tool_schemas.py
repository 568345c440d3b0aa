"""Tools in a request body (OpenAI's chat shape; the Anthropic and Responses dialects turn theirs
into it through `dialect_tools`): names, parameter schemas checked with jsonschema (remembered, and
new ones checked off the loop first by `async_check_tool_schemas`), and `tool_choice`. Every
problem is a 400 naming the field."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections import OrderedDict
from typing import Any

import jsonschema

from node.errors import InvalidRequest, Unsupported
from node.inference.request import ToolSpec
from node.values import json_nesting_over

MAX_TOOLS = 128  # functions per request, as OpenAI
# jsonschema's check recurses ~8 frames a level (a RecursionError past ~120: review r58) and llguidance
# reads at most 128 levels of the grammar the schema becomes; no tool's parameters come near 64
MAX_SCHEMA_DEPTH = 64
_SCHEMA_CHECKS_KEPT = 4096  # tool parameter schemas whose check is remembered (a chat resends its tools each turn)


_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


_schema_checks: OrderedDict[str, str | None] = OrderedDict()  # canonical JSON -> error message (None: valid)
_schema_checks_lock = threading.Lock()


def _schema_error(schema: dict) -> str | None:
    """Why `schema` is not a valid JSON schema (None: it is). jsonschema takes ~4 ms a schema
    (the 2020-12 metaschema): the answers are remembered, and `async_check_tool_schemas` finds
    new ones off the loop first."""
    key = hashlib.sha256(json.dumps(schema, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    with _schema_checks_lock:
        if key in _schema_checks:
            _schema_checks.move_to_end(key)
            return _schema_checks[key]
    try:
        if json_nesting_over(json.dumps(schema), MAX_SCHEMA_DEPTH):
            raise ValueError(f"it nests more than {MAX_SCHEMA_DEPTH} levels of arrays and objects")
        jsonschema.validators.validator_for(schema).check_schema(schema)
        error = None
    except jsonschema.SchemaError as exc:
        error = exc.message
    except (TypeError, AttributeError, ValueError, RecursionError) as exc:  # e.g. "$schema": [] or 5, nesting
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    with _schema_checks_lock:
        _schema_checks[key] = error
        while len(_schema_checks) > _SCHEMA_CHECKS_KEPT:
            _schema_checks.popitem(last=False)
    return error


async def async_check_tool_schemas(body: Any) -> None:
    """Check the parameter schemas of a body's tools (any dialect: `parameters`, `function.parameters`,
    `input_schema`) in a worker thread, so the parse that follows finds them checked and a long list
    of new tools never stalls the event loop. Problems are left for that parse to report."""
    tools = body.get("tools") if isinstance(body, dict) else None
    if not isinstance(tools, list) or not tools or len(tools) > MAX_TOOLS:
        return
    schemas = []
    for tool in tools:
        if isinstance(tool, dict):
            fn = tool.get("function")
            schema = tool.get("parameters", tool.get("input_schema", fn.get("parameters") if isinstance(fn, dict) else None))
            if isinstance(schema, dict):
                schemas.append(schema)
    if schemas:
        await asyncio.to_thread(lambda: [_schema_error(schema) for schema in schemas])


def _tools(body: dict) -> tuple[ToolSpec, ...]:
    tools = body.get("tools")
    if tools is None or tools == []:
        return ()
    if not isinstance(tools, list):
        raise InvalidRequest("`tools` must be a list", param="tools")
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"`tools` holds {len(tools)} tools; at most {MAX_TOOLS} are allowed", param="tools")
    out: list[ToolSpec] = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"`{at}` must be an object", param=at)
        if tool.get("type") != "function":
            raise Unsupported(f"`{at}.type` must be \"function\" (the only tool type this node runs), got "
                              f"{tool.get('type')!r}", param=f"{at}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise InvalidRequest(f"`{at}.function` must be an object", param=f"{at}.function")
        unknown = set(fn) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise InvalidRequest(f"`{at}.function` has unknown fields: {', '.join(sorted(unknown))}",
                                 param=f"{at}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise InvalidRequest(f"`{at}.function.name` must be 1-64 letters, digits, '_' or '-', got {name!r}",
                                 param=f"{at}.function.name")
        if name in names:
            raise InvalidRequest(f"`{at}.function.name`: two tools are named {name!r}", param=f"{at}.function.name")
        names.add(name)
        description = fn.get("description") or ""
        if not isinstance(description, str):
            raise InvalidRequest(f"`{at}.function.description` must be a string", param=f"{at}.function.description")
        parameters = fn.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise InvalidRequest(f"`{at}.function.parameters` must be a JSON schema object",
                                 param=f"{at}.function.parameters")
        if parameters.get("type", "object") != "object":
            raise InvalidRequest(f"`{at}.function.parameters` must describe an object (\"type\": \"object\")",
                                 param=f"{at}.function.parameters")
        error = _schema_error(parameters)
        if error is not None:
            raise InvalidRequest(f"`{at}.function.parameters` is not a valid JSON schema: {error}",
                                 param=f"{at}.function.parameters")
        strict = fn.get("strict", False)
        if strict is None:
            strict = False
        if not isinstance(strict, bool):
            raise InvalidRequest(f"`{at}.function.strict` must be a boolean", param=f"{at}.function.strict")
        out.append(ToolSpec(name, description, parameters, strict))
    return tuple(out)


def dialect_tools(functions: list[dict], words: dict[str, str]) -> tuple[ToolSpec, ...]:
    """`_tools` (the chat route's checks) for another API's tools turned into chat's shape, with its
    errors naming that API's own fields: `words` maps chat's `function.parameters` / `function.name`
    / `function.description` to them (Anthropic's `input_schema`, Responses' `parameters`)."""
    try:
        return _tools({"tools": functions})
    except InvalidRequest as exc:
        message, param = exc.message, exc.param
        for chat, own in words.items():
            message = message.replace(f".function.{chat}", f".{own}")
            param = param.replace(f".function.{chat}", f".{own}") if param else param
        message = message.replace(".function`", "`")
        raise type(exc)(message, param=param) from exc


def _tool_choice(body: dict, tools: tuple[ToolSpec, ...]) -> tuple[str, str | None]:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise InvalidRequest(f"`tool_choice` must be \"none\", \"auto\", \"required\" or "
                                 f"{{\"type\": \"function\", \"function\": {{\"name\"}}}}, got {choice!r}",
                                 param="tool_choice")
        if choice == "required" and not tools:
            raise InvalidRequest("`tool_choice` \"required\" needs `tools`", param="tool_choice")
        return choice, None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(choice.get("function"), dict):
        raise InvalidRequest("`tool_choice` must be a string or {\"type\": \"function\", \"function\": "
                             "{\"name\": ...}}", param="tool_choice")
    name = choice["function"].get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("`tool_choice.function.name` must be a string", param="tool_choice")
    if not any(t.name == name for t in tools):
        raise InvalidRequest(f"`tool_choice` names the function {name!r}, which is not in `tools`",
                             param="tool_choice")
    return "function", name
