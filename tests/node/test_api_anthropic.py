"""The Anthropic Messages API of a real node (the default model, local route), driven by the official
`anthropic` client; raw HTTP where the SDK cannot send the bad input. A request means the same
here as on /v1/chat/completions: the same prompt tokens and, greedy, the same reply."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import anthropic
import pytest

from tests.support.nodes import anthropic_client, default_model_node, openai_client
from tests.support.sse import sse_data

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

GREEDY = {"temperature": 0}  # the SDK has no temperature argument any more: it travels as extra_body
QUESTION = "How do I open a file?"


node = default_model_node("anthropic")


@pytest.fixture
def client(node):
    return anthropic_client(node)


@pytest.fixture
def oai(node):
    return openai_client(node)


def user(text):
    return [{"role": "user", "content": text}]


def prompt_tokens(usage) -> int:
    """The whole prompt in Anthropic's accounting: what was read from a KV cache is not in input_tokens."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


async def raw(node, path, body, *, headers=None, method="POST"):
    hdrs = {"x-api-key": node.api_key, "anthropic-version": "2023-06-01", **(headers or {})}
    async with aiohttp.ClientSession() as s, s.request(method, f"http://127.0.0.1:{node.api.port}{path}",
                                                        data=json.dumps(body), headers=hdrs) as r:
        return r.status, r.headers, await r.text()


async def test_a_schema_that_cannot_compile_is_a_400_naming_the_field_sent(client, model_id):
    """It named OpenAI's `response_format`, which the client never sent (the API fuzzer's find)."""
    schema = {"type": "object", "properties": {}, "required": ["a"], "additionalProperties": False}
    for field, extra in (("output_format", {"output_format": {"type": "json_schema", "schema": schema}}),
                         ("output_config.format", {"output_config": {"format": {"type": "json_schema",
                                                                                 "schema": schema}}})):
        with pytest.raises(anthropic.BadRequestError) as info:
            await client.messages.create(model=model_id, max_tokens=8, messages=user(QUESTION), extra_body=extra)
        message = info.value.body["error"]["message"]
        assert message.startswith(f"`{field}`: the output grammar cannot be compiled") and "response_format" not in message


async def test_text_matches_the_chat_route(client, oai, model_id):
    msg = await client.messages.create(model=model_id, max_tokens=60, messages=user(QUESTION), extra_body=GREEDY)
    chat = await oai.chat.completions.create(model=model_id, max_tokens=60, temperature=0,
                                             messages=[{"role": "user", "content": QUESTION}])
    assert msg.type == "message" and msg.role == "assistant" and msg.model == model_id
    assert msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == chat.choices[0].message.content and msg.content[0].text
    assert prompt_tokens(msg.usage) == chat.usage.prompt_tokens
    assert msg.usage.output_tokens == chat.usage.completion_tokens
    assert msg.stop_reason == "end_turn" and chat.choices[0].finish_reason == "stop"
    assert msg.stop_sequence is None


async def test_max_tokens(client, model_id):
    msg = await client.messages.create(model=model_id, max_tokens=3, messages=user(QUESTION), extra_body=GREEDY)
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 3


async def test_stop_sequence_cuts_the_reply_and_is_named(client, model_id):
    full = await client.messages.create(model=model_id, max_tokens=60, messages=user(QUESTION), extra_body=GREEDY)
    text = full.content[0].text
    words = text.split()
    stop = words[len(words) // 2]
    msg = await client.messages.create(model=model_id, max_tokens=60, messages=user(QUESTION),
                                       stop_sequences=["never-in-this-reply", stop], extra_body=GREEDY)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == text[:text.index(stop)]


async def test_system_string_and_blocks_count_alike(client, oai, model_id):
    system = "You answer in one short sentence."
    as_string = await client.messages.count_tokens(model=model_id, system=system, messages=user(QUESTION))
    as_blocks = await client.messages.count_tokens(
        model=model_id, system=[{"type": "text", "text": "You answer in one "}, {"type": "text", "text": "short sentence."}],
        messages=user(QUESTION))
    without = await client.messages.count_tokens(model=model_id, messages=user(QUESTION))
    chat = await oai.chat.completions.create(model=model_id, max_tokens=1, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": QUESTION}])
    assert as_string.input_tokens == as_blocks.input_tokens == chat.usage.prompt_tokens
    assert without.input_tokens < as_string.input_tokens
    msg = await client.messages.create(model=model_id, max_tokens=2, system=system, messages=user(QUESTION))
    assert prompt_tokens(msg.usage) == as_string.input_tokens


async def test_multi_turn_is_rendered_as_the_chat_template_renders_it(node, client, model_id):
    turns = [{"role": "user", "content": "hello"},
             {"role": "assistant", "content": [{"type": "text", "text": "Hello! Ask me about Python."}]},
             {"role": "user", "content": [{"type": "text", "text": QUESTION}]}]
    counted = await client.messages.count_tokens(model=model_id, system="be brief", messages=turns)
    tok = node.models.all()[0].tokenizer
    expected = tok.chat_tokens([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"},
                                {"role": "assistant", "content": "Hello! Ask me about Python."},
                                {"role": "user", "content": QUESTION}])
    assert counted.input_tokens == len(expected)
    msg = await client.messages.create(model=model_id, max_tokens=4, system="be brief", messages=turns)
    assert prompt_tokens(msg.usage) == len(expected)


async def test_the_second_turn_reads_its_prefix_from_the_cache(client, oai, model_id):
    """Anthropic's usage splits the prompt: cache_read_input_tokens is the prefix found in the KV
    cache (the first turn's prompt and reply), input_tokens the rest, as llama-server reports it;
    the streamed message_delta carries the same (its usage is cumulative)."""
    first = [{"role": "user", "content": "Name a fruit, then a color, then a number."}]
    msg = await client.messages.create(model=model_id, max_tokens=12, messages=first, extra_body=GREEDY)
    turns = [*first, {"role": "assistant", "content": msg.content[0].text},
             {"role": "user", "content": "And another three?"}]
    counted = (await client.messages.count_tokens(model=model_id, messages=turns)).input_tokens
    second = await client.messages.create(model=model_id, max_tokens=4, messages=turns, extra_body=GREEDY)
    assert second.usage.cache_read_input_tokens >= prompt_tokens(msg.usage), second.usage
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == counted
    assert second.usage.cache_creation_input_tokens == 0
    chat = await oai.chat.completions.create(model=model_id, max_tokens=4, temperature=0, messages=turns)
    assert chat.usage.prompt_tokens == counted  # OpenAI's accounting: cached tokens are inside
    async with client.messages.stream(model=model_id, max_tokens=4, messages=turns, extra_body=GREEDY) as stream:
        final = await stream.get_final_message()
    assert final.usage.cache_read_input_tokens >= prompt_tokens(msg.usage), final.usage
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == counted


MISTRAL = Path(__file__).resolve().parent.parent / "fixtures" / "templates" / "mistralai-Mistral-Nemo-Instruct-2407.jinja"


@pytest.mark.parametrize("template", ["default", "mistral"])
async def test_consecutive_turns_of_one_role_are_one_turn(node, client, model_id, template, monkeypatch):
    """Anthropic's API combines consecutive user (or assistant) turns; agents send them (a reminder
    after a tool result, a note after the question). Here they were two turns: a template that
    checks the roles alternate (Mistral's) failed the request with a 400, the others rendered a
    conversation the client never sent. Now the texts are one turn, a paragraph apart."""
    if template == "mistral":
        monkeypatch.setattr(node.models.all()[0].tokenizer, "chat_template", MISTRAL.read_text())
    split = [*user("hello"), *user([{"type": "text", "text": QUESTION}]),
             {"role": "assistant", "content": "Use open()."}, {"role": "assistant", "content": "It returns a file."},
             *user("And to read it?")]
    joined = [*user("hello\n\n" + QUESTION), {"role": "assistant", "content": "Use open().\n\nIt returns a file."},
              *user("And to read it?")]
    counted = await client.messages.count_tokens(model=model_id, messages=split)
    assert counted.input_tokens == (await client.messages.count_tokens(model=model_id, messages=joined)).input_tokens
    msg = await client.messages.create(model=model_id, max_tokens=8, messages=split, extra_body=GREEDY)
    same = await client.messages.create(model=model_id, max_tokens=8, messages=joined, extra_body=GREEDY)
    assert prompt_tokens(msg.usage) == counted.input_tokens
    assert msg.content == same.content


async def test_a_final_assistant_turn_is_continued_as_the_text_route_continues_it(node, client, oai, model_id):
    """A prefill: the reply continues the assistant's text. It was a 400 here and, on
    /v1/chat/completions, rendered as a finished turn that got a new one (a compatibility run,
    2026-12-06); llama-server and Anthropic's API continue it."""
    prefill = "Use the built-in"
    tok = node.models.all()[0].tokenizer
    expected = tok.chat_tokens(user(QUESTION), None, prefill)
    assert len(expected) > len(tok.chat_tokens(user(QUESTION)))
    turns = [*user(QUESTION), {"role": "assistant", "content": prefill}]
    msg = await client.messages.create(model=model_id, max_tokens=24, messages=turns, extra_body=GREEDY)
    chat = await oai.chat.completions.create(model=model_id, max_tokens=24, temperature=0, messages=turns)
    text = await oai.completions.create(model=model_id, max_tokens=24, temperature=0,
                                        prompt=tok.render_chat(user(QUESTION)) + prefill)
    assert prompt_tokens(msg.usage) == chat.usage.prompt_tokens == text.usage.prompt_tokens == len(expected)
    assert msg.content[0].text == chat.choices[0].message.content == text.choices[0].text != ""
    # an empty assistant placeholder (some apps append one) changes nothing
    placeholder = await oai.chat.completions.create(model=model_id, max_tokens=24, temperature=0,
                                                    messages=[*user(QUESTION), {"role": "assistant", "content": ""}])
    plain = await oai.chat.completions.create(model=model_id, max_tokens=24, temperature=0, messages=user(QUESTION))
    assert placeholder.choices[0].message.content == plain.choices[0].message.content
    assert placeholder.usage.prompt_tokens == plain.usage.prompt_tokens


async def test_what_claude_code_sends_is_taken(client, model_id):
    """`thinking` enabled, an earlier turn's thinking blocks, and the SDK's newer tool fields were
    400s (a compatibility run, 2026-12-06). Thinking is accepted and has no effect (these models
    write none), earlier thinking blocks are left out of the context as Anthropic's API does, the
    tool fields change nothing here."""
    turns = [*user("hello"),
             {"role": "assistant", "content": [{"type": "thinking", "thinking": "greet back", "signature": "x"},
                                               {"type": "redacted_thinking", "data": "abc"},
                                               {"type": "text", "text": "Hello!"}]},
             *user(QUESTION)]
    tool = {"name": "read_file", "description": "read a file", "strict": True, "defer_loading": False,
            "input_examples": [{"path": "a.txt"}], "eager_input_streaming": True, "allowed_callers": ["direct"],
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
    msg = await client.messages.create(model=model_id, max_tokens=8, messages=turns, tools=[tool],
                                       thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=GREEDY)
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use") and msg.usage.output_tokens > 0
    assert all(b.type != "thinking" for b in msg.content)
    plain = [*user("hello"), {"role": "assistant", "content": "Hello!"}, *user(QUESTION)]
    counted = await client.messages.count_tokens(model=model_id, messages=plain)
    assert counted.input_tokens == (await client.messages.count_tokens(model=model_id, messages=turns)).input_tokens


async def test_streaming_events_and_final_message(node, client, model_id):
    whole = await client.messages.create(model=model_id, max_tokens=60, messages=user(QUESTION), extra_body=GREEDY)
    async with client.messages.stream(model=model_id, max_tokens=60, messages=user(QUESTION),
                                      extra_body=GREEDY) as stream:
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text
    assert final.content[0].text == whole.content[0].text and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert prompt_tokens(final.usage) == prompt_tokens(whole.usage)
    # the wire: event names and data types agree, in Anthropic's order
    status, headers, body = await raw(node, "/v1/messages", {
        "model": model_id, "max_tokens": 5, "messages": user(QUESTION), "stream": True, "temperature": 0})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert headers["x-swarm-route"] == "local"
    names = [line[7:] for line in body.splitlines() if line.startswith("event: ")]
    events = [json.loads(d) for d in sse_data(body)]
    assert [e["type"] for e in events] == names
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    # message_start comes before the prompt is placed: all of it is input there; message_delta's
    # usage (cumulative, as Anthropic's) splits off what the KV cache held
    assert events[0]["message"]["usage"]["input_tokens"] == prompt_tokens(whole.usage)
    end = events[-2]["usage"]
    assert end["input_tokens"] + end["cache_read_input_tokens"] == prompt_tokens(whole.usage)
    assert events[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 5


async def test_stream_stop_sequence(client, model_id):
    full = await client.messages.create(model=model_id, max_tokens=60, messages=user(QUESTION), extra_body=GREEDY)
    text = full.content[0].text
    stop = text.split()[2]
    async with client.messages.stream(model=model_id, max_tokens=60, messages=user(QUESTION), stop_sequences=[stop],
                                      extra_body=GREEDY) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    assert final.content[0].text == text[:text.index(stop)]


async def test_headers_and_trace_show_the_request(node, client, model_id):
    resp = await client.messages.with_raw_response.create(model=model_id, max_tokens=3, messages=user("hi"))
    msg = await resp.parse()
    rid = resp.headers["x-request-id"]
    assert resp.headers["x-swarm-route"] == "local" and resp.headers["x-swarm-nodes"] == node.short_id
    assert "ttft;dur=" in resp.headers["server-timing"]
    assert msg.id == "msg_" + rid.replace("-", "")
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{node.api.port}/api/admin/requests",
                                                   headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        recent = (await r.json())["recent"]
    trace = next(t for t in recent if t["request_id"] == rid)
    assert trace["operation"] == "messages" and trace["outcome"] == "ok" and trace["completion_tokens"] == 3


async def test_auth_errors_in_anthropic_shape(node, model_id):
    bad = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{node.api.port}", api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        await bad.messages.create(model=model_id, max_tokens=3, messages=user("hi"))
    assert err.value.status_code == 401
    assert err.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                         "message": "Incorrect API key provided."}}
    bearer = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{node.api.port}", auth_token=node.api_key,
                                      max_retries=0)
    assert (await bearer.messages.count_tokens(model=model_id, messages=user("hi"))).input_tokens > 0


async def test_unknown_model_is_not_found(client):
    with pytest.raises(anthropic.NotFoundError) as err:
        await client.messages.create(model="no-such-model", max_tokens=3, messages=user("hi"))
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.count_tokens(model="no-such-model", messages=user("hi"))


async def test_prompt_longer_than_the_context(client, model_id):
    with pytest.raises(anthropic.BadRequestError) as err:
        await client.messages.create(model=model_id, max_tokens=3, messages=user("word " * 1200))
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "maximum context length is 1024 tokens" in err.value.body["error"]["message"]
    # room for the prompt, not for max_tokens (Claude Code asks 32000 of every model): what the
    # context has left, as llama-server gives it
    async with client.messages.stream(model=model_id, max_tokens=32000, messages=user(QUESTION)) as stream:
        reply = await stream.get_final_message()  # (the SDK streams a request this long, as Claude Code does)
    assert reply.usage.input_tokens + reply.usage.output_tokens <= 1024
    assert reply.stop_reason in ("end_turn", "max_tokens")
    if reply.stop_reason == "max_tokens":
        assert reply.usage.input_tokens + reply.usage.output_tokens == 1024


@pytest.mark.parametrize(("body", "needle"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens: Field required"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({"max_tokens": 5, "messages": []}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "hi"}]}, "messages.0.role"),
    ({"max_tokens": 5, "temperature": 1.5, "messages": [{"role": "user", "content": "hi"}]}, "temperature"),
    ({"max_tokens": 5, "stop_sequences": "x", "messages": [{"role": "user", "content": "hi"}]}, "stop_sequences"),
    ({"max_tokens": 5, "stop_sequences": 0, "messages": [{"role": "user", "content": "hi"}]}, "stop_sequences"),
    # the chat route's tool checks, in this API's words (once `tools[0].function.parameters`)
    ({"max_tokens": 5, "tools": [{"name": "f", "input_schema": {"type": "object", "required": "x"}}],
      "messages": [{"role": "user", "content": "hi"}]}, "`tools[0].input_schema` is not a valid JSON schema"),
    ({"max_tokens": 5, "tools": {}, "messages": [{"role": "user", "content": "hi"}]}, "tools: must be a list"),
    ({"max_tokens": 5, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
      "tool_choice": {"type": "auto", "foo": 1}, "messages": [{"role": "user", "content": "hi"}]}, "tool_choice.foo"),
    ({"max_tokens": 5, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
      "tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}, "messages": [{"role": "user", "content": "hi"}]},
     "disable_parallel_tool_use"),
    ({"max_tokens": 5, "frequency_penalty": 1, "messages": [{"role": "user", "content": "hi"}]},
     "frequency_penalty: Extra inputs are not permitted"),
    ({"max_tokens": 5, "thinking": {"type": "enabled"}, "messages": [{"role": "user", "content": "hi"}]},
     "thinking.budget_tokens"),
    ({"max_tokens": 5, "thinking": {"type": "deep"}, "messages": [{"role": "user", "content": "hi"}]}, "thinking.type"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}, "image"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}],
      "tools": [{"name": "f", "input_schema": {"type": "object"}}]}, "prefill"),
])
async def test_bad_bodies_are_400_in_anthropic_shape(node, model_id, body, needle):
    status, _, text = await raw(node, "/v1/messages", {"model": model_id, **body})
    assert status == 400, text
    err = json.loads(text)
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"]


async def test_route_errors_in_anthropic_shape(node, client, model_id):
    status, _, text = await raw(node, "/v1/messages", None, method="GET")
    assert status == 405 and json.loads(text)["error"]["type"] == "invalid_request_error"
    status, _, text = await raw(node, "/v1/messages/batches", {"requests": []})
    assert status == 404 and json.loads(text)["error"]["type"] == "not_found_error"
    status, _, text = await raw(node, "/v1/messages", None, headers={"Content-Type": "application/json"})
    assert status == 400 and json.loads(text)["error"]["type"] == "invalid_request_error"
    # the OpenAI routes keep the OpenAI shape
    status, _, text = await raw(node, "/v1/chat/completions", {"model": "no-such-model", "messages": user("x")})
    assert status == 404 and json.loads(text)["error"]["code"] == "model_not_found"
    assert (await client.messages.create(model=model_id, max_tokens=2, messages=user("x"))).usage.output_tokens > 0
