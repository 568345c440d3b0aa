"""Parse and validate OpenAI request bodies into `CompletionRequest`s; every problem is a clear 400.

Options that would change the output and cannot be honoured are refused, never silently ignored;
hints that change nothing here are accepted (`_IGNORED_OK`, `_hints`; llama-server's extras:
`api/extras.py`). A chat body's `messages` are parsed in `api/message_schemas.py`, its `tools` in
`api/tool_schemas.py`; an embeddings body in `api/embedding_schemas.py`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from node.api import chat_options, constraints, extras
from node.api.message_schemas import parse_messages
from node.api.tool_schemas import _tool_choice, _tools
from node.errors import InvalidRequest, Unsupported
from node.inference.request import CompletionRequest, ResponseFormat
from node.inference.sampling import MAX_TOP_LOGPROBS, SamplingParams

# OpenAI's API takes 4, but apps pointed at a local server send more: Continue sends its whole list
# (a dozen or more for autocomplete) to any host but api.openai.com, groq, Azure and Jan, and
# llama-server and vLLM take any number. Matching is the coordinator's (textstream), cheap per token.
MAX_STOP_SEQUENCES = 64

# Accepted and meaningless for a local model (no effect on output): documented, not refused.
_IGNORED_OK = {"user", "store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier", "verbosity"}
# OpenAI options this node cannot honour: refused with a 400 naming the parameter.
_UNSUPPORTED = {
    "functions": "the legacy `functions` parameter is not supported: use `tools`",
    "function_call": "the legacy `function_call` parameter is not supported: use `tool_choice`",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "best_of": "best_of is not supported",
    "echo": "echo is not supported",
    "suffix": "`suffix` (fill-in-the-middle) is taken by /v1/completions only",
    "web_search_options": "web search is not supported",
}
_COMMON = {
    "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty",
    "repeat_penalty", "n", "logit_bias", "response_format",
}
MAX_LOGIT_BIAS = 300  # entries, as OpenAI
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}
_COMMON_HINTS = {"reasoning_effort", "prediction"}
_CHAT_KEYS = _COMMON | _COMMON_HINTS | chat_options.KEYS | {"messages", "tools", "tool_choice", "parallel_tool_calls",
                                                            "logprobs", "top_logprobs"}
_COMPLETION_KEYS = _COMMON | _COMMON_HINTS | {"prompt", "logprobs", "suffix"}
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions API's limit
# OpenAI's `n` (choices for one prompt; node.inference.choices): llama-server caps it at its slots
# (--parallel); 16 here, each choice a sequence of the model's batch or a run of the chain
MAX_CHOICES = 16
MIN_REPEAT_PENALTY = 1e-6  # a logit of 1e4 divided by it still fits a float32


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"`{key}` must be a number, got {type(value).__name__}", param=key)
    if not lo <= value <= hi:
        raise InvalidRequest(f"`{key}` must be between {lo:g} and {hi:g}, got {value}", param=key)
    return float(value)


def _repeat_penalty(body: dict) -> float:
    """llama.cpp's repeat_penalty, at least MIN_REPEAT_PENALTY: it divides a repeated token's positive
    logit and multiplies a negative one, so 0 (or 5e-324, 0 as the engine's float32) made infinities and
    NaN (-inf * 0: a token the grammar had masked, picked anyway and the request a 500 "sampled outside
    the grammar"). vLLM's repetition_penalty must be > 0 too."""
    value = _number(body, "repeat_penalty", 1.0, 0.0, 10.0)
    if value < MIN_REPEAT_PENALTY:
        raise InvalidRequest(f"`repeat_penalty` must be greater than 0 (at least {MIN_REPEAT_PENALTY:g}; 1 is off, "
                             f"above 1 penalizes repeats), got {value:g}", param="repeat_penalty")
    return value


def _integer(body: dict, key: str, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"`{key}` must be an integer, got {type(value).__name__}", param=key)
    if not lo <= value <= hi:
        raise InvalidRequest(f"`{key}` must be between {lo} and {hi}, got {value}", param=key)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest("`stop` must be a string or a list of strings", param="stop")
    if len(value) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(f"`stop` accepts at most {MAX_STOP_SEQUENCES} sequences", param="stop")
    return tuple(s for s in value if s)


def _logprobs(body: dict, kind: str) -> int | None:
    """SamplingParams.logprobs: None (off), or how many of the most likely tokens to report too.
    Chat: `logprobs` (bool) and `top_logprobs` (0-20, only with logprobs true); completions:
    `logprobs` (0-5)."""
    if kind == "text":
        return _integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    on = body.get("logprobs")
    if on is not None and not isinstance(on, bool):
        raise InvalidRequest(f"`logprobs` must be a boolean, got {type(on).__name__}", param="logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not on:
        raise InvalidRequest("`top_logprobs` is only allowed when `logprobs` is true", param="top_logprobs")
    return (top or 0) if on else None


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    """OpenAI `logit_bias`: {"token id": bias in -100..100}; ids are checked against the vocabulary
    when the model is known (CompletionRun.prepare)."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidRequest("`logit_bias` must be an object mapping token ids (as strings) to a bias",
                             param="logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"`logit_bias` has {len(value)} entries; at most {MAX_LOGIT_BIAS} are allowed",
                             param="logit_bias")
    out = []
    for key, bias in value.items():
        if not isinstance(key, str) or not key.isdigit() or not key.isascii() or len(key) > 12:
            raise InvalidRequest(f"`logit_bias` keys must be token ids written as non-negative integers, got {key!r}",
                                 param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not math.isfinite(bias) \
                or not -100 <= bias <= 100:
            raise InvalidRequest(f"`logit_bias[{key}]` must be a number between -100 and 100, got {bias!r}",
                                 param="logit_bias")
        out.append((int(key), float(bias)))
    return tuple(sorted(out))


def _response_format(body: dict) -> ResponseFormat | None:
    """OpenAI `response_format`: {"type": "text"} | {"type": "json_object"} |
    {"type": "json_schema", "json_schema": {"name", "schema"?, "strict"?, "description"?}}."""
    value = body.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("`response_format` must be an object", param="response_format")
    kind = value.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise InvalidRequest(f"`response_format.type` must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, got {kind!r}",
                             param="response_format.type")
    extra = set(value) - {"type", "json_schema"}
    if extra:
        raise InvalidRequest(f"unrecognized `response_format` field: {sorted(extra)[0]}", param="response_format")
    if kind != "json_schema":
        if "json_schema" in value:
            raise InvalidRequest("`response_format.json_schema` is only allowed with type \"json_schema\"",
                                 param="response_format.json_schema")
        return None if kind == "text" else ResponseFormat("json_object")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequest("`response_format.json_schema` is required with type \"json_schema\" and must be "
                             "an object", param="response_format.json_schema")
    extra = set(spec) - _JSON_SCHEMA_KEYS
    if extra:
        raise InvalidRequest(f"unrecognized `response_format.json_schema` field: {sorted(extra)[0]}",
                             param="response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or not all(c.isalnum() or c in "_-" for c in name):
        raise InvalidRequest("`response_format.json_schema.name` is required: letters, digits, _ and -, at most "
                             "64 characters", param="response_format.json_schema.name")
    schema = spec.get("schema", {})
    if schema is None:
        schema = {}
    if not isinstance(schema, dict):
        raise InvalidRequest("`response_format.json_schema.schema` must be a JSON Schema object",
                             param="response_format.json_schema.schema")
    strict = spec.get("strict", False)
    if strict is None:
        strict = False
    if not isinstance(strict, bool):
        raise InvalidRequest("`response_format.json_schema.strict` must be a boolean",
                             param="response_format.json_schema.strict")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest("`response_format.json_schema.description` must be a string",
                             param="response_format.json_schema.description")
    return ResponseFormat("json_schema", schema=schema, name=name, strict=strict)


# the value an unsupported option has when it asks for nothing (older LangChain sends best_of: 1)
_NEUTRAL = {"best_of": 1, "suffix": "", "modalities": ["text"]}
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def _hints(body: dict) -> None:
    """OpenAI options that only steer speed or effort: accepted (shape checked), no effect here.
    `reasoning_effort` (Open WebUI, LiteLLM, aider send it): "none" turns a reasoning model's thinking
    off, another effort reaches the chat template (chat_options.template_kwargs); `prediction` (predicted outputs, aider and Continue's edits)
    only makes OpenAI's reply faster, never different."""
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise InvalidRequest(f"`reasoning_effort` must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}",
                             param="reasoning_effort")
    prediction = body.get("prediction")
    if prediction is not None and not (isinstance(prediction, dict) and prediction.get("type") == "content"
                                       and isinstance(prediction.get("content"), str | list)):
        raise InvalidRequest("`prediction` must be {\"type\": \"content\", \"content\": ...}", param="prediction")


def _check_keys(body: dict, allowed: set[str]) -> None:
    for key in body:
        if key in _UNSUPPORTED and key not in allowed:
            value = body[key]
            if value in (None, [], {}, False) or (key in _NEUTRAL and type(value) is type(_NEUTRAL[key])
                                                  and value == _NEUTRAL[key]):
                continue  # explicit "none" values are harmless
            raise Unsupported(_UNSUPPORTED[key], param=key)
        if key not in allowed and key not in _IGNORED_OK:
            raise InvalidRequest(f"unrecognized request argument supplied: {key}", param=key)


def parse_completion(body: Any, kind: str) -> CompletionRequest:
    """Validate a /v1/chat/completions (kind="chat") or /v1/completions (kind="text") body."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    time_limit = extras.predict_time_limit(body)
    sent, body = body, extras.normalize(body, kind)
    constraint = constraints.pop_output_constraint(body, sent)
    ignore_eos, min_tokens = constraints.pop_eos_options(body)
    _check_keys(body, _CHAT_KEYS if kind == "chat" else _COMPLETION_KEYS)
    _hints(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("`model` is required and must be a string", param="model")
    n = _integer(body, "n", 1, MAX_CHOICES) or 1
    stream = body.get("stream")
    stream = False if stream is None else stream  # null is the default, as OpenAI takes it
    if not isinstance(stream, bool):
        raise InvalidRequest("`stream` must be a boolean", param="stream")
    stream_options = body.get("stream_options")
    stream_options = {} if stream_options is None else stream_options
    if not isinstance(stream_options, dict):
        raise InvalidRequest("`stream_options` must be an object", param="stream_options")
    if stream_options and not stream:
        raise InvalidRequest("`stream_options` is only allowed when `stream` is true", param="stream_options")
    include_usage = stream_options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise InvalidRequest("`stream_options.include_usage` must be a boolean", param="stream_options")
    max_tokens = _integer(body, "max_completion_tokens", 1, 1 << 24)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1, 1 << 24)
    if max_tokens is not None and min_tokens > max_tokens:  # (vLLM's 400 too)
        raise InvalidRequest(f"`min_tokens` ({min_tokens}) must not exceed `max_tokens` ({max_tokens})",
                             param="min_tokens")
    seed = _integer(body, "seed", -(2**63), 2**64 - 1)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=int(_integer(body, "top_k", 0, 1 << 20) or 0),
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        seed=None if seed is None else seed % 2**32,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repeat_penalty=_repeat_penalty(body),
        stop=_stop(body),
        logprobs=_logprobs(body, kind),
        logit_bias=_logit_bias(body),
        ignore_eos=ignore_eos,
        min_tokens=min_tokens,
    )
    response_format = _response_format(body) if constraint is None else constraint
    if constraint is None and response_format is not None and sent.get("response_format") is None:
        # llama-server's `json_schema` or Ollama's `format`, made a response_format by extras: a schema the
        # compiler refuses is a 400 naming the field the client sent (it named `response_format`)
        sent_as = next((k for k in constraints.RESPONSE_FIELDS if sent.get(k) not in (None, "")), "response_format")
        response_format = dataclasses.replace(response_format, param=sent_as)
    if kind == "chat":
        tools = _tools(body)
        choice, choice_name = _tool_choice(body, tools)
        if constraint is not None and constraint.type in ("grammar", "regex", "choice") and tools \
                and choice != "none":
            raise Unsupported(f"`{constraint.param}` beside `tools` is not supported: a reply that calls a tool "
                              "cannot match it; send tool_choice \"none\" or leave one out", param=constraint.param)
        parallel = body.get("parallel_tool_calls", True)
        if parallel is None:
            parallel = True
        if not isinstance(parallel, bool):
            raise InvalidRequest("`parallel_tool_calls` must be a boolean", param="parallel_tool_calls")
        return CompletionRequest("chat", model, stream, include_usage, params, messages=parse_messages(body), n=n,
                                 tools=tools, tool_choice=choice, tool_choice_name=choice_name,
                                 parallel_tool_calls=parallel, response_format=response_format,
                                 predict_time_limit_ms=time_limit,
                                 reasoning_format=chat_options.reasoning_format(body),
                                 reasoning_budget=chat_options.reasoning_budget(body),
                                 template_kwargs=chat_options.template_kwargs(body))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        if isinstance(prompt, list):
            raise Unsupported("`prompt` must be a single string (batched or token prompts are not supported)",
                              param="prompt")
        raise InvalidRequest("`prompt` is required and must be a string", param="prompt")
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise InvalidRequest("`suffix` must be a string", param="suffix")
    return CompletionRequest("text", model, stream, include_usage, params, prompt=prompt, n=n,
                             suffix=suffix or None,  # "" asks for nothing (OpenAI's default)
                             response_format=response_format, predict_time_limit_ms=time_limit)
