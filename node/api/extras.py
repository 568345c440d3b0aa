"""Fields local apps send to an OpenAI-compatible server beyond OpenAI's own: llama-server's
sampler extras (SillyTavern, llama.cpp web UIs, scripts written for llama-server), vLLM's
`repetition_penalty`, and LM Studio's `max_tokens: -1`. llama-server takes them all; each one here
is either applied, mapped onto the OpenAI field it means, accepted because it changes nothing (a
hint, or a sampler at its neutral value, as SillyTavern sends its defaults), or refused with a 400
naming it where ignoring it would change the output the client asked for.

Open WebUI copies every "Advanced Params" value a user set (in their settings or a model's) into
the body it sends to an OpenAI connection, the Ollama ones included (`utils/payload.py`
apply_params_to_form_data / apply_model_params_to_body_openai): its load-time settings
(`num_ctx`, `num_batch`, `num_keep`, `num_thread`, `num_gpu`, `use_mmap`, `use_mlock`,
`keep_alive`) change nothing here and are dropped; `think` is the template's `enable_thinking`
(or, as "low" / "medium" / "high", `reasoning_effort`) and `format` ("json" or a JSON schema) the
`response_format` it means. `tool_servers` (Open WebUI's own tool list; the tools reach the model
as `tools`) is dropped too.

Jan (0.6, token.js) spreads an assistant's parameters into every request to any provider, so a
user who added its "Max Context Tokens" (`ctx_len`, a load-time setting like `num_ctx`) or "Max
Output Tokens" (`max_output_tokens`) failed every chat: `ctx_len` changes nothing here and is
dropped, `max_output_tokens` is the `max_tokens` it means (when neither token limit is given).

LM Studio's `draft_model` (Roo Code's LM Studio provider sends it when "speculative decoding"
is on) only makes a reply faster and is dropped, as are OpenRouter's routing preferences
`provider` (Roo Code's OpenRouter provider, whose base URL can be set to this node). OpenRouter's
`reasoning` object (Roo Code, aider's `openrouter/` models, Cline's Claude-family routes) is what it
means here: `effort` the `reasoning_effort`, `max_tokens` the `reasoning_budget_tokens`,
`enabled: false` the template's `enable_thinking: false`, `enabled: true`, a budget or an effort
other than "none" its `enable_thinking: true` (as `think`: a `chat_template_kwargs.enable_thinking`
wins); `exclude: true` leaves the thoughts out of the reply (`reasoning_excluded`; never in
`content`: a 400 beside `reasoning_format: "none"`).

llama-server's `grammar`, vLLM's guided_* / structured_outputs, `ignore_eos` and `min_tokens` are
api/constraints.py's.

`normalize(body)` returns a body `schemas.parse_completion` checks as usual (a copy; the client's
dict is left alone).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from node.api.errors import parse_json_text
from node.const import PENALTY_LAST_N_TOKENS
from node.errors import InvalidRequest, Unsupported

log = logging.getLogger(__name__)

# accepted, no effect on the output: the prefix cache is always on, one slot pool, sampler order is ours
_HINTS = {"t_max_predict_ms", "cache_prompt", "id_slot", "slot_id", "timings_per_token", "samplers", "sampler_order",
          "n_keep", "min_keep", "penalize_nl", "return_tokens", "mirostat_tau", "mirostat_eta",
          "dynatemp_exponent", "xtc_threshold", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
          "dry_sequence_breakers"}
# samplers this node does not have: accepted at the value that turns them off, else a 400
_NEUTRAL = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0, "dynatemp_range": 0.0, "xtc_probability": 0.0,
            "dry_multiplier": 0.0, "top_a": 0.0, "top_n_sigma": -1.0, "n_probs": 0}
# Ollama's load-time and runner options (Open WebUI puts them in /v1 bodies too; the Ollama dialect's
# `options` hold them): the node's own context, threads, GPU layers and memory mapping
OLLAMA_LOAD_OPTIONS = frozenset({
    "numa", "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
    "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "num_gqa", "rope_frequency_base",
    "rope_frequency_scale", "penalize_newline"})
# those, and apps' own hints (Open WebUI's tool-server list, a model to keep loaded, LM Studio's draft
# model, OpenRouter's provider, Jan's ctx_len): nothing to do with the reply here
_APP_HINTS = OLLAMA_LOAD_OPTIONS | {"keep_alive", "tool_servers", "draft_model", "provider", "ctx_len"}
REASONING_KEYS = ("effort", "max_tokens", "enabled", "exclude")
THINK_EFFORTS = ("low", "medium", "high")
_told: set[str] = set()  # field names already said at DEBUG (once each per process)
# the penalties and the value each is off at (repeat_last_n changes a reply only while one is on)
PENALTIES_OFF = (("repeat_penalty", 1.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0))


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _neutral(key: str, value: Any) -> None:
    off = _NEUTRAL[key]
    if value is None or (_is_number(value) and (value == off or (key == "top_n_sigma" and value <= 0))):
        return
    hint = " (use `logprobs`)" if key == "n_probs" else ""
    raise Unsupported(f"`{key}` is not supported by this node{hint}: send {off:g} or leave it out", param=key)


def _max_tokens(out: dict) -> None:
    """`max_tokens: -1` (LM Studio's documented example), Jan's `max_output_tokens` and llama-server's
    `n_predict` (-1 = no limit)."""
    if "max_output_tokens" in out:  # Jan's "Max Output Tokens" assistant parameter
        value = out.pop("max_output_tokens")
        if value is not None and not (type(value) is int and (value == -1 or 1 <= value <= 1 << 24)):
            # (named as sent: mapped first, it was a 400 about a `max_tokens` Jan never sent; review r42)
            raise InvalidRequest(f"`max_output_tokens` must be an integer between 1 and {1 << 24} or -1 "
                                 f"(no limit), got {value!r}", param="max_output_tokens")
        if out.get("max_tokens") is None and out.get("max_completion_tokens") is None:
            out["max_tokens"] = value
    for key in ("max_tokens", "max_completion_tokens"):
        if out.get(key) == -1 and type(out[key]) is int:
            out[key] = None  # up to the context, as llama-server reads -1
    if "n_predict" not in out:
        return
    n = out.pop("n_predict")
    if n is None or (type(n) is int and n < 0):
        return
    if type(n) is not int or n == 0:
        raise InvalidRequest("`n_predict` must be a positive integer or -1 (no limit)", param="n_predict")
    if out.get("max_tokens") is None and out.get("max_completion_tokens") is None:
        out["max_tokens"] = n


def _logit_bias(value: Any) -> Any:
    """llama-server's list form, [[token id, bias or false]], as an OpenAI map (false bans the token)."""
    if not isinstance(value, list):
        return value
    out = {}
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and pair[0] >= 0
                and (pair[1] is False or _is_number(pair[1]))):
            raise InvalidRequest("`logit_bias` as a list must hold [token id, bias or false] pairs", param="logit_bias")
        out[str(pair[0])] = -100 if pair[1] is False else pair[1]
    return out


def predict_time_limit(body: dict) -> int | None:
    """llama-server's `t_max_predict_ms` (llama.vscode and llama.vim send it so a code completion
    stays short): None for 0 or absent, else a positive whole number of ms (CompletionRequest
    .predict_time_limit_ms)."""
    value = body.get("t_max_predict_ms")
    if value is None or value == 0:
        return None
    if not _is_number(value) or value < 0:
        raise InvalidRequest("`t_max_predict_ms` must be a number of milliseconds, 0 for no limit",
                             param="t_max_predict_ms")
    return max(1, int(value))


def _tell_once(keys: set[str]) -> None:
    new = keys - _told
    if new:
        _told.update(new)
        log.debug("DIAG: app fields taken with no effect fields=%s", ",".join(sorted(new)))


def _enable_thinking(out: dict, value: bool) -> None:
    """The template's enable_thinking, unless chat_template_kwargs sets it (that wins; a wrong one
    is its own 400)."""
    kwargs = out.get("chat_template_kwargs")
    if kwargs is None:
        out["chat_template_kwargs"] = {"enable_thinking": value}
    elif isinstance(kwargs, dict) and kwargs.get("enable_thinking") is None:
        out["chat_template_kwargs"] = {**kwargs, "enable_thinking": value}


def reasoning_excluded(body: dict) -> bool:
    """OpenRouter's `reasoning.exclude: true`: the reply leaves the thoughts out (checked in normalize)."""
    value = body.get("reasoning")
    return isinstance(value, dict) and value.get("exclude") is True


def _think(out: dict, kind: str) -> None:
    """Ollama's `think` (Open WebUI's "Think (Ollama)" parameter): true / false is the template's
    enable_thinking, "low" / "medium" / "high" (gpt-oss on Ollama) is reasoning_effort."""
    value = out.pop("think")
    if value is None:
        return
    if kind != "chat":
        raise InvalidRequest("`think` (Ollama's thinking switch) applies to chat: use /v1/chat/completions or "
                             "leave it out", param="think")
    if isinstance(value, bool):
        _enable_thinking(out, value)
        return
    if value in THINK_EFFORTS:
        if out.get("reasoning_effort") is None:
            out["reasoning_effort"] = value
        return
    raise InvalidRequest(f"`think` (Ollama's thinking switch; Open WebUI's \"Think (Ollama)\" parameter) must be "
                         f"true, false or one of {', '.join(THINK_EFFORTS)}, got {value!r}", param="think")


def _format(out: dict) -> None:
    """Ollama's `format` (Open WebUI's "Format" parameter, sent as typed): "json" is a JSON-object
    response_format, a JSON schema (an object, or its text) a json_schema one."""
    value = out.pop("format")
    if value is None or value == "":
        return
    if isinstance(value, str) and value.strip() == "json":
        wanted: dict = {"type": "json_object"}
    else:
        schema, why = value, ""
        if isinstance(value, str):
            try:  # as the body is parsed: a lone surrogate in it was a 500, deep nesting too (2026-12-07)
                schema = parse_json_text(value, "its text")
            except InvalidRequest as exc:
                schema, why = None, f" ({exc.message})"
        if not isinstance(schema, dict):
            raise InvalidRequest("`format` (Ollama's output format; Open WebUI's \"Format\" parameter) must be "
                                 f"\"json\" or a JSON schema object{why}: correct it in the app or leave it out",
                                 param="format")
        wanted = {"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}
    if out.get("response_format") is not None:
        raise InvalidRequest("give either `format` or `response_format`, not both", param="format")
    out["response_format"] = wanted


def _reasoning(out: dict, kind: str) -> None:
    """OpenRouter's `reasoning` {effort | max_tokens, enabled, exclude} as llama-server's fields;
    the explicit llama-server / OpenAI field wins where both are given."""
    value = out.pop("reasoning")
    if value is None:
        return
    if kind != "chat" or not isinstance(value, dict) or value.keys() - set(REASONING_KEYS):
        raise InvalidRequest("`reasoning` (OpenRouter's) must be an object of " + ", ".join(REASONING_KEYS)
                             + " on /v1/chat/completions: or send `reasoning_effort` instead", param="reasoning")
    effort, budget = value.get("effort"), value.get("max_tokens")
    enabled, exclude = value.get("enabled"), value.get("exclude")
    for key, ok in (("enabled", enabled is None or isinstance(enabled, bool)),
                    ("exclude", exclude is None or isinstance(exclude, bool)),
                    ("max_tokens", budget is None or (type(budget) is int and budget >= 0))):
        if not ok:
            raise InvalidRequest(f"`reasoning.{key}` must be " + ("a number of tokens" if key == "max_tokens"
                                 else "a boolean"), param=f"reasoning.{key}")
    # as `think`: on or off is the template's enable_thinking, which chat_template_kwargs' own wins
    # over (2026-12-07, review r35: enabled false was the effort "none", which beat it; enabled true
    # or a budget left a template that defaults to no thinking without any)
    # a budget of 0 is thinking off, as llama-server's reasoning budget 0 (2026-12-07, review r37: on)
    if enabled is False or effort == "none" or budget == 0:
        _enable_thinking(out, False)
        effort, budget = None, None
    elif enabled or budget is not None or effort not in (None, "none"):
        _enable_thinking(out, True)
    if effort is not None and out.get("reasoning_effort") is None:
        out["reasoning_effort"] = effort  # checked with the other hints (schemas._hints)
    if budget is not None and out.get("reasoning_budget_tokens") is None \
            and out.get("thinking_budget_tokens") is None:
        out["reasoning_budget_tokens"] = budget
    if exclude and out.get("reasoning_format") == "none":
        raise Unsupported("`reasoning.exclude` with `reasoning_format: \"none\"` cannot be honoured: the thoughts "
                          "would be in `content`; leave one out", param="reasoning.exclude")


def normalize(body: dict, kind: str = "chat") -> dict:
    """The body with the extras applied, mapped or dropped; a 400 for one that would change the output.
    `kind`: "chat" or "text" (/v1/completions, which has no template for `think`)."""
    out = dict(body)
    for key in _HINTS & out.keys():
        del out[key]
    apps = _APP_HINTS & out.keys()
    for key in apps:
        del out[key]
    _tell_once(apps)
    if "think" in out:
        _think(out, kind)
    if "format" in out:
        _format(out)
    if "reasoning" in out:
        _reasoning(out, kind)
    for key in _NEUTRAL.keys() & out.keys():
        _neutral(key, out.pop(key))
    _max_tokens(out)
    if "repetition_penalty" in out:  # vLLM's and text-generation-webui's name for llama.cpp's
        value = out.pop("repetition_penalty")
        if out.get("repeat_penalty") is None:
            out["repeat_penalty"] = value
    if "repeat_last_n" in out:
        n = out.pop("repeat_last_n")
        active = any(out.get(k) not in (None, off) for k, off in PENALTIES_OFF)
        if n is not None and n != PENALTY_LAST_N_TOKENS and active:
            raise Unsupported(f"`repeat_last_n` other than {PENALTY_LAST_N_TOKENS} is not supported: the penalties "
                              f"look back {PENALTY_LAST_N_TOKENS} tokens", param="repeat_last_n")
    if "json_schema" in out:  # llama-server's own field for a response schema
        schema = out.pop("json_schema")
        if schema is not None:
            if out.get("response_format") is not None:
                raise InvalidRequest("give either `json_schema` or `response_format`, not both", param="json_schema")
            if not isinstance(schema, dict):
                raise InvalidRequest("`json_schema` must be a JSON Schema object", param="json_schema")
            out["response_format"] = {"type": "json_schema", "json_schema": {"name": "json_schema", "schema": schema}}
    if "logit_bias" in out:
        out["logit_bias"] = _logit_bias(out["logit_bias"])
    if out.get("seed") == -1 and type(out["seed"]) is int:
        out["seed"] = None  # llama.cpp's "a random seed", not the fixed seed 2**32 - 1
    if body.keys() - out.keys():
        log.debug("DIAG: request extras taken extras=%s", ",".join(sorted(body.keys() - out.keys())))
    return out
