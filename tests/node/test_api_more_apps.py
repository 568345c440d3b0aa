"""What more local apps send to an OpenAI-compatible base URL, replayed on a real node serving the
default model, each request as the app builds it.

- Jan 0.6 (web-app/src/lib/completion.ts, token.js) spreads the assistant's parameters into every
  chat request, to any provider: a user who added "Max Context Tokens" (`ctx_len`) or "Max Output
  Tokens" (`max_output_tokens`, web-app/src/lib/predefinedParams.ts) got a 400 "unrecognized request
  argument" on every chat. `ctx_len` is a load-time setting (dropped, as Ollama's `num_ctx`);
  `max_output_tokens` is the reply's token limit.
- Zed's agent (crates/open_ai/src/completion.rs `into_open_ai`) sends a tool's result as content
  parts, an image the tool read (a screenshot, an image file) as an `image_url` part in the tool
  message: the chat route's 400 failed that request and every later one in the thread, the image
  staying in the history. It is now the placeholder /v1/messages already puts in a tool_result.
"""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from tests.support.nodes import default_model_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = [{"role": "user", "content": "What does os.path.join do?"}]
# a 1x1 PNG, as Zed's LanguageModelImage::to_base64_url writes one
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
       "RU5ErkJggg==")
LEFT_OUT = "[an image was left out: this model reads text only]"

node = default_model_node("more-apps")


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
    # a bad value is a 400 naming the field Jan sent (review r42: it named `max_tokens`)
    for bad in ("many", 0, 1 << 25, True):
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model=model_id, messages=QUESTION,
                                                 extra_body={"max_output_tokens": bad})
        assert err.value.body["param"] == "max_output_tokens", bad
        assert "`max_output_tokens` must be" in err.value.body["message"], err.value.body


def zed_body(model_id: str, tool_content) -> dict:
    """Zed's streamed request after its agent called a tool (serde's field order and shapes)."""
    return {
        "model": model_id, "stream": True, "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "What is in logo.png?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "read_file",
                                                                   "arguments": "{\"path\":\"logo.png\"}"}}]},
            {"role": "tool", "content": tool_content, "tool_call_id": "toolu_1"},
        ],
        "max_completion_tokens": 6, "temperature": 1.0,
        "tools": [{"type": "function", "function": {"name": "read_file", "description": "Reads a file.",
                                                    "parameters": {"type": "object",
                                                                   "properties": {"path": {"type": "string"}}}}}],
    }


async def test_zed_tool_result_with_an_image_is_served_and_the_model_is_told_it_was_left_out(node, model_id):
    url = f"http://127.0.0.1:{node.api.port}"
    headers = {"Authorization": f"Bearer {node.api_key}"}
    image = [{"type": "image_url", "image_url": {"url": PNG}}]
    text_and_image = [{"type": "text", "text": "logo.png: "}, *image]
    async with aiohttp.ClientSession(headers=headers) as s:
        for content in (image, text_and_image):
            async with s.post(f"{url}/v1/chat/completions", json=zed_body(model_id, content)) as r:
                assert r.status == 200, await r.text()
                lines = [line for line in (await r.text()).splitlines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            chunks = [json.loads(line[6:]) for line in lines[:-1]]
            assert chunks[-1]["usage"]["completion_tokens"] > 0  # what Zed's ResponseStreamEvent reads
            assert any(c["choices"] and c["choices"][0]["finish_reason"] for c in chunks)
        # the tool's text reaches the model with the placeholder where the image was
        body = zed_body(model_id, text_and_image)
        async with s.post(f"{url}/apply-template", json={"model": model_id, "messages": body["messages"]}) as r:
            assert r.status == 200, await r.text()
            assert f"logo.png: {LEFT_OUT}" in (await r.json())["prompt"]
        # an image a user sends is still refused: they expect it seen
        user_image = {"model": model_id, "messages": [{"role": "user", "content": text_and_image}]}
        async with s.post(f"{url}/v1/chat/completions", json=user_image) as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == "messages[0].content"
