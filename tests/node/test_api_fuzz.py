"""Hypothesis-generated request bodies against a live node: never a 5xx, never a hang, and the node
healthy afterwards.

Bodies start from a valid request for each endpoint and get one to three mutations: a field set to
a value of another type, huge and negative numbers (integers past any limit, 5000-digit literals,
1e999), NaN / Infinity literals, deep nesting, megabyte strings, invalid UTF-8, lone surrogates,
duplicate keys, unknown keys, a truncated body. They are written as raw bytes (json.dumps could not
write most of them). Every answer must be a 2xx, or a 4xx in the route's error shape (OpenAI's; on
/v1/messages Anthropic's; on Ollama's /api/... its `{"error": "..."}`), within the deadline; afterwards the
node still answers a chat completion, nothing is left in flight and its log holds no traceback.

The plausible values cover the request fields of the OpenAI-compatible servers (n up to past the cap of
16 and the model's max_concurrent, llama-server's GBNF `grammar`, vLLM's guided_* and
structured_outputs, ignore_eos, min_tokens, json_schema and response_format schemas with numbers and
date-times, reasoning_effort, logprobs with n > 1, streamed choices), Ollama's /api/chat, /api/generate,
/api/embed and /api/show (options, think, format, keep_alive) and Anthropic's /v1/messages (thinking,
output_format, tools, tool_choice, stop_sequences, metadata).
"""

from __future__ import annotations

import http.client
import json
import os
import time

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.nodes import tiny_model
from tests.support.processes import NodeProcess

pytestmark = [pytest.mark.llama, pytest.mark.slow]

DEADLINE_S = 60.0
EXAMPLES = int(os.environ.get("API_FUZZ_EXAMPLES", "250"))  # more for a long local run
MB_STRING = json.dumps("x" * 1_000_000)
DEEP = "[" * 50_000 + "]" * 50_000
DEEP_OBJECT = '{"a":' * 20_000 + "1" + "}" * 20_000
RAW_SPECIALS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "-0", "9" * 5000, "-" + "9" * 5000,
                "18446744073709551616", "-9223372036854775809", "1.7976931348623157e308", "0.1e-400",
                '"\\ud800"', '"\\udfff\\ud800"', '"\\u0000"', "true", "null", "[]", "{}", '""', DEEP, DEEP_OBJECT,
                MB_STRING, '{"type": "json_schema"}', '[{"role": "user"}]', '[{"role": "tool", "content": 1}]']


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    model = tiny_model(base)
    proc = NodeProcess(base / "data", args=["--model", str(model), "--no-default-model", "--no-mdns",
                                            "--n-threads", "1"])
    try:
        proc.wait_ready(90)
        status, body = _request(proc, "GET", "/v1/models")
        proc.model_id = json.loads(body)["data"][0]["id"]
        yield proc
    finally:
        proc.terminate()


def _request(proc, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
             *, auth: bool = True) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=DEADLINE_S)
    try:
        hdrs = {"Authorization": f"Bearer {proc.api_key}"} if auth else {}
        if body is not None:
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read()  # a stream is read to its end: a hang fails on the timeout
    finally:
        conn.close()


def _status(proc, method, path) -> int | None:
    try:
        return _request(proc, method, path)[0]
    except OSError:
        return None


def _encode(pairs: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs) + "}"


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
raw_values = st.one_of(json_values.map(json.dumps), st.sampled_from(RAW_SPECIALS))

# Values of the right type, edge values included: these bodies reach the engine.
GRAMMARS = ['root ::= "yes" | "no"', 'root ::= [a-z]+', 'root ::= "a" root | "b"', 'root ::= ( "x" | "y" ){2,5}',
            "root ::= ", "root ::= \"unterminated", "junk", "root ::= undefined-rule", "root ::= [z-a]",
            "root ::= " + " | ".join(f'"w{i}"' for i in range(3000)), 'root ::= ' + "(" * 500 + '"a"' + ")" * 500,
            "x" * 100_000]
NUMBER_SCHEMA = {"type": "object", "properties": {
    "n": {"type": "number"}, "i": {"type": "integer", "minimum": -5, "maximum": 10**30},
    "f": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.25}, "when": {"type": "string", "format": "date-time"},
    "day": {"type": "string", "format": "date"}}, "required": ["n", "when"]}
schemas = st.one_of(
    st.sampled_from([NUMBER_SCHEMA, {"type": "object"}, {"type": "array", "items": {"type": "number"}, "maxItems": 3},
                     {"type": "string", "format": "date-time"}, {"type": "integer"}, {"type": "number", "minimum": 1e300},
                     {"enum": ["a", 1, None]}, {"type": "string", "pattern": "^[a-c]{1,3}$"}, {}, {"type": "nonsense"},
                     {"$ref": "#/nope"}, {"type": "number", "multipleOf": 1e-9}]),
    st.builds(lambda props, req: {"type": "object", "properties": props, "required": req},
              st.dictionaries(st.text(max_size=6), st.sampled_from([{"type": "number"}, {"type": "integer"},
                              {"type": "string", "format": "date-time"}, {"type": "boolean"}]), max_size=4),
              st.lists(st.text(max_size=6), max_size=2)))
regexes = st.sampled_from(["yes|no", "[0-9]{1,4}", "(a|b)*c", "\\d+-\\d+", "(", "[", "a{99999}", ".*", "", "\\"])
choices = st.one_of(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=5),
                    st.sampled_from([[], [""], ["a"] * 2000]))
grammars = st.sampled_from(GRAMMARS)
efforts = st.sampled_from(["none", "minimal", "low", "medium", "high", "max", "xhigh", "", "HIGH"])
tool = {"type": "function", "function": {"name": "get_weather", "description": "weather",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
PLAUSIBLE = {
    "max_tokens": st.integers(1, 300), "max_completion_tokens": st.integers(1, 300),
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "min_p": st.floats(0, 1), "top_k": st.integers(0, 1000),
    "seed": st.integers(-(2**63), 2**64 - 1), "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2), "repeat_penalty": st.floats(0, 10),
    "n": st.one_of(st.integers(1, 4), st.integers(1, 20)),  # the fuzz node's max_concurrent is 4, the cap 16
    "stream": st.booleans(), "stream_options": st.just({"include_usage": True}),
    "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=4)),
    "user": st.text(max_size=20), "prompt": st.text(max_size=200),
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "developer"]),
                                                "content": st.text(max_size=100)}), min_size=1, max_size=4),
    "grammar": grammars, "guided_grammar": grammars, "guided_json": schemas, "guided_regex": regexes,
    "guided_choice": choices, "json_schema": schemas,
    "structured_outputs": st.one_of(st.builds(lambda s: {"json": s}, schemas), st.builds(lambda r: {"regex": r}, regexes),
                                    st.builds(lambda c: {"choice": c}, choices),
                                    st.builds(lambda g: {"grammar": g}, grammars),
                                    st.just({"json": {"type": "object"}, "regex": "a"})),
    "response_format": st.one_of(st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
                                 st.builds(lambda s, strict: {"type": "json_schema", "json_schema": {
                                     "name": "out", "schema": s, "strict": strict}}, schemas, st.booleans())),
    "ignore_eos": st.booleans(), "min_tokens": st.integers(0, 400), "reasoning_effort": efforts,
    "logprobs": st.booleans(), "top_logprobs": st.integers(0, 25),
    "tools": st.just([tool]), "tool_choice": st.sampled_from(["auto", "none", "required",
                                                             {"type": "function", "function": {"name": "get_weather"}}]),
}
CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
               "seed", "stop", "stream", "stream_options", "presence_penalty", "frequency_penalty",
               "repeat_penalty", "n", "user", "tools", "tool_choice", "response_format", "logprobs", "logit_bias",
               "grammar", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
               "ignore_eos", "min_tokens", "json_schema", "reasoning_effort", "top_logprobs"]
TEXT_FIELDS = [f if f != "messages" else "prompt" for f in CHAT_FIELDS
               if f not in ("tools", "tool_choice", "reasoning_effort", "top_logprobs")]
# Ollama's: integer options arrive as floats from some clients (3.0), think is a bool or an effort
OLLAMA_OPTIONS = st.fixed_dictionaries({}, optional={
    "num_predict": st.one_of(st.integers(-2, 64), st.floats(-2, 64)), "temperature": st.floats(0, 2),
    "top_k": st.one_of(st.integers(0, 100), st.floats(0, 100)), "top_p": st.floats(0, 1), "min_p": st.floats(0, 1),
    "seed": st.one_of(st.integers(-(2**31), 2**32), st.floats(-1e6, 1e6)), "num_ctx": st.one_of(
        st.integers(1, 100_000), st.floats(1, 1e5)), "repeat_penalty": st.floats(0, 3), "repeat_last_n": st.integers(-1, 128),
    "stop": st.lists(st.text(max_size=4), max_size=3), "mirostat": st.sampled_from([0, 1, 2, 0.0]),
    "num_thread": st.integers(0, 4), "num_keep": st.integers(-1, 10), "tfs_z": st.floats(0, 2),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2), "typical_p": st.floats(0, 1)})
OLLAMA_PLAUSIBLE = {
    "options": OLLAMA_OPTIONS, "stream": st.booleans(), "raw": st.booleans(),
    "think": st.sampled_from([True, False, "low", "medium", "high", "max", "none", ""]),
    "format": st.one_of(st.just("json"), st.just(""), schemas),
    "keep_alive": st.one_of(st.sampled_from(["5m", "0", "-1", "1h30m", "forever", "", "10"]), st.integers(-1, 3600),
                            st.floats(-1, 1e9)),
    "messages": PLAUSIBLE["messages"], "prompt": st.text(max_size=100), "system": st.text(max_size=40),
    "input": st.one_of(st.text(max_size=50), st.lists(st.text(max_size=20), max_size=3)), "truncate": st.booleans(),
    "dimensions": st.integers(0, 4096), "verbose": st.booleans(), "tools": st.just([tool]),
}
OLLAMA_CHAT_FIELDS = ["model", "messages", "options", "stream", "think", "format", "keep_alive", "tools"]
OLLAMA_GENERATE_FIELDS = ["model", "prompt", "system", "options", "stream", "raw", "think", "format", "keep_alive",
                          "suffix", "template", "context", "images"]
OLLAMA_EMBED_FIELDS = ["model", "input", "truncate", "dimensions", "options", "keep_alive"]
OLLAMA_SHOW_FIELDS = ["model", "name", "verbose"]
anthropic_tool = {"name": "get_weather", "description": "weather",
                  "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
MESSAGES_PLAUSIBLE = {
    "max_tokens": st.integers(1, 64), "temperature": st.floats(0, 1), "top_p": st.floats(0, 1),
    "top_k": st.integers(0, 500), "stream": st.booleans(),
    "stop_sequences": st.lists(st.text(max_size=5), max_size=4), "system": st.text(max_size=40),
    "metadata": st.one_of(st.just({}), st.builds(lambda u: {"user_id": u}, st.text(max_size=20))),
    "thinking": st.one_of(st.just({"type": "disabled"}), st.just({"type": "adaptive"}),
                          st.builds(lambda b: {"type": "enabled", "budget_tokens": b}, st.integers(0, 4096))),
    "output_format": st.builds(lambda s: {"type": "json_schema", "schema": s}, schemas),
    "output_config": st.one_of(st.builds(lambda e: {"effort": e}, efforts),
                               st.builds(lambda s: {"format": {"type": "json_schema", "schema": s}}, schemas)),
    "tools": st.just([anthropic_tool]),
    "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"},
                                    {"type": "tool", "name": "get_weather"}, {"type": "tool", "name": "nope"},
                                    {"type": "auto", "disable_parallel_tool_use": True}]),
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                                "content": st.text(min_size=1, max_size=60)}), min_size=1, max_size=3),
}
MESSAGES_FIELDS = ["model", "messages", "max_tokens", "temperature", "top_p", "top_k", "stream", "stop_sequences",
                   "system", "metadata", "thinking", "output_format", "output_config", "tools", "tool_choice"]
DOWNLOAD_FIELDS = ["url", "sha256", "filename"]


@st.composite
def mutated(draw, template: list[tuple[str, str]], fields: list[str], plausible_values: dict | None = None) -> bytes:
    plausible = plausible_values or PLAUSIBLE  # the route's right-typed values
    pairs = list(template)
    gentle = any(f in plausible for f in fields) and draw(st.integers(0, 2)) == 0  # a third: right types
    # only, so the engine runs them
    for _ in range(draw(st.integers(1, 3))):
        kind = "set" if gentle else draw(st.sampled_from(["set", "set", "set", "unknown", "duplicate", "drop",
                                                            "message"]))
        key = draw(st.sampled_from([f for f in fields if f in plausible] if gentle else fields))
        if kind == "set":
            right_type = gentle or (key in plausible and draw(st.booleans()))
            value = json.dumps(draw(plausible[key])) if right_type else draw(raw_values)
            pairs = [(k, v) for k, v in pairs if k != key] + [(key, value)]
        elif kind == "unknown":
            pairs.append((draw(st.text(min_size=1, max_size=12)), draw(raw_values)))
        elif kind == "duplicate":
            pairs.insert(0, (key, draw(raw_values)))
        elif kind == "drop" and pairs:
            pairs.pop(draw(st.integers(0, len(pairs) - 1)))
        elif kind == "message":
            msg = _encode([("role", draw(raw_values)), ("content", draw(raw_values))])
            pairs = [(k, v) for k, v in pairs if k != "messages"] + [("messages", f"[{msg}]")]
    raw = _encode(pairs).encode("utf-8", errors="surrogatepass")
    damage = "none" if gentle else draw(st.sampled_from(["none", "none", "none", "utf8", "truncate", "prefix"]))
    if damage == "utf8":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\xfe\xff"])) + raw[at:]
    elif damage == "truncate":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    elif damage == "prefix":
        raw = draw(st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b" \n\t", b"[", b"//"])) + raw
    return raw


def _shape(path: str) -> str:
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "ollama" if path.startswith("/api/") and not path.startswith("/api/admin") else "openai"


def _check(status: int, body: bytes, what: str, *, in_hypothesis: bool = True, shape: str = "openai") -> None:
    """A 2xx, or a 4xx with the error in the route's shape."""
    if in_hypothesis:
        event(f"status {status}")  # --hypothesis-show-statistics shows how many bodies were valid
    assert status < 500, f"{what}: {status} {body[:300]!r}"
    if status >= 400:
        answer = json.loads(body)
        if shape == "ollama":  # Ollama's clients read the string
            assert set(answer) == {"error"} and isinstance(answer["error"], str) and answer["error"], body[:300]
            return
        if shape == "anthropic":
            assert answer["type"] == "error", body[:300]
        err = answer["error"]
        assert isinstance(err["message"], str) and isinstance(err["type"], str), body[:300]


def _templates(model_id: str):
    small = [("max_tokens", "4"), ("temperature", "0")]
    return {
        "/v1/chat/completions": ([("model", json.dumps(model_id)),
                                  ("messages", '[{"role": "user", "content": "hi"}]'), *small], CHAT_FIELDS),
        "/v1/completions": ([("model", json.dumps(model_id)), ("prompt", '"once upon"'), *small], TEXT_FIELDS),
        "/api/admin/models/download": ([("url", '"http://127.0.0.1:9/x.gguf"')], DOWNLOAD_FIELDS),
        "/v1/messages": ([("model", json.dumps(model_id)), ("messages", '[{"role": "user", "content": "hi"}]'),
                          ("max_tokens", "4"), ("temperature", "0")], MESSAGES_FIELDS, MESSAGES_PLAUSIBLE),
        "/v1/messages/count_tokens": ([("model", json.dumps(model_id)),
                                       ("messages", '[{"role": "user", "content": "hi"}]')], MESSAGES_FIELDS,
                                      MESSAGES_PLAUSIBLE),
        "/api/chat": ([("model", json.dumps(model_id)), ("messages", '[{"role": "user", "content": "hi"}]'),
                       ("stream", "false"), ("options", '{"num_predict": 4, "temperature": 0}')],
                      OLLAMA_CHAT_FIELDS, OLLAMA_PLAUSIBLE),
        "/api/generate": ([("model", json.dumps(model_id)), ("prompt", '"once upon"'), ("stream", "false"),
                           ("options", '{"num_predict": 4.0}')], OLLAMA_GENERATE_FIELDS, OLLAMA_PLAUSIBLE),
        "/api/embed": ([("model", json.dumps(model_id)), ("input", '"hello"')], OLLAMA_EMBED_FIELDS, OLLAMA_PLAUSIBLE),
        "/api/show": ([("model", json.dumps(model_id))], OLLAMA_SHOW_FIELDS, OLLAMA_PLAUSIBLE),
    }


@pytest.mark.parametrize("body", [
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "model": ' + b"9" * 5000 + b"}",
    b'{"model": "MODEL", "prompt": "\\ud800", "max_tokens": 4}',
    b'{"model": "MODEL", "messages": [{"role": "user", "content": "a\\udfff"}]}',
    b'{"model": "MODEL", "prompt": "x", "max_tokens": 4, "stop": ["\\ud800"]}',
    b'{"model": "MODEL", "prompt": "x", "max_tokens": 4, "logit_bias": {"' + b"1" * 4400 + b'": 1}}',
    b'{"model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "user": NaN}',
    b'{"model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "metadata": {"a": 1e999}}',
    b'{"model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "guided_grammar": "root ::= '
    + b" | ".join(b'\\"w%d\\"' % i for i in range(3000)) + b'"}',
    b'{"model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 1, '
    b'"repeat_penalty": 0.0, "grammar": "root ::= \\"yes\\" | \\"no\\""}',
], ids=["5000-digit-int", "lone-surrogate-prompt", "lone-surrogate-content", "lone-surrogate-stop",
        "4400-digit-logit-bias-key", "nan-literal", "overflowing-float", "3000-alternatives-grammar",
        "repeat-penalty-0-with-grammar"])
def test_bodies_the_fuzzer_found(node, body):
    """Each was a 500 once (a ValueError past the integer digit limit; a UnicodeEncodeError in the
    tokenizer; llguidance's parser past its 2,000 items a row on a grammar's 3,000 alternatives; a
    repeat_penalty of 0 making NaN of a token the grammar masked) or an answer that was not JSON (a NaN
    echoed back): now a 400 naming the problem."""
    path = "/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"
    status, answer = _request(node, "POST", path, body.replace(b"MODEL", node.model_id.encode()))
    assert status == 400, answer
    _check(status, answer, path, in_hypothesis=False)


@given(data=st.data())
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_bodies_never_5xx_never_hang(node, data):
    path = data.draw(st.sampled_from(["/v1/chat/completions", "/v1/chat/completions", "/v1/completions",
                                      "/api/admin/models/download", "/v1/messages", "/v1/messages/count_tokens",
                                      "/api/chat", "/api/generate", "/api/embed", "/api/show"]), label="path")
    template, fields, *plausible_values = _templates(node.model_id)[path]
    body = data.draw(mutated(template, fields, *plausible_values), label="body")
    status, answer = _request(node, "POST", path, body)
    event(f"{path} {status}")
    _check(status, answer, f"POST {path} {body[:200]!r}", shape=_shape(path))


COMBINED = {  # route: (its required fields, the right-typed ones drawn together)
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "hi"}]}, PLAUSIBLE, CHAT_FIELDS),
    "/v1/completions": ({"prompt": "once upon"}, PLAUSIBLE, TEXT_FIELDS),
    "/v1/messages": ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, MESSAGES_PLAUSIBLE,
                     MESSAGES_FIELDS),
    "/api/chat": ({"messages": [{"role": "user", "content": "hi"}]}, OLLAMA_PLAUSIBLE, OLLAMA_CHAT_FIELDS),
    "/api/generate": ({"prompt": "once upon"}, OLLAMA_PLAUSIBLE, OLLAMA_GENERATE_FIELDS),
}


@given(data=st.data())
@settings(max_examples=max(30, EXAMPLES // 5), deadline=None, suppress_health_check=list(HealthCheck))
def test_right_typed_fields_together_never_5xx(node, data):
    """Several right-typed fields at once (n with stream and logprobs, a grammar with min_tokens, think
    with a format and options), which one to three mutations of a template seldom draw."""
    path = data.draw(st.sampled_from(sorted(COMBINED)), label="path")
    required, plausible, fields = COMBINED[path]
    names = [f for f in fields if f in plausible and f not in required and f not in ("max_tokens", "prompt")]
    body = {"model": node.model_id, **required, "max_tokens": 4, "temperature": 0}
    if path.startswith("/api/"):
        body = {"model": node.model_id, **required, "options": {"num_predict": 4}}
    for name in data.draw(st.lists(st.sampled_from(names), min_size=2, max_size=6, unique=True), label="fields"):
        body[name] = data.draw(plausible[name], label=name)
    raw = json.dumps(body).encode()
    status, answer = _request(node, "POST", path, raw)
    event(f"{path} {status}")
    _check(status, answer, f"POST {path} {raw[:300]!r}", shape=_shape(path))


paths = st.one_of(
    st.sampled_from(["/v1/models", "/health", "/health/ready", "/metrics", "/api/admin/stats", "/api/admin/peers",
                     "/api/admin/requests", "/api/admin/models", "/api/admin/downloads", "/api/admin/diagnostics",
                     "/api/tags", "/api/ps", "/api/version", "/api/show", "/api/chat", "/v1/messages",
                     "/v1/messages/count_tokens"]),
    st.builds(lambda p, x: p + x, st.sampled_from(["/v1/models/", "/api/admin/downloads/", "/api/admin/models/"]),
              st.text(st.characters(codec="utf-8", exclude_characters="?#"), max_size=40).map(
                  lambda s: "".join(c if c.isascii() and c.isalnum() else f"%{ord(c) % 256:02X}" for c in s))),
)


@given(path=paths, query=st.sampled_from(["", "?full=1", "?full=yes&x=%ff", "?force=1", "?" + "a=b&" * 200]),
       method=st.sampled_from(["GET", "GET", "POST", "PUT", "DELETE"]))
@settings(max_examples=max(120, EXAMPLES // 2), deadline=None, suppress_health_check=list(HealthCheck))
def test_every_endpoint_answers_in_the_openai_shape(node, path, query, method):
    status, answer = _request(node, method, path + query, b"" if method != "GET" else None)
    _check(status, answer, f"{method} {path}{query}", shape=_shape(path))


@given(action=st.sampled_from(["load", "unload", "unload?force=1"]))
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
def test_load_and_unload_by_fuzzed_names(node, action):
    for name in (node.model_id, node.model_id[:6], "../../etc/passwd", "%00", "x" * 5000):
        status, answer = _request(node, "POST", f"/api/admin/models/{name}/{action}", b"")
        _check(status, answer, f"{action} {name[:40]}", in_hypothesis=False)


def test_a_body_that_is_not_in_its_content_encoding_is_a_400(node):
    body = json.dumps({"model": node.model_id, "prompt": "x", "max_tokens": 2}).encode()
    status, answer = _request(node, "POST", "/v1/completions", body, {"Content-Encoding": "gzip"})
    assert status == 400 and b"could not be read" in answer, answer  # was a 500 (and then a logged traceback:
    # aiohttp drained the rest of the body after the answer; the test below finds none in the log)
    _check(status, answer, "gzip", in_hypothesis=False)


def test_the_node_is_healthy_after_the_fuzzing(node):
    """Runs after the fuzz tests (file order): still serving, nothing in flight, no traceback."""
    assert _request(node, "GET", "/health")[0] == 200
    status, body = _request(node, "POST", "/v1/chat/completions", json.dumps(
        {"model": node.model_id, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 4}).encode())
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["role"] == "assistant"
    deadline = time.monotonic() + 30
    while True:
        stats = json.loads(_request(node, "GET", "/api/admin/stats")[1])
        if stats["in_flight"] == {"traces": 0, "pipelines": 0}:
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)
    assert node.proc.poll() is None
    log = (node.data_dir / "node.log").read_text(errors="replace")
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]

