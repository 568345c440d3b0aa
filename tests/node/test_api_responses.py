"""The OpenAI Responses API of a real node (the default model, local route) through the official
`openai` client: text as on /v1/chat/completions, instructions, items, max_output_tokens, the typed
stream, previous_response_id (kept, continued, expiring, store=false), errors, the trace."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from node import const
from tests.support.nodes import default_model_node
from tests.support.sse import sse_data
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

QUESTION = "How do I open a file?"


node = default_model_node("responses")


def chat_tokens(node, messages):
    return len(node.models.all()[0].tokenizer.chat_tokens(messages))


async def test_text_matches_the_chat_route(client, model_id):
    resp = await client.responses.create(model=model_id, input=QUESTION, max_output_tokens=60, temperature=0)
    chat = await client.chat.completions.create(model=model_id, max_tokens=60, temperature=0,
                                                messages=[{"role": "user", "content": QUESTION}])
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.status == "completed"
    assert resp.model == model_id and resp.incomplete_details is None and resp.error is None
    assert [item.type for item in resp.output] == ["message"]
    assert resp.output[0].role == "assistant" and resp.output[0].content[0].type == "output_text"
    assert resp.output_text == chat.choices[0].message.content and resp.output_text
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens


async def test_instructions_and_items(node, client, model_id):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Hello! Ask me about Python.", "annotations": []}]},
             {"role": "developer", "content": "Answer briefly."},
             {"role": "user", "content": QUESTION}]
    resp = await client.responses.create(model=model_id, instructions="You document Python.", input=items,
                                         max_output_tokens=4)
    assert resp.instructions == "You document Python."
    assert resp.usage.input_tokens == chat_tokens(node, [
        {"role": "system", "content": "You document Python."}, {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hello! Ask me about Python."},
        {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}])


async def test_max_output_tokens_is_incomplete(client, model_id):
    resp = await client.responses.create(model=model_id, input=QUESTION, max_output_tokens=3, temperature=0)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 3 and resp.max_output_tokens == 3
    assert [item.status for item in resp.output] == ["incomplete"]  # the cut message too, as OpenAI marks it


async def test_stream_events_in_order(node, client, model_id):
    whole = await client.responses.create(model=model_id, input=QUESTION, max_output_tokens=60, temperature=0)
    async with client.responses.stream(model=model_id, input=QUESTION, max_output_tokens=60,
                                       temperature=0) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == final.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens and final.status == "completed"
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}


async def test_stream_cut_by_max_output_tokens_ends_incomplete(node, model_id):
    body = {"model": model_id, "input": QUESTION, "max_output_tokens": 4, "stream": True, "temperature": 0}
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{node.api.port}/v1/responses", json=body,
                                                    headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        assert r.status == 200 and r.headers["x-swarm-route"] == "local"
        text = await r.text()
    names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    events = [json.loads(d) for d in sse_data(text)]
    assert [e["type"] for e in events] == names and "[DONE]" not in text
    assert names[-1] == "response.incomplete"
    final = events[-1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"]["output_tokens"] == 4
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["status"] for i in done] == [i["status"] for i in final["output"]] == ["incomplete"]


async def test_previous_response_id_continues_the_conversation(node, client, model_id):
    first = await client.responses.create(model=model_id, input="hello", instructions="Be brief.",
                                          max_output_tokens=40, temperature=0)
    second = await client.responses.create(model=model_id, input=QUESTION, previous_response_id=first.id,
                                           max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id
    # the second prompt holds the first turn (the instructions do not carry over, as on OpenAI)
    assert second.usage.input_tokens == chat_tokens(node, [
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": QUESTION}])
    # ... and the chain goes on from the second
    third = await client.responses.create(model=model_id, input="thanks", previous_response_id=second.id,
                                          max_output_tokens=2)
    assert third.usage.input_tokens == chat_tokens(node, [
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "thanks"}])
    stored = await client.responses.retrieve(first.id)
    assert stored.id == first.id and stored.output_text == first.output_text and stored.status == "completed"


async def test_streamed_responses_are_stored_too(node, client, model_id):
    async with client.responses.stream(model=model_id, input="hello", max_output_tokens=40,
                                       temperature=0) as stream:
        first = await stream.get_final_response()
    second = await client.responses.create(model=model_id, input="more", previous_response_id=first.id,
                                           max_output_tokens=2)
    assert second.usage.input_tokens == chat_tokens(node, [
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "more"}])


async def test_store_false_keeps_nothing(client, model_id):
    resp = await client.responses.create(model=model_id, input="hello", store=False, max_output_tokens=2)
    assert resp.store is False
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(resp.id)
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model=model_id, input="x", previous_response_id=resp.id, max_output_tokens=2)
    assert err.value.body["param"] == "previous_response_id"
    assert err.value.body["code"] == "previous_response_not_found"


async def test_unknown_and_expired_previous_response(client, model_id, monkeypatch):
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model=model_id, input="x", previous_response_id="resp_nope",
                                      max_output_tokens=2)
    assert "resp_nope" in err.value.message
    monkeypatch.setattr(const, "RESPONSE_STORE_TTL_S", 0.2)
    short = await client.responses.create(model=model_id, input="hello", max_output_tokens=2)
    assert (await client.responses.retrieve(short.id)).id == short.id

    async def expired():
        try:
            await client.responses.retrieve(short.id)
        except openai.NotFoundError:
            return True
        return False
    await wait_until(expired, 10.0, 0.05, "the stored response to expire")
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model=model_id, input="x", previous_response_id=short.id, max_output_tokens=2)


async def test_delete(client, model_id):
    resp = await client.responses.create(model=model_id, input="hello", max_output_tokens=2)
    await client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(resp.id)


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"include": ["no.such.include"]}, "include"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"reasoning": "high"}, "reasoning"),
    ({"include": ""}, "include"),  # "empty" values of the wrong type
    ({"tools": 0}, "tools"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "required": "x"}}]},
     "tools[0].parameters"),  # this API's field (once chat's `tools[0].function.parameters`)
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "not json"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input"),
    ({"temperature": 3}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"frequency_penalty": 1}, "frequency_penalty"),
    ({"input": []}, "input"),
])
async def test_unsupported_and_bad_options_are_400_naming_them(client, model_id, extra, param):
    kwargs = {"model": model_id, "input": "hello", "max_output_tokens": 2}
    body = {k: v for k, v in extra.items() if k in ("input", "max_output_tokens", "temperature")}
    rest = {k: v for k, v in extra.items() if k not in body}
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(**{**kwargs, **body}, extra_body=rest)
    assert err.value.body["param"].startswith(param), err.value.body


async def test_a_coding_agents_reasoning_and_include_are_taken(client, model_id):
    """Codex CLI sends `reasoning: {effort, summary}`, `include: ["reasoning.encrypted_content"]` with
    `store: false`, and passes earlier reasoning items back in `input`: each was a 400. The model
    writes no reasoning, so the reply is what the request without them gets."""
    plain = await client.responses.create(model=model_id, input=QUESTION, max_output_tokens=12, temperature=0)
    agent = await client.responses.create(
        model=model_id, max_output_tokens=12, temperature=0, store=False,
        reasoning={"effort": "medium", "summary": "auto"}, include=["reasoning.encrypted_content"],
        input=[{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
               {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}])
    assert agent.status == "completed" and agent.output_text == plain.output_text
    assert agent.usage.input_tokens == plain.usage.input_tokens  # the reasoning item added nothing
    assert [item.type for item in agent.output] == ["message"]


async def test_errors(node, client, model_id):
    bad = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await bad.responses.create(model=model_id, input="hi")
    with pytest.raises(openai.NotFoundError) as err:
        await client.responses.create(model="no-such-model", input="hi")
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(model=model_id, input="word " * 1200)
    assert err.value.body["code"] == "context_length_exceeded"
    assert err.value.body["param"] == "input"  # this API's field, not chat's `messages`
    # more than the context has room for: the room left (as llama-server gives it), not a 400
    resp = await client.responses.create(model=model_id, input="hi", max_output_tokens=100_000)
    assert resp.status in ("completed", "incomplete") and resp.usage.output_tokens > 0
    if resp.status == "incomplete":
        assert resp.incomplete_details.reason == "max_output_tokens"


async def test_headers_and_trace(node, client, model_id):
    resp = await client.responses.with_raw_response.create(model=model_id, input="hi", max_output_tokens=3)
    body = resp.parse()
    rid = resp.headers["x-request-id"]
    assert resp.headers["x-swarm-route"] == "local" and "decode;dur=" in resp.headers["server-timing"]
    assert body.id == "resp_" + rid.replace("-", "")
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{node.api.port}/api/admin/requests",
                                                   headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        recent = (await r.json())["recent"]
    trace = next(t for t in recent if t["request_id"] == rid)
    assert trace["operation"] == "responses" and trace["outcome"] == "ok"
    # the trace counts what the response reports, within the cap: the request gives no temperature,
    # so it samples at 1.0 as OpenAI's API does, and the model may end its reply before the cap
    assert trace["completion_tokens"] == body.usage.output_tokens and 1 <= body.usage.output_tokens <= 3
