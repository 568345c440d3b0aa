"""What more local apps send to an OpenAI-compatible base URL, replayed on a real node serving the
default model, each request as the app builds it.

- Jan 0.6 (web-app/src/lib/completion.ts, token.js) spreads the assistant's parameters into every
  chat request, to any provider: a user who added "Max Context Tokens" (`ctx_len`) or "Max Output
  Tokens" (`max_output_tokens`, web-app/src/lib/predefinedParams.ts) got a 400 "unrecognized request
  argument" on every chat. `ctx_len` is a load-time setting (dropped, as Ollama's `num_ctx`);
  `max_output_tokens` is the reply's token limit.
"""

from __future__ import annotations

import openai
import pytest

from tests.support.nodes import default_model_node, openai_client

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = [{"role": "user", "content": "What does os.path.join do?"}]

node = default_model_node("more-apps")


@pytest.fixture
def client(node):
    return openai_client(node)


@pytest.fixture
def model_id(node):
    return node.models.all()[0].id


async def test_jan_assistant_parameters_are_served_and_max_output_tokens_limits_the_reply(client, model_id):
    # Jan's assistant parameters at its predefined values, as token.js spreads them into the body
    jan = {"ctx_len": 8192, "max_output_tokens": 5, "top_k": 2}
    reply = await client.chat.completions.create(model=model_id, messages=QUESTION, temperature=0, extra_body=jan)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    # an explicit max_tokens wins over it
    reply = await client.chat.completions.create(model=model_id, messages=QUESTION, temperature=0, max_tokens=3,
                                                 extra_body=jan)
    assert reply.usage.completion_tokens == 3
    streamed = await client.chat.completions.create(model=model_id, messages=QUESTION, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}, extra_body=jan)
    usage = [chunk.usage async for chunk in streamed if chunk.usage]
    assert usage and usage[-1].completion_tokens == 5
    # it is checked as max_tokens is
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model=model_id, messages=QUESTION,
                                             extra_body={"max_output_tokens": "many"})
    assert err.value.body["param"] == "max_tokens"

