"""Structured output (response_format) and logit_bias through the official `openai` SDK against real
nodes: the local route (the default model, a tiny random model) and the distributed route (a random
model split over two node processes). Every reply is parsed and validated against its schema."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings

from node.inference.synth import SynthSpec, write_gguf
from node.resources import default_model_path
from tests.pipeline.swarm import SPLIT, start_slice_node, wait_for_route, wait_peers
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.schemas import bounded_schemas, max_bytes

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

# the random model for the property test: a context that fits the longest reply any schema allows
ROOMY = SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=4096, name="roomy")
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0,
                                                                          "maximum": 120},
                   "languages": {"type": "array", "items": {"enum": ["python", "c", "rust"]}, "maxItems": 3}},
    "required": ["name", "age"], "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a programmer as JSON."}]


def fmt(schema: dict, name: str = "reply") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("structured")
    models = [tiny_model(base), tiny_model(base, ROOMY, "roomy.gguf")]
    async with running_node(node_config(base / "data", *models,
                                        include_default_model=default_model_path().exists())) as n:
        yield n


@pytest.fixture
def client(node):
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key, max_retries=0)


def model_named(node, name: str):
    for served in node.models.all():
        if served.entry.name == name:
            return served
    pytest.skip(f"model {name} is not in this checkout")


async def complete(client, model: str, response_format: dict | None, *, stream: bool, max_tokens: int = 200,
                   temperature: float = 0.0, seed: int = 1, messages=MESSAGES, **extra) -> tuple[str, str]:
    """(text, finish_reason) of one chat completion, streamed or not."""
    kwargs = dict(model=model, messages=messages, max_tokens=max_tokens, temperature=temperature, seed=seed, **extra)
    if response_format is not None:
        kwargs["response_format"] = response_format
    if not stream:
        reply = await client.chat.completions.create(**kwargs)
        return reply.choices[0].message.content, reply.choices[0].finish_reason
    text, finish = "", None
    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


# --- local route ----------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_default_model_json_object_and_schema(node, client, stream):
    served = model_named(node, "swarmllm-pydoc-q8_0")
    # any JSON object: its strings are unbounded, and this small pydoc model can write one forever;
    # greedy, with this prompt, it closes the object (a reply is valid JSON whenever it stops)
    text, finish = await complete(client, served.id, {"type": "json_object"}, stream=stream,
                                  messages=[{"role": "user", "content": "Return a JSON object with a name."}])
    assert finish == "stop", text
    assert isinstance(json.loads(text), dict)
    text, finish = await complete(client, served.id, fmt(PERSON), stream=stream, temperature=0.8, seed=7)
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("stream", [False, True])
async def test_tiny_random_model_schema(node, client, stream):
    served = model_named(node, "roomy")
    for seed in range(3):
        text, finish = await complete(client, served.id, fmt(PERSON), stream=stream, temperature=1.0, seed=seed,
                                      max_tokens=max_bytes(PERSON))
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)


async def test_text_completion_json_schema(node, client):
    served = model_named(node, "roomy")
    reply = await client.completions.create(model=served.id, prompt="person:", max_tokens=max_bytes(PERSON),
                                            temperature=0,
                                            extra_body={"response_format": fmt(PERSON)})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].text), PERSON)


@pytest.mark.parametrize(("schema", "feature"), [
    ({"type": "object", "not": {"required": ["a"]}}, "not"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?=x)"}}}, "look-around"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "credit-card"}}}, "credit-card"),
])
async def test_unsupported_schema_feature_is_a_400_naming_it(node, client, schema, feature):
    served = model_named(node, "tiny")
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            await complete(client, served.id, fmt(schema), stream=stream, max_tokens=50)
        error = caught.value.body
        assert error["param"] == "response_format" and error["code"] == "unsupported_parameter"
        assert feature in error["message"]


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
], ids=["itself", "a-loop"])
async def test_a_schema_that_admits_no_value_is_a_400(node, client, schema):
    """It compiles, and admits nothing: once a 200 with an empty reply (not JSON) marked "stop"."""
    served = model_named(node, "tiny")
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            await complete(client, served.id, fmt(schema), stream=stream, max_tokens=50)
        assert caught.value.body["param"] == "response_format"
        assert "admits no value" in caught.value.body["message"], caught.value.body


async def test_a_schema_whose_values_nest_without_end_fails_cleanly(node, client):
    """Every object must hold another: the parser runs past its limits mid-reply. Not a 500 with
    llguidance's parser state in it (as once): the request's error, said plainly."""
    served = model_named(node, "roomy")
    endless = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"], "additionalProperties": False}
    with pytest.raises(openai.BadRequestError) as caught:
        await complete(client, served.id, fmt(endless), stream=False, max_tokens=3000)
    message = caught.value.body["message"]
    assert "nest without end" in message and "<state>" not in message and len(message) < 400, message


async def test_logit_bias_out_of_vocabulary_is_a_400(node, client):
    served = model_named(node, "tiny")
    with pytest.raises(openai.BadRequestError) as caught:
        await complete(client, served.id, None, stream=False, max_tokens=5, logit_bias={"512": 5})
    assert caught.value.body["param"] == "logit_bias" and "512" in caught.value.body["message"]


async def check_logit_bias(client, model: str, tok) -> None:
    """Forcing a token makes every token of the reply that one; banning the greedy first token
    (every id spelling it) changes the reply's first token."""
    forced = next(i for i in range(tok.n_vocab) if tok.piece(i) == b" the")
    text, finish = await complete(client, model, None, stream=False, max_tokens=4, logit_bias={str(forced): 100})
    assert text.strip() == "the the the the", text
    assert finish == "length"
    first, _ = await complete(client, model, None, stream=False, max_tokens=1)
    assert first
    spelled = [i for i in range(tok.n_vocab) if tok.piece(i).decode("utf-8", "replace").strip() == first.strip()]
    assert spelled
    banned, _ = await complete(client, model, None, stream=True, max_tokens=1,
                               logit_bias={str(i): -100 for i in spelled})
    assert banned.strip() != first.strip()


async def test_logit_bias_forces_and_bans_local(node, client):
    served = model_named(node, "tiny")
    await check_logit_bias(client, served.id, served.tokenizer)


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(schema=bounded_schemas())
async def test_property_every_reply_valid_local(node, client, schema):
    """200 generated schemas x a random model: every reply parses and is valid (never filtered)."""
    served = model_named(node, "roomy")
    budget = max_bytes(schema) + 8
    assert budget + 64 < served.n_ctx
    text, finish = await complete(client, served.id, fmt(schema), stream=False, max_tokens=budget,
                                  temperature=1.0, seed=len(json.dumps(schema)))
    assert finish == "stop", (schema, text)
    jsonschema.validate(json.loads(text), schema)


# --- distributed route: a random model split over two node processes -----------------------------

@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def chain(tmp_path_factory):
    base = tmp_path_factory.mktemp("structured-chain")
    model = write_gguf(base / "split6roomy.gguf", SPLIT.replace(n_ctx=4096, name="split6roomy"))  # fits any reply
    a = start_slice_node(base, "a", model, "0-2")
    b = start_slice_node(base, "b", model, "3-5", bootstrap=[a.peer_port])
    try:
        await a.async_wait_ready()
        await b.async_wait_ready()
        await wait_peers(a, 1)
        model_id = await wait_for_route(a, "split6roomy")
        client = openai.AsyncOpenAI(base_url=f"{a.base}/v1", api_key=a.api_key, max_retries=0)
        from node.inference.tokenizer import ModelTokenizer

        tok = ModelTokenizer(model)
        try:
            yield {"client": client, "model_id": model_id, "a": a, "tok": tok}
        finally:
            tok.close()
    finally:
        for proc in (a, b):
            proc.terminate()


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
async def test_distributed_json_schema(chain, stream):
    for seed in range(1):
        text, finish = await complete(chain["client"], chain["model_id"], fmt(PERSON), stream=stream,
                                      temperature=1.0, seed=seed, max_tokens=max_bytes(PERSON))
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)
    log = chain["a"].node_log()
    assert "route=distributed" in log


@pytest.mark.slow
async def test_distributed_json_object_and_unsupported_feature(chain):
    with pytest.raises(openai.BadRequestError) as caught:
        await complete(chain["client"], chain["model_id"], fmt({"type": "object", "not": {}}), stream=True,
                       max_tokens=20)
    assert caught.value.body["param"] == "response_format" and "not" in caught.value.body["message"]


@pytest.mark.slow
async def test_distributed_schema_whose_values_nest_without_end_fails_cleanly(chain):
    endless = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"], "additionalProperties": False}
    with pytest.raises(openai.APIStatusError) as caught:
        await complete(chain["client"], chain["model_id"], fmt(endless), stream=False, max_tokens=3000)
    assert caught.value.status_code < 500 and "nest without end" in caught.value.body["message"], caught.value.body


@pytest.mark.slow
async def test_logit_bias_forces_and_bans_distributed(chain):
    await check_logit_bias(chain["client"], chain["model_id"], chain["tok"])


@pytest.mark.slow
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(schema=bounded_schemas())
async def test_property_every_reply_valid_distributed(chain, schema):
    budget = max_bytes(schema) + 8
    assert budget + 100 < 4096
    text, finish = await complete(chain["client"], chain["model_id"], fmt(schema), stream=True, max_tokens=budget,
                                  temperature=1.0, seed=len(json.dumps(schema)))
    assert finish == "stop", (schema, text)
    jsonschema.validate(json.loads(text), schema)
