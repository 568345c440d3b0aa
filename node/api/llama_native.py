"""llama-server's own endpoints, for apps written for llama.cpp rather than for /v1: SillyTavern's
"llama.cpp" backend (POST /completion, GET /props, /tokenize, /detokenize), the llama.vscode and
llama.vim plugins (POST /infill), scripts (/apply-template). A thin dialect over the one driver:
each body becomes the same CompletionRequest /v1/completions makes (api/extras.py takes
llama-server's sampler set), and the reply is written in llama-server's shapes (`content`, `stop`,
`stop_type`, `tokens_predicted`, `timings`; a stream of `data: {...}` events, the last with
`stop: true`, no `[DONE]`). `model` is optional, as llama-server serves one: without it, the first
model this node holds whole (else the first it knows).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from node.api.appkeys import NODE
from node.api.driver import serve
from node.api.errors import read_json
from node.api.responses import sse_event
from node.api.schemas import parse_completion
from node.api.streaming import SSE_CONTENT_TYPE
from node.errors import InvalidRequest, ModelNotFound, Unsupported
from node.inference.chat import CHATML_TEMPLATE
from node.inference.generate import CompletionRun
from node.inference.reasoning import with_history
from node.inference.request import CompletionRequest, Delta, TokenLogprob
from node.inference.served import ServedModel
from node.inference.tools import chat_template, prompt_inputs
from node.trace import RequestTrace

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

# llama-server's per-request knobs with no effect on what this node writes: the prompt's time
# limit (t_max_predict_ms is applied: CompletionRequest.predict_time_limit_ms), progress events, the
# KV-shift reuse chunk, the minimum indent (llama.vim), the SSE ping interval
_HINTS = {"t_max_prompt_ms", "n_indent", "return_progress", "n_cache_reuse",
          "sse_ping_interval", "post_sampling_probs"}
_INFILL_KEYS = ("input_prefix", "input_suffix", "input_extra")


def _default_model(request: web.Request, named: Any, *, infill: bool = False) -> str:
    """The model a request names, or the one llama-server would serve: the first held whole (for
    /infill the first that can infill: llama.vscode sends no `model`, and a node holding a chat
    model before its code model refused every completion; found in review)."""
    if named is not None:
        if not isinstance(named, str) or not named:
            raise InvalidRequest("`model` must be a string", param="model")
        return named
    models = request.app[NODE].models
    served = models.whole_models() or models.all()
    if not served:
        raise ModelNotFound("this node serves no model yet", param="model")
    if infill:
        coders = [m for m in served if m.tokenizer is not None and m.tokenizer.can_infill]
        served = coders or served  # none: the first, whose refusal says why
    return served[0].id


def _openai_body(request: web.Request, body: Any, *, infill: bool) -> tuple[dict, Any]:
    """The /v1/completions body of a native one, and its `response_fields`."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    out = {k: v for k, v in body.items() if k not in _HINTS and k not in _INFILL_KEYS}
    fields = out.pop("response_fields", None)
    for key, off in (("n_cmpl", 1), ("n", 1), ("lora", [])):  # several choices: /v1 only (its shape)
        if out.pop(key, None) not in (None, off):
            raise Unsupported(f"`{key}` is not supported by this node: send {off} or leave it out", param=key)
    out["model"] = _default_model(request, body.get("model"), infill=infill)
    prompt = out.get("prompt")
    if infill and prompt is None:
        out["prompt"] = ""
    elif isinstance(prompt, list) and any(not isinstance(p, str) for p in prompt):
        raise Unsupported("`prompt` as token ids is not supported: send the text", param="prompt")
    return out, fields


def _extra(body: dict) -> tuple[tuple[str, str], ...]:
    value = body.get("input_extra")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequest('`input_extra` must be an array of {"filename": string, "text": string}',
                             param="input_extra")
    chunks = []
    for chunk in value:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str) \
                or not isinstance(chunk.get("filename", ""), str):
            raise InvalidRequest('each `input_extra` chunk must hold a string "text" (and a string "filename")',
                                 param="input_extra")
        chunks.append((chunk.get("filename", "tmp"), chunk["text"]))
    return tuple(chunks)


def parse_native(request: web.Request, body: Any, *, infill: bool) -> tuple[CompletionRequest, Any]:
    """A /completion or /infill body as the CompletionRequest /v1/completions would make."""
    out, fields = _openai_body(request, body, infill=infill)
    completion = parse_completion(out, "text")
    if not infill:
        return dataclasses.replace(completion, operation="completion"), fields
    for key in ("input_prefix", "input_suffix"):
        if not isinstance(body.get(key), str):
            raise InvalidRequest(f"`{key}` is required and must be a string", param=key)
    completion = dataclasses.replace(completion, operation="infill", prompt=body["input_prefix"],
                                     suffix=body["input_suffix"], infill_middle=completion.prompt,
                                     infill_extra=_extra(body))
    return completion, fields


def _stop_type(run: CompletionRun) -> str:
    if run.trace.finish_reason == "length":
        return "limit"
    return "word" if run.stop_sequence is not None else "eos"


def _per(n: int, ms: float | None) -> tuple[float | None, float | None]:
    """(ms per token, tokens per second)"""
    if not ms or not n:
        return None, None
    return ms / n, n * 1000.0 / ms


def timings(trace: RequestTrace) -> dict[str, Any]:
    """llama-server's `timings`: the prompt's tokens and time (to the first token), the reply's."""
    prompt_n, predicted_n = trace.prompt_tokens or 0, trace.completion_tokens
    prompt_ms, predicted_ms = trace.ttft_ms or 0.0, trace.decode_ms or 0.0
    p_tok, p_sec = _per(prompt_n, prompt_ms)
    g_tok, g_sec = _per(predicted_n, predicted_ms)
    return {"cache_n": trace.cached_tokens or 0, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": p_tok, "prompt_per_second": p_sec, "predicted_n": predicted_n,
            "predicted_ms": predicted_ms, "predicted_per_token_ms": g_tok, "predicted_per_second": g_sec}


def _settings(run: CompletionRun) -> dict[str, Any]:
    p = run.request.params
    served = run.served
    return {"n_ctx": served.n_ctx if served else None, "model": run.trace.model,
            "n_predict": run.job.max_new_tokens if run.job else p.max_tokens, "seed": p.seed,
            "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
            "repeat_penalty": p.repeat_penalty, "presence_penalty": p.presence_penalty,
            "frequency_penalty": p.frequency_penalty, "stop": list(p.stop), "stream": run.request.stream}


def final_fields(run: CompletionRun) -> dict[str, Any]:
    """What the whole reply and a stream's last event carry beyond `content`."""
    trace = run.trace
    return {"id_slot": 0, "stop": True, "model": trace.model, "tokens_predicted": trace.completion_tokens,
            "tokens_evaluated": trace.prompt_tokens or 0, "generation_settings": _settings(run),
            "prompt": run.request.prompt, "has_new_line": "\n" in run.text, "truncated": False,
            "stop_type": _stop_type(run), "stopping_word": run.stop_sequence or "",
            "tokens_cached": trace.cached_tokens or 0, "timings": timings(trace)}


def _probs(items: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    return [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes),
             "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(b)} for s, b, lp in t.top]} for t in items]


def _only(body: dict[str, Any], fields: Any) -> dict[str, Any]:
    """llama-server's `response_fields`: only those, `a/b` taken out of `a` under the name `b`."""
    if fields is None:
        return body
    out = {}
    for name in fields if isinstance(fields, list) else ():
        if not isinstance(name, str):
            continue
        value: Any = body
        for part in name.split("/"):
            value = value.get(part, KeyError) if isinstance(value, dict) else KeyError
        if value is not KeyError:
            out[name.split("/")[-1]] = value
    return out


class NativeEvents:
    """A /completion stream (streaming.StreamEvents): `data: {"content", "stop": false}` per piece,
    then one event with `stop: true` and the totals; no `[DONE]`, as llama-server."""

    def __init__(self, run: CompletionRun, fields: Any):
        self.run = run
        self.fields = fields

    def opening(self) -> list[bytes]:
        return []

    def delta(self, delta: Delta) -> list[bytes]:
        if not delta.text and not delta.logprobs:
            return []
        event: dict[str, Any] = {"index": 0, "content": delta.text, "tokens": [], "stop": False, "id_slot": 0}
        if delta.logprobs:
            event["completion_probabilities"] = _probs(delta.logprobs)
        return [sse_event(event)]

    def closing(self) -> list[bytes]:
        body = {"index": 0, "content": "", "tokens": [], **final_fields(self.run)}
        return [sse_event(body if self.fields is None else {**_only(body, self.fields), "stop": True})]

    def error(self, exc) -> list[bytes]:
        return [sse_event(exc.to_openai())]


class NativeDialect:
    """llama-server's /completion and /infill shapes (driver.Dialect)."""

    error_shape = "openai"
    stream_content_type = SSE_CONTENT_TYPE
    body_in_worker = True  # the body reads the finished run only
    hide_reasoning = False

    def __init__(self, fields: Any):
        self.fields = fields

    def events(self, run: CompletionRun) -> NativeEvents:
        return NativeEvents(run, self.fields)

    def body(self, run: CompletionRun, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        body = {"index": 0, "content": run.content, "tokens": [], **final_fields(run)}
        if logprobs:
            body["completion_probabilities"] = _probs(logprobs)
        return _only(body, self.fields)


@routes.post("/completion")
@routes.post("/completions")
async def completion(request: web.Request) -> web.StreamResponse:
    """llama-server's text completion: `prompt`, `n_predict`, its samplers; whole or streamed."""
    completion, fields = parse_native(request, await read_json(request), infill=False)
    return await serve(request, completion, NativeDialect(fields))


@routes.post("/infill")
async def infill(request: web.Request) -> web.StreamResponse:
    """Fill in the middle: `input_prefix`, `input_suffix`, `input_extra` (other files), `prompt`
    (the middle's start), and /completion's options."""
    completion, fields = parse_native(request, await read_json(request), infill=True)
    return await serve(request, completion, NativeDialect(fields))


async def _served(request: web.Request, named: Any) -> ServedModel:
    served = await request.app[NODE].models.async_get(_default_model(request, named))
    if served.tokenizer is None:
        raise ModelNotFound(f"model {served.id} has no tokenizer here: {served.error}", param="model")
    return served


def _flag(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"`{key}` must be a boolean", param=key)
    return value


@routes.post("/tokenize")
async def tokenize(request: web.Request) -> web.Response:
    """`content` as token ids (`add_special`: BOS; `parse_special`; `with_pieces`: each id's text)."""
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("content"), str):
        raise InvalidRequest("`content` is required and must be a string", param="content")
    add, special, pieces = (_flag(body, "add_special", False), _flag(body, "parse_special", True),
                            _flag(body, "with_pieces", False))
    tok = (await _served(request, body.get("model"))).tokenizer

    def work() -> bytes:  # the reply serialised here too: a megabyte text is megabytes of JSON (found in review:
        ids = tok.tokenize(body["content"], add_bos=add, special=special)  # an 11 s loop stall)
        if not pieces:
            return json.dumps({"tokens": ids}).encode()
        out = []
        for i in ids:
            raw = tok.piece(i)
            try:
                out.append({"id": i, "piece": raw.decode("utf-8")})
            except UnicodeDecodeError:  # part of a character: its bytes, as llama-server
                out.append({"id": i, "piece": list(raw)})
        return json.dumps({"tokens": out}).encode()

    reply = await asyncio.get_running_loop().run_in_executor(None, work)
    return web.Response(body=reply, content_type="application/json")


@routes.post("/detokenize")
async def detokenize(request: web.Request) -> web.Response:
    """Token ids as text."""
    body = await read_json(request)
    ids = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(ids, list):
        raise InvalidRequest("`tokens` is required and must be a list of token ids", param="tokens")
    tok = (await _served(request, body.get("model"))).tokenizer

    def work() -> bytes:  # the checks too: millions of ids are a second of Python
        if not all(type(i) is int for i in ids):
            raise InvalidRequest("`tokens` is required and must be a list of token ids", param="tokens")
        if any(not 0 <= i < tok.n_vocab for i in ids):
            raise InvalidRequest(f"`tokens` holds ids outside the model's vocabulary of {tok.n_vocab}", param="tokens")
        text = b"".join(tok.piece(i) for i in ids).decode("utf-8", errors="replace")
        return json.dumps({"content": text}).encode()

    reply = await asyncio.get_running_loop().run_in_executor(None, work)
    return web.Response(body=reply, content_type="application/json")


@routes.post("/apply-template")
async def apply_template(request: web.Request) -> web.Response:
    """The prompt a chat would be, rendered with the model's own template (nothing runs)."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    chat = parse_completion({**body, "model": _default_model(request, body.get("model"))}, "chat")
    tok = (await _served(request, chat.model)).tokenizer
    loop = asyncio.get_running_loop()  # as a run renders it: its template, thoughts, template kwargs
    template, fmt = await loop.run_in_executor(None, chat_template, chat, tok.chat_template,
                                               tok.named_templates.get("tool_use"))
    messages, tools = await loop.run_in_executor(None, prompt_inputs, fmt, chat, template, with_history)
    prompt = await loop.run_in_executor(None, tok.render_chat, messages, tools, chat.template_kwargs, template)
    return web.json_response({"prompt": prompt})


def _model_file(served: ServedModel) -> str:
    """/props' `model_path`: the file's name where the whole file is here; else (a model known from
    the swarm, whose path is this node's vocab cache, or a partial download's directory) the name
    the file has on its holders. Until 2026-12-06 a node holding nothing of the model reported
    `<sha256>.vocab.gguf`, and clients that name the model by this path saw that."""
    entry = served.entry
    return entry.path.name if entry.has_file and entry.partial is None else f"{entry.name}.gguf"


@routes.get("/props")
async def props(request: web.Request) -> web.Response:
    """The model's context, chat template and defaults (`?model=` names one; else the default)."""
    served = await _served(request, request.query.get("model"))
    tok = served.tokenizer
    params = {"n_predict": -1, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0,
              "presence_penalty": 0.0, "frequency_penalty": 0.0, "stop": [], "stream": False}
    return web.json_response({
        "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": served.n_ctx, "is_processing": served.busy,
                                        "params": params, "model": served.id},
        "total_slots": served.lock.limit, "model_path": _model_file(served), "model_alias": served.id,
        "chat_template": tok.chat_template or CHATML_TEMPLATE, "modalities": {"vision": False, "audio": False},
        "bos_token": tok.bos_text, "eos_token": tok.eos_text, "build_info": "swarmllm", "is_sleeping": False,
        **({"chat_template_tool_use": tok.named_templates["tool_use"]} if "tool_use" in tok.named_templates else {})})
