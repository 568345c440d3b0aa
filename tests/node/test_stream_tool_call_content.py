"""A tool-call-only reply streamed: the first delta is OpenAI's (role, content null, the first call),
so the openai SDK's stream helpers end with content None, as the whole reply has; a text reply's
first delta still has content ""."""

from __future__ import annotations

import pytest
import pytest_asyncio

from node.inference.synth import SynthSpec
from tests.support.nodes import node_config, openai_client, running_node, tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

ROOMY = SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=2048, name="roomy")
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("stream-tool-content")
    async with running_node(node_config(base / "data", tiny_model(base, ROOMY, "roomy.gguf"))) as n:
        yield n


@pytest.fixture
def client(node):  # (sync: the SDK's models are built off the loop)
    return openai_client(node)


async def test_a_streamed_tool_call_reply_has_content_none_as_the_whole_one(node, client):
    model = node.models.all()[0].id
    # one call (parallel calls let a random model write calls until max_tokens: the SDK's stream helper
    # then raises LengthFinishReasonError, one CI run in many), greedy
    ask = dict(model=model, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=100,
               parallel_tool_calls=False, temperature=0)
    whole = await client.chat.completions.create(**ask)
    assert whole.choices[0].message.tool_calls and whole.choices[0].message.content is None
    async with client.chat.completions.stream(**ask) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    message = final.choices[0].message
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    assert message.content is None, "the stream helper accumulated the first delta's content"
    deltas = [chunk.choices[0].delta async for chunk in await client.chat.completions.create(stream=True, **ask)
              if chunk.choices]
    first = deltas[0].model_dump(exclude_unset=True)
    assert first["role"] == "assistant" and first["content"] is None and first["tool_calls"][0]["function"]["name"] \
        == "get_weather"
    assert sum("role" in d.model_dump(exclude_unset=True) for d in deltas) == 1


async def test_a_streamed_text_reply_opens_with_empty_content(node, client):
    model = node.models.all()[0].id
    deltas = [chunk.choices[0].delta async for chunk in await client.chat.completions.create(
        model=model, messages=ASK, max_tokens=4, stream=True) if chunk.choices]
    assert deltas[0].model_dump(exclude_unset=True) == {"role": "assistant", "content": ""}
    assert sum("role" in d.model_dump(exclude_unset=True) for d in deltas) == 1
