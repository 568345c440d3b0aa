"""The Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens.

The body is translated onto the same `CompletionRequest` the OpenAI routes build (system → a
system message, tool_use blocks → an assistant's tool_calls, tool_result blocks → tool messages,
tool_choice any → required) and served by the shared driver; this module only writes Anthropic's
shapes: the message body, the streamed events (message_start, content_block_*, message_delta,
message_stop, ping) and, through node.api.errors, `{"type": "error", "error": {...}}` errors.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from node.api import anthropic_thinking as thinking
from node.api.anthropic_blocks import document_text, search_result_text, text_blocks, tool_result
from node.api.anthropic_reply import MessagesDialect
from node.api.appkeys import NODE
from node.api.chat_options import effort_kwargs
from node.api.driver import serve
from node.api.errors import read_json
from node.api.history import link_tool_results
from node.api.schemas import _integer, _number
from node.api.tool_schemas import async_check_tool_schemas, dialect_tools
from node.errors import InvalidRequest, Unsupported
from node.inference.request import CompletionRequest, ResponseFormat, ToolCall, ToolSpec
from node.inference.sampling import SamplingParams
from node.trace import RequestTrace

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

MAX_STOP_SEQUENCES = 16

_MESSAGE_KEYS = {"model", "messages", "max_tokens", "system", "stop_sequences", "temperature", "top_p",
                 "top_k", "metadata", "stream", "tools", "tool_choice", "output_config", "output_format"}
_COUNT_KEYS = {"model", "messages", "system", "tools", "tool_choice", "output_config", "output_format"}
# accepted, meaningless for a node: no priority tiers, regions, workspaces or prompt cache to steer
_IGNORED_OK = {"service_tier", "inference_geo", "user_profile_id", "workspace_id", "cache_control"}
_UNSUPPORTED = {
    "diagnostics": "request diagnostics (prompt-cache reports) are not supported by this node",
    "speed": "speed modes are not supported by this node",
    "container": "containers (code execution) are not supported by this node",
    "mcp_servers": "MCP servers are not supported by this node",
}
_BLOCK_EXTRA_OK = {"cache_control", "citations"}  # prompt caching hints: accepted, no effect here
_TOOL_USE_EXTRA_OK = {"caller", "toolset_name"}  # from Anthropic's API; checked in _tool_use
# ToolParam fields of the current SDK that change nothing here: the arguments are held to the schema
# by grammar anyway (`strict`), examples, deferred loading, callers and streaming are client-side hints
_TOOL_EXTRA_OK = {"strict", "input_examples", "defer_loading", "allowed_callers", "eager_input_streaming"}


def _thinking(value: object) -> None:
    """`thinking`'s shape is checked; "disabled" turns a reasoning model's thinking off, "enabled"'s
    budget_tokens caps the thoughts (anthropic_thinking; Claude Code sends `{"type": "enabled",
    "budget_tokens": N}` whenever the user turned thinking on; llama-server enforces it too)."""
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise InvalidRequest("thinking.type: must be one of enabled, disabled, adaptive", param="thinking")
    budget = value.get("budget_tokens")
    if kind == "enabled" and (type(budget) is not int or budget < 1):
        raise InvalidRequest("thinking.budget_tokens: Field required (a positive integer)", param="thinking")
    log.debug("DIAG: anthropic thinking requested type=%s", kind)


def _context_management(value: object) -> None:
    """`context_management` is accepted and applies no edit: Claude Code sends it with every request
    while prompt caching is on (`{"edits": [{"type": "clear_thinking_20251015", ...}]}`, clear_tool_uses,
    compact), and a 400 failed each one. Its edits clear or compact what a context past their trigger
    holds (100k tokens and more by default); earlier turns' thinking is left out here anyway, and a
    conversation past this model's context is still its 400. Its shape is still checked."""
    if value is None:
        return
    edits = value.get("edits", []) if isinstance(value, dict) else None
    if not isinstance(edits, list) or not all(isinstance(e, dict) and isinstance(e.get("type"), str) for e in edits):
        raise InvalidRequest("context_management: expected {\"edits\": [{\"type\": ...}, ...]}",
                             param="context_management")
    log.debug("DIAG: anthropic context_management requested, no edit applied edits=%s",
              ",".join(e["type"] for e in edits))


def _check_keys(body: dict, allowed: set[str]) -> None:
    for key, value in body.items():
        if key == "thinking":
            _thinking(value)
            continue
        if key == "context_management":
            _context_management(value)
            continue
        if key in _UNSUPPORTED:
            if value is None or (key == "speed" and value == "standard"):
                continue
            raise Unsupported(_UNSUPPORTED[key], param=key)
        if key not in allowed and key not in _IGNORED_OK:
            raise InvalidRequest(f"{key}: Extra inputs are not permitted", param=key)


def _tool_use(block: dict, where: str) -> ToolCall:
    tid, name, args = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(tid, str) or not tid:
        raise InvalidRequest(f"{where}.id: Field required", param=where)
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}.name: Field required", param=where)
    if not isinstance(args, dict):
        raise InvalidRequest(f"{where}.input: must be an object", param=where)
    # who made the call (Anthropic's programmatic tool calling) and a toolset member's family: blocks
    # from Anthropic's API carry them, a conversation moved over from it sends them back; no effect here
    caller, toolset = block.get("caller"), block.get("toolset_name")
    if caller is not None and not (isinstance(caller, dict) and isinstance(caller.get("type"), str)):
        raise InvalidRequest(f"{where}.caller: must be an object with a type", param="messages")
    if toolset is not None and not isinstance(toolset, str):
        raise InvalidRequest(f"{where}.toolset_name: must be a string", param="messages")
    return ToolCall(tid, name, json.dumps(args, ensure_ascii=False))


def _turn(msg: Any, index: int) -> list[dict]:
    """One Anthropic message as internal messages (a user turn with tool results becomes tool messages)."""
    where = f"messages.{index}"
    if not isinstance(msg, dict):
        raise InvalidRequest(f"{where}: must be an object", param="messages")
    role = msg.get("role")
    if role not in ("user", "assistant"):
        raise InvalidRequest(f"{where}.role: Input should be 'user' or 'assistant'", param="messages")
    extra = set(msg) - {"role", "content"}
    if extra:
        raise InvalidRequest(f"{where}.{sorted(extra)[0]}: Extra inputs are not permitted", param="messages")
    content = msg.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: must be a string or a list of content blocks", param="messages")
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    results: list[dict] = []
    for i, block in enumerate(content):
        bwhere = f"{where}.content.{i}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, bwhere))
        elif kind == "tool_result" and role == "user":
            results.append(tool_result(block, bwhere))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            thoughts.append(thinking.history_thinking(block, bwhere))  # the template shows or drops it
            continue
        elif kind == "document" and role == "user":
            texts.append(document_text(block, bwhere))  # its own keys checked there
            continue
        elif kind == "search_result" and role == "user":
            texts.append(search_result_text(block, bwhere))
            continue
        elif kind in ("image", "thinking", "redacted_thinking", "server_tool_use",
                      "web_search_tool_result", "container_upload"):
            raise Unsupported(f"{bwhere}: {kind} content blocks are not supported by this node", param="messages")
        elif kind in ("tool_use", "tool_result"):
            raise InvalidRequest(f"{bwhere}: {kind} blocks belong in "
                                 f"{'assistant' if kind == 'tool_use' else 'user'} turns", param="messages")
        else:
            raise InvalidRequest(f"{bwhere}: not a valid content block (type {kind!r})", param="messages")
        if isinstance(block, dict):
            unknown = set(block) - {"type", "text", "id", "name", "input", "tool_use_id", "content", "is_error"} \
                - _BLOCK_EXTRA_OK - (_TOOL_USE_EXTRA_OK if kind == "tool_use" else set())
            if unknown:
                raise InvalidRequest(f"{bwhere}.{sorted(unknown)[0]}: Extra inputs are not permitted",
                                     param="messages")
    if role == "assistant":
        out: dict = {"role": "assistant", "content": "".join(texts)}
        if any(thoughts):
            out["reasoning_content"] = "".join(thoughts)
        if calls:
            out["tool_calls"] = calls
        return [out]
    turns = results[:]
    if texts or not results:
        turns.append({"role": "user", "content": "".join(texts)})
    return turns


def _append_combined(out: list[dict], turn: dict) -> None:
    """Consecutive user (or assistant) turns are one turn, as Anthropic's API combines them: their
    texts a paragraph apart, an assistant's calls in order. Templates that check the roles alternate
    (Mistral's, Gemma's) refused them with a 400, the others rendered two turns."""
    last = out[-1] if out else None
    if last is None or last["role"] != turn["role"] or turn["role"] not in ("user", "assistant"):
        out.append(turn)
        return
    texts = [t for t in (last["content"], turn["content"]) if t]
    merged = {**last, "content": "\n\n".join(texts)}
    if turn.get("reasoning_content"):
        merged["reasoning_content"] = (last.get("reasoning_content") or "") + turn["reasoning_content"]
    calls = [*(last.get("tool_calls") or ()), *(turn.get("tool_calls") or ())]
    if calls:
        merged["tool_calls"] = calls
    out[-1] = merged


def _messages(body: dict) -> tuple[dict, ...]:
    out: list[dict] = []
    if "system" in body and body["system"] is not None:
        system = text_blocks(body["system"], "system")
        if system:
            out.append({"role": "system", "content": system})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: Field required (a non-empty list)", param="messages")
    for i, msg in enumerate(messages):
        for turn in _turn(msg, i):
            _append_combined(out, turn)
    out = link_tool_results(out, "messages")  # a final assistant turn is continued (a prefill)
    return tuple(out)


def _tools(body: dict) -> tuple[tuple[ToolSpec, ...], str, str | None, bool]:
    tools_raw = body.get("tools")
    choice_raw = body.get("tool_choice")
    if tools_raw is not None and not isinstance(tools_raw, list):
        raise InvalidRequest("tools: must be a list", param="tools")
    if not tools_raw:
        if choice_raw not in (None, {"type": "none"}, {"type": "auto"}):
            raise InvalidRequest("tool_choice: requires tools", param="tool_choice")
        return (), "none" if choice_raw == {"type": "none"} else "auto", None, True
    if not isinstance(tools_raw, list):
        raise InvalidRequest("tools: must be a list", param="tools")
    functions = []
    for i, tool in enumerate(tools_raw):
        if not isinstance(tool, dict):
            raise InvalidRequest(f"tools.{i}: must be an object", param="tools")
        if tool.get("type") not in (None, "custom"):
            raise Unsupported(f"tools.{i}: server tools ({tool.get('type')}) are not supported by this node",
                              param="tools")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"tools.{i}.name: Field required", param="tools")
        if not isinstance(schema, dict):
            raise InvalidRequest(f"tools.{i}.input_schema: Field required (a JSON schema object)", param="tools")
        description = tool.get("description") or ""
        if not isinstance(description, str):
            raise InvalidRequest(f"tools.{i}.description: must be a string", param="tools")
        unknown = set(tool) - {"type", "name", "description", "input_schema", "cache_control"} - _TOOL_EXTRA_OK
        if unknown:
            raise InvalidRequest(f"tools.{i}.{sorted(unknown)[0]}: Extra inputs are not permitted", param="tools")
        functions.append({"type": "function", "function": {"name": name, "description": description,
                                                            "parameters": schema}})
    # the chat route's checks (names, the JSON schemas), its errors in this API's words
    tools = list(dialect_tools(functions, {"parameters": "input_schema", "name": "name", "description": "description"}))
    choice = choice_raw if choice_raw is not None else {"type": "auto"}
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise InvalidRequest("tool_choice.type: must be one of auto, any, tool, none", param="tool_choice")
    unknown = set(choice) - {"type", "name", "disable_parallel_tool_use"}
    if unknown:
        raise InvalidRequest(f"tool_choice.{sorted(unknown)[0]}: Extra inputs are not permitted", param="tool_choice")
    disable = choice.get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool):
        raise InvalidRequest("tool_choice.disable_parallel_tool_use: Input should be a valid boolean", param="tool_choice")
    parallel = not disable
    kind = choice["type"]
    if kind == "tool":
        name = choice.get("name")
        if name not in {t.name for t in tools}:
            raise InvalidRequest(f"tool_choice.name: {name!r} is not one of the tools", param="tool_choice")
        return tuple(tools), "function", name, parallel
    return tuple(tools), {"auto": "auto", "any": "required", "none": "none"}[kind], None, parallel


_EFFORTS = ("low", "medium", "high", "max")


def _effort_kwargs(body: dict) -> dict[str, Any]:
    """output_config.effort (checked in _output_format) as the chat route's reasoning_effort: the
    template's `reasoning_effort` (gpt-oss's writes `Reasoning: low|medium|high`; others ignore it).
    "max" is gpt-oss's highest, "high"."""
    config = body.get("output_config")
    effort = config.get("effort") if isinstance(config, dict) else None
    return effort_kwargs("high" if effort == "max" else effort)


def _output_format(body: dict) -> ResponseFormat | None:
    """output_config: `format` (a JSON schema the reply must match) and `effort` (_effort_kwargs;
    opencode sends it with every request). `output_format` is the structured-outputs beta's name for
    `output_config.format` (anthropic SDKs before output_config send it from `beta.messages.parse`:
    a 400 "Extra inputs are not permitted" until 2026-12-07); both at once is a 400, as Anthropic's."""
    config = body.get("output_config")
    legacy = body.get("output_format")
    if config is not None and not isinstance(config, dict):  # beside output_format it was dropped unsaid
        raise InvalidRequest("output_config: must be an object", param="output_config")
    if legacy is not None:
        if isinstance(config, dict) and config.get("format") is not None:
            raise InvalidRequest("output_format and output_config.format: give one of them (output_format is "
                                 "the beta's name for output_config.format)", param="output_format")
        config = {**(config or {}), "format": legacy}
        if not isinstance(legacy, dict) or legacy.get("type") != "json_schema" or not isinstance(legacy.get("schema"), dict):
            raise InvalidRequest("output_format: expected {\"type\": \"json_schema\", \"schema\": {...}}",
                                 param="output_format")
    if config is None:
        return None
    unknown = set(config) - {"format", "effort"}
    if unknown:
        raise InvalidRequest(f"output_config.{sorted(unknown)[0]}: Extra inputs are not permitted",
                             param="output_config")
    effort = config.get("effort")
    if effort is not None:
        if effort not in _EFFORTS:
            raise InvalidRequest(f"output_config.effort: expected one of {', '.join(_EFFORTS)}",
                                 param="output_config.effort")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise InvalidRequest("output_config.format: expected {\"type\": \"json_schema\", \"schema\": {...}}",
                             param="output_config.format")
    # its 400s (a schema the compiler refuses) name the field sent, not OpenAI's response_format
    return ResponseFormat("json_schema", fmt["schema"], "output", True,
                          param="output_format" if legacy is not None else "output_config.format")


def parse_messages(body: Any, *, count_only: bool = False) -> CompletionRequest:
    """Validate a /v1/messages (or count_tokens) body into a CompletionRequest."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    _check_keys(body, _COUNT_KEYS if count_only else _MESSAGE_KEYS)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required (a string)", param="model")
    messages = _messages(body)
    tools, tool_choice, tool_name, parallel = _tools(body)
    response_format = _output_format(body)
    if count_only:
        return CompletionRequest("chat", model, False, False, SamplingParams(), messages=messages, tools=tools,
                                 tool_choice=tool_choice, tool_choice_name=tool_name, response_format=response_format,
                                 operation="messages.count_tokens", template_kwargs={**thinking.template_kwargs(body), **_effort_kwargs(body)})
    if body.get("max_tokens") is None:
        raise InvalidRequest("max_tokens: Field required", param="max_tokens")
    max_tokens = _integer(body, "max_tokens", 1, 1 << 24)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream: must be a boolean", param="stream")
    stops = body.get("stop_sequences")
    stops = [] if stops is None else stops
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidRequest("stop_sequences: must be a list of strings", param="stop_sequences")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(f"stop_sequences: at most {MAX_STOP_SEQUENCES} are allowed", param="stop_sequences")
    if any(not s.strip() for s in stops):
        raise InvalidRequest("stop_sequences: each stop sequence must contain non-whitespace", param="stop_sequences")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidRequest("metadata: must be an object", param="metadata")
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 1.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=int(_integer(body, "top_k", 0, 1 << 20) or 0),
        stop=tuple(stops),
    )
    return CompletionRequest("chat", model, stream, False, params, messages=messages, tools=tools,
                             tool_choice=tool_choice, tool_choice_name=tool_name, parallel_tool_calls=parallel,
                             response_format=response_format, operation="messages",
                             template_kwargs={**thinking.template_kwargs(body), **_effort_kwargs(body)},
                             reasoning_budget=thinking.budget(body))


@routes.post("/v1/messages")
async def messages(request: web.Request) -> web.StreamResponse:
    """Anthropic Messages: a reply to a conversation, streamed or whole."""
    body = await read_json(request)
    await async_check_tool_schemas(body)
    return await serve(request, parse_messages(body), MessagesDialect())


@routes.post("/v1/messages/count_tokens")
async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's token count, rendered exactly as /v1/messages would render it."""
    body = await read_json(request)
    await async_check_tool_schemas(body)
    completion = parse_messages(body, count_only=True)
    node = request.app[NODE]
    run = node.new_run(completion, RequestTrace(model=completion.model, operation="messages.count_tokens"))
    return web.json_response({"input_tokens": await run.count_prompt_tokens()})
