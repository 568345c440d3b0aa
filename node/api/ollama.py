"""Ollama's API as one more dialect (api/ollama_models.py: the model routes): POST /api/chat,
/api/generate, /api/embed and the older /api/embeddings, on the node's own port, so apps that speak
only Ollama (Open WebUI's Ollama connection, Zed, Continue's `ollama` provider, LangChain's
ChatOllama, Page Assist, Enchanted, Home Assistant, n8n) work against SwarmLLM.

A chat or generate body becomes the /v1/chat/completions (or, for `raw` and `suffix`,
/v1/completions) body it means and goes through that parser, so every option is checked as there
(its 400 naming `options.<name>`, as sent);
`options` are its samplers (`num_predict` the token limit), load-time ones (`num_ctx`, `num_gpu`,
...) dropped as on /v1, the samplers Ollama takes that this node lacks (`typical_p`, `mirostat`, ...)
taken and not applied (said once at INFO), unknown ones dropped as Ollama does. Histories: an assistant's `tool_calls`
get ids, and a `tool` message answers the call its `tool_call_id` or `tool_name` names (naming neither,
the oldest call not yet answered: Continue and Home Assistant send results bare, in the calls' order). `stream`
defaults to true (NDJSON lines, api/ollama_reply.py). A request with no messages (no prompt) is
Ollama's load request (`done_reason: "load"`), or with `keep_alive: 0` its unload request, which is
answered and leaves the model loaded (the node keeps its models loaded for its apps and its swarm).
Errors are `{"error": "..."}` with the status (api/errors.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from aiohttp import web

from node import const
from node.api.appkeys import NODE
from node.api.driver import serve
from node.api.embed_routes import serve_embeddings
from node.api.embedding_schemas import parse_embeddings
from node.api.errors import read_json
from node.api.extras import OLLAMA_LOAD_OPTIONS, PENALTIES_OFF, THINK_EFFORTS
from node.api.ollama_models import model_name, takes_think
from node.api.ollama_reply import OllamaDialect, created_at
from node.api.schemas import parse_completion
from node.api.tool_schemas import async_check_tool_schemas
from node.errors import InvalidRequest, Unsupported
from node.inference.embeddings import EmbeddingResult
from node.inference.request import CompletionRequest

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

# Ollama's samplers, taken as /v1 takes them
_SAMPLERS = {"temperature", "top_p", "top_k", "min_p", "seed", "stop", "repeat_penalty", "presence_penalty",
             "frequency_penalty"}
# options Ollama takes that change nothing here, each with the value that changes nothing anywhere
# (None: none has an effect without mirostat). Ollama's api/types.go has typical_p and repeat_last_n
# (its llama.cpp runner applies them) and no longer mirostat, mirostat_eta, mirostat_tau or tfs_z
# (their names are "invalid option provided", a warning): taken as Ollama takes them, never a 400
# (Open WebUI's Advanced Params send them), and said once at INFO where they would have an effect.
# repeat_last_n is the penalties' own window (const.PENALTY_LAST_N_TOKENS) when it is that one.
_NOT_APPLIED: dict[str, float | None] = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0, "mirostat_eta": None,
                                         "mirostat_tau": None, "repeat_last_n": const.PENALTY_LAST_N_TOKENS}
_told_not_applied: set[str] = set()
# Ollama's integer options: it decodes every option as a float64 and truncates these with int64()
# (api/types.go), so `seed: 42.0` is 42 and `top_k: 1.5` is 1 (review r52: 400s here)
_INTEGER_OPTIONS = {"seed", "top_k", "num_predict", "repeat_last_n", "mirostat"}
_CHAT_KEYS = {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think", "logprobs",
              "top_logprobs"}
_GENERATE_KEYS = {"model", "prompt", "suffix", "system", "template", "context", "raw", "images", "format",
                  "options", "stream", "keep_alive", "think", "logprobs", "top_logprobs"}
_EMBED_KEYS = {"model", "input", "truncate", "dimensions", "options", "keep_alive"}
_told: set[str] = set()
_NUM_PREDICT_MAX = 1 << 24  # /v1's max_tokens bound (api/schemas.py)
_CALLS_LISTED = 8  # the unanswered calls a tool message's 400 names


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def _tell(names: Iterable[str], what: str) -> None:
    """Say at DEBUG the ignored names not said before: the first OLLAMA_IGNORED_NAMES_MAX only (a
    client's made-up keys would grow the set without bound), each cut to a short length."""
    room = const.OLLAMA_IGNORED_NAMES_MAX - len(_told)
    new = sorted(n[:const.OLLAMA_IGNORED_NAME_CHARS] for n in names if isinstance(n, str)) if room > 0 else []
    new = [n for n in dict.fromkeys(new) if n not in _told][:room]
    if new:
        _told.update(new)
        log.debug("DIAG: ollama %s ignored %s=%s", what, what, ",".join(new))


def _unknown(body: dict, allowed: set[str]) -> None:
    """Ollama ignores fields it does not know; so does this route (said once per name, at DEBUG)."""
    _tell(set(body) - allowed, "fields")


def _tell_not_applied(options: dict) -> None:
    """Say once, at INFO, each option Ollama takes that is sent where it would change the reply and
    is not applied here (_NOT_APPLIED; repeat_last_n only while a penalty is on: review r52)."""
    mirostat = options.get("mirostat") not in (None, 0)
    penalized = any(options.get(key) not in (None, off) for key, off in PENALTIES_OFF)
    new = {key for key, off in _NOT_APPLIED.items() if key in options and options[key] is not None
           and (options[key] != off if off is not None else mirostat)
           and (key != "repeat_last_n" or penalized)} - _told_not_applied  # the penalties' window: with one on
    if new:
        _told_not_applied.update(new)
        log.info("DIAG: ollama options taken, not applied options=%s (no such sampler here; the penalties look "
                 "back %d tokens)", ",".join(sorted(new)), const.PENALTY_LAST_N_TOKENS)


def _truncated(value: Any) -> Any:
    """A finite float as Ollama's int64() makes it (toward zero); anything else as sent (its 400 below)."""
    return int(value) if type(value) is float and math.isfinite(value) else value


def _options(body: dict) -> dict[str, Any]:
    """`options` as /v1 fields: the samplers, `num_predict` as max_tokens (negative: no limit)."""
    options = body.get("options")
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise InvalidRequest("`options` must be an object", param="options")
    options = {key: _truncated(value) if key in _INTEGER_OPTIONS else value for key, value in options.items()}
    out: dict[str, Any] = {}
    _tell(set(options) - _SAMPLERS - _NOT_APPLIED.keys() - OLLAMA_LOAD_OPTIONS - {"num_predict"}, "options")
    _tell_not_applied(options)
    for key, value in options.items():
        if key in _SAMPLERS:
            out[key] = value
        elif key == "num_predict":
            if value is None or (type(value) is int and value < 0):
                continue  # -1: no limit, -2: fill the context (up to it here too)
            if type(value) is not int or not 0 < value <= _NUM_PREDICT_MAX:  # checked here under the name sent
                raise InvalidRequest(f"`options.num_predict` must be between 1 and {_NUM_PREDICT_MAX}, or -1 for no "
                                     f"limit, got {value!r}", param="options.num_predict")
            out["max_tokens"] = value
    return out


def _parsed(out: dict[str, Any], kind: str, body: dict) -> CompletionRequest:
    """parse_completion, its 400 about a sampler sent in `options` naming it as sent (`options.top_p`:
    the client's request has no top-level `top_p` to look for)."""
    try:
        return parse_completion(out, kind)
    except InvalidRequest as exc:
        options = body.get("options") or {}
        if isinstance(exc.param, str) and exc.param in _SAMPLERS and exc.param in options:
            sent = f"options.{exc.param}"
            exc.message = exc.message.replace(f"`{exc.param}`", f"`{sent}`")
            exc.args, exc.param = (exc.message,), sent
        raise


def _common(body: dict, model: str) -> dict[str, Any]:
    """The /v1 fields every Ollama completion body gives."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("`stream` must be a boolean", param="stream")
    out = {"model": model, "stream": True if stream is None else stream, **_options(body)}
    for key in ("format", "think", "logprobs", "top_logprobs"):
        if body.get(key) is not None:
            out[key] = body[key]
    return out


def _no_images(value: Any, where: str) -> None:
    if value not in (None, []):
        raise Unsupported(f"`{where}`: this node's models read text only (images are not supported): send text, "
                          "or use a vision model on another server", param=where)


def _arguments(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value or "{}"
    if not isinstance(value, dict):
        raise InvalidRequest(f"`{where}` must be an object", param=where)
    return json.dumps(value, ensure_ascii=False)


def _history(messages: list) -> list[dict[str, Any]]:
    """Ollama's messages as /v1's: calls get ids (`call_<turn>_<n>` unless given), a tool message the
    id of the call it answers (its `tool_call_id`, else the oldest unanswered call of its
    `tool_name`, else, naming neither, the oldest unanswered call)."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, name) of calls not yet answered
    latest: set[str] = set()  # the ids of the latest assistant message's calls
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        _no_images(msg.get("images"), f"messages[{i}].images")
        role, content = msg.get("role"), msg.get("content")
        if isinstance(role, str):
            role = role.lower()  # Ollama lowercases it (Message.UnmarshalJSON): "User" is a user
        if content is not None and not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        entry: dict[str, Any] = {"role": role, "content": content or ""}
        if role == "assistant":
            thinking = msg.get("thinking")
            if thinking is not None and not isinstance(thinking, str):  # before /v1's reasoning_content check
                raise InvalidRequest(f"messages[{i}].thinking must be a string", param=f"messages[{i}].thinking")
            if thinking:
                entry["reasoning_content"] = thinking
            calls = msg.get("tool_calls") or []
            if not isinstance(calls, list):
                raise InvalidRequest(f"messages[{i}].tool_calls must be a list", param=f"messages[{i}].tool_calls")
            converted = []
            if calls:
                latest = set()
            for j, call in enumerate(calls):
                where = f"messages[{i}].tool_calls[{j}]"
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                    raise InvalidRequest(f'`{where}` must be {{"function": {{"name", "arguments"}}}}', param=where)
                call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{i}_{j}"
                converted.append({"id": call_id, "type": "function", "function": {
                    "name": fn["name"], "arguments": _arguments(fn.get("arguments", {}), f"{where}.function.arguments")}})
                pending.append((call_id, fn["name"]))
                latest.add(call_id)
            if converted:
                entry["tool_calls"] = converted
        elif role == "tool":
            entry["tool_call_id"] = _answered(msg, i, pending, latest)
        out.append(entry)
    return out


def _answered(msg: dict, i: int, pending: list[tuple[str, str]], latest: set[str]) -> str:
    """The id of the call a tool message answers (taken off `pending`): by id; else by name or, naming
    neither, the oldest unanswered call, of the latest assistant message's calls first (review r46: a
    call an earlier turn left unanswered took a later turn's result)."""
    wanted_id, name = msg.get("tool_call_id"), msg.get("tool_name") or msg.get("name")
    match = next((c for c in pending if c[0] == wanted_id), None) if wanted_id else None
    ordered = [c for c in pending if c[0] in latest] + [c for c in pending if c[0] not in latest]
    if match is None and name:
        match = next((c for c in ordered if c[1] == name), None)
    if match is None and pending and not wanted_id and not name:
        match = ordered[0]  # results in the calls' order, as Continue and Home Assistant send them
    if match is None:
        what = f"tool {name!r}" if name else "a tool"
        if not pending:
            raise InvalidRequest(f"messages[{i}] is {what}'s result, but no earlier assistant message called it "
                                 "(give `tool_name` as the call's function name)", param=f"messages[{i}].tool_name")
        calls = ", ".join(f"{call_id} ({call_name})" for call_id, call_name in pending[:_CALLS_LISTED]) + \
            (f" and {len(pending) - _CALLS_LISTED} more" if len(pending) > _CALLS_LISTED else "")
        said = (f"its tool_call_id {wanted_id!r}" + (f" and tool_name {name!r} match" if name else " matches")
                if wanted_id else f"its tool_name {name!r} matches")
        raise InvalidRequest(f"messages[{i}] is {what}'s result, but {said} none of the calls not yet answered: "
                             f"{calls}", param=f"messages[{i}].tool_call_id" if wanted_id else f"messages[{i}].tool_name")
    pending.remove(match)
    return match[0]


def _think_max(body: dict) -> None:
    """Ollama's `think: "max"` (taken since April 2026) as "high", the most effort here (review r52: a 400)."""
    if body.get("think") == "max":
        body["think"] = "high"


async def _check_think(request: web.Request, body: dict, named: Any, model: str) -> None:
    """Ollama's 400 for `think` (true, or an effort) on a model that does not think (its routes.go:
    `"<model>" does not support thinking`); false and null are taken, and so is a value whose switch the
    model's template reads (`takes_think`). A model whose template is not here yet is left to the parser."""
    think = body.get("think")
    if think is not True and not (isinstance(think, str) and think in THINK_EFFORTS):
        return  # off, absent, or a wrong value (the parser's 400)
    served = await request.app[NODE].models.async_get(model)  # an unknown model: its 404
    if served.tokenizer is not None and not takes_think(served, think):
        raise InvalidRequest(f"{json.dumps(named, ensure_ascii=False)} does not support thinking", param="think")


async def _load_reply(request: web.Request, body: dict, named: str, model: str, chat: bool) -> web.Response:
    """Ollama's answer to a request with nothing to say: a load (the model loaded now, on demand as
    a /v1 request loads it), or with `keep_alive: 0` an unload (answered; the model stays loaded here)."""
    node = request.app[NODE]
    served = await node.models.async_get(model)  # an unknown model: its 404
    keep_alive = body.get("keep_alive")
    unload = keep_alive in (0, "0", "0s", "0m")
    if not unload and served.whole:  # as a request loads it: a failed load's reason stands, an unload is not waited out
        await node.models.async_load_on_demand(served, request_id="ollama-load")
    reason = "unload" if unload else "load"
    log.debug("DIAG: ollama %s request model=%s (the node keeps its models loaded)", reason, served.id)
    text = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return web.json_response({"model": named, "created_at": created_at(), **text, "done": True, "done_reason": reason})


@routes.post("/api/chat")
async def chat(request: web.Request) -> web.StreamResponse:
    """A chat, streamed (the default) or whole, in Ollama's shapes."""
    body = _object(await read_json(request))
    _unknown(body, _CHAT_KEYS)
    _think_max(body)
    named = body.get("model")
    model = model_name(named)
    messages = body.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise InvalidRequest("`messages` must be a list", param="messages")
    if not messages:
        return await _load_reply(request, body, named, model, chat=True)
    await _check_think(request, body, named, model)
    out = {**_common(body, model), "messages": _history(messages)}
    if body.get("tools") is not None:
        out["tools"] = body["tools"]
    await async_check_tool_schemas(out)
    # a history past the context loses its oldest messages, as Ollama's (/v1 answers a 400)
    completion = dataclasses.replace(_parsed(out, "chat", body), operation="ollama.chat", drop_old_messages=True)
    return await serve(request, completion, OllamaDialect(chat=True, named=named))


@routes.post("/api/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    """A completion of `prompt`: under the model's chat template with `system` (Ollama's default),
    or as it is (`raw`, or with `suffix`: fill in the middle, for models that can)."""
    body = _object(await read_json(request))
    _unknown(body, _GENERATE_KEYS)
    _think_max(body)
    named = body.get("model")
    model = model_name(named)
    _no_images(body.get("images"), "images")
    for key in ("prompt", "system", "suffix", "template"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise InvalidRequest(f"`{key}` must be a string", param=key)
    if body.get("template"):
        raise Unsupported("`template` (a prompt template for this request) is not supported: the model's own chat "
                          "template is used; send `raw: true` with the prompt as it should be", param="template")
    if body.get("context"):
        raise Unsupported("`context` (the token ids of an earlier /api/generate reply) is not supported: this node "
                          "returns none; send the conversation to /api/chat instead", param="context")
    raw = body.get("raw")
    if raw is not None and not isinstance(raw, bool):
        raise InvalidRequest("`raw` must be a boolean", param="raw")
    prompt, suffix, system = body.get("prompt") or "", body.get("suffix"), body.get("system")
    if not prompt and not suffix:
        return await _load_reply(request, body, named, model, chat=False)
    out = _common(body, model)
    if raw or suffix:
        if system:
            raise Unsupported("`system` with `raw` or `suffix` has no place: the prompt is sent as it is",
                              param="system")
        if out.pop("think", False) is not False:  # no template: nothing to switch the thoughts on or off in
            raise Unsupported("`think` needs the model's chat template: leave out `raw` (and `suffix`), or `think`",
                              param="think")
        out.update(prompt=prompt, **({"suffix": suffix} if suffix else {}))
        completion = _parsed(_text_logprobs(out), "text", body)
    else:
        await _check_think(request, body, named, model)
        system_turn = [{"role": "system", "content": system}] if system else []
        completion = _parsed({**out, "messages": [*system_turn, {"role": "user", "content": prompt}]}, "chat", body)
    completion = dataclasses.replace(completion, operation="ollama.generate")
    return await serve(request, completion, OllamaDialect(chat=False, named=named))


def _text_logprobs(out: dict[str, Any]) -> dict[str, Any]:
    """Ollama's `logprobs: true` (+ `top_logprobs`) as /v1/completions' `logprobs: N`."""
    on, top = out.pop("logprobs", None), out.pop("top_logprobs", None)
    if on:
        out["logprobs"] = top or 0
    return out


def _embed_body(body: dict, model: str, key: str) -> dict[str, Any]:
    """/api/embed's (or /api/embeddings') body as /v1/embeddings'."""
    value = body.get(key)
    if value is None or value == []:
        raise InvalidRequest(f"`{key}` is required: a string or a list of strings", param=key)
    truncate = body.get("truncate", True)
    if truncate is not None and not isinstance(truncate, bool):
        raise InvalidRequest("`truncate` must be a boolean", param="truncate")
    out = {"model": model, "input": value, "truncate": "NONE" if truncate is False else "END"}
    if body.get("dimensions") is not None:
        out["dimensions"] = body["dimensions"]
    return out


def _floats(vector: Any) -> list[float]:
    return np.asarray(vector, dtype="<f4").tolist()


@routes.post("/api/embed")
async def embed(request: web.Request) -> web.Response:
    """Embeddings of `input` (a string or a list): unit vectors, `truncate` (default true) cutting
    an input past the context to its start, `dimensions` the model's own only."""
    body = _object(await read_json(request))
    _unknown(body, _EMBED_KEYS)
    named = body.get("model")
    embedding = parse_embeddings(_embed_body(body, model_name(named), "input"))
    started = time.monotonic()

    def render(result: EmbeddingResult) -> dict[str, Any]:  # on a worker, once the vectors are made
        return {"model": named, "embeddings": [_floats(v) for v in result.vectors],
                "total_duration": int((time.monotonic() - started) * 1e9), "load_duration": 0,
                "prompt_eval_count": result.prompt_tokens}

    return await serve_embeddings(request, embedding, render, shape="ollama")


@routes.post("/api/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    """The older form: one `prompt`, the reply `{"embedding": [...]}`."""
    body = _object(await read_json(request))
    _unknown(body, _EMBED_KEYS | {"prompt"})
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise InvalidRequest("`prompt` is required and must be a non-empty string", param="prompt")
    embedding = parse_embeddings({"model": model_name(body.get("model")), "input": prompt})
    return await serve_embeddings(request, embedding,
                                  lambda result: {"embedding": _floats(result.vectors[0])},
                                  shape="ollama")
