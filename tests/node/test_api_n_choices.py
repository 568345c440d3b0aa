"""OpenAI's `n` (several choices for one prompt) through a real node on 127.0.0.1 and the official
`openai` client, with the default model: choice i is the reply the same request with n=1 and seed
+ i gives; greedy choices are equal; a stream reassembled is the body; usage counts the prompt once
and every choice's tokens; the prompt is prefilled once (the choices start from a copy of its KV);
one trace per request (choices=n on its summary line); n past the cap is a 400 naming `n`; a client
that goes away mid-stream frees every choice's sequence."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import openai
import pytest
import pytest_asyncio

from node.api.schemas import MAX_CHOICES
from node.resources import default_model_path
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama,
              pytest.mark.skipif(not default_model_path().exists(), reason="the default model is not in resources/")]

# long enough that a copy of its KV pays (kv_slots.COPY_MIN_TOKENS_SAMPLED)
SYSTEM = "You are a helpful assistant who answers questions about Python in one or two short sentences."
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What does len() return?"}]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("nchoices")
    config = node_config(base / "data", include_default_model=True, max_concurrent=4, kv_cache_seqs=4)
    async with running_node(config) as n:
        yield n


@pytest.fixture
def served(node):
    return node.models.all()[0]


def trace_of(node, request_id: str):
    return next(t for t in node.traces.recent if t.request_id == request_id)


async def chat(client, served, **kw):
    raw = await client.chat.completions.with_raw_response.create(
        model=served.id, messages=MESSAGES, **{"max_tokens": 24, **kw})
    return raw.headers["x-request-id"], raw.parse()


async def test_seeded_choices_are_each_the_reply_of_their_own_seed(node, client, served, caplog):
    caplog.set_level(logging.DEBUG, logger="node")
    rid, reply = await chat(client, served, n=3, temperature=0.9, seed=41)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    alone = [(await chat(client, served, temperature=0.9, seed=41 + i))[1].choices[0] for i in range(3)]
    assert texts == [a.message.content for a in alone]
    assert [c.finish_reason for c in reply.choices] == [a.finish_reason for a in alone]
    assert len(set(texts)) > 1  # three draws, not one thrice
    # usage: the prompt once, every choice's tokens (as OpenAI)
    one = (await chat(client, served, temperature=0.9, seed=41))[1]
    assert reply.usage.prompt_tokens == one.usage.prompt_tokens
    alone_tokens = [(await chat(client, served, temperature=0.9, seed=41 + i))[1].usage.completion_tokens
                    for i in range(3)]
    assert reply.usage.completion_tokens == sum(alone_tokens)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    # one trace, its summary line counting every choice's tokens
    trace = trace_of(node, rid)
    assert trace.choices == 3 and trace.completion_tokens == reply.usage.completion_tokens
    line = next(r.getMessage() for r in caplog.records
                if "request complete" in r.getMessage() and rid in r.getMessage())
    assert "choices=3" in line and f"tokens={reply.usage.completion_tokens}" in line
    # the prompt was prefilled once: choices 1 and 2 started from a copy of choice 0's KV
    copies = [r.getMessage() for r in caplog.records
              if "KV-cache HIT" in r.getMessage() and rid in r.getMessage() and "copied_from" in r.getMessage()]
    assert len(copies) == 2


async def test_greedy_choices_are_equal(client, served):
    _, reply = await chat(client, served, n=2, temperature=0)
    assert len(reply.choices) == 2
    assert reply.choices[0].message.content == reply.choices[1].message.content
    _, alone = await chat(client, served, temperature=0)
    assert reply.choices[0].message.content == alone.choices[0].message.content


async def test_a_stream_reassembled_is_the_body(client, served):
    _, whole = await chat(client, served, n=3, temperature=0.9, seed=5)
    stream = await client.chat.completions.create(model=served.id, messages=MESSAGES, max_tokens=24, n=3,
                                                  temperature=0.9, seed=5, stream=True,
                                                  stream_options={"include_usage": True})
    texts, finish, usage, chunks = ["", "", ""], [None, None, None], None, []
    async for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                assert finish[choice.index] is None  # one finish chunk per choice
                finish[choice.index] = choice.finish_reason
    assert texts == [c.message.content for c in whole.choices]
    assert finish == [c.finish_reason for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert len({c.id for c in chunks}) == 1


async def test_text_completions_take_n_with_logprobs_per_choice(client, served):
    reply = await client.completions.create(model=served.id, prompt="def add(a, b):", max_tokens=8, n=2,
                                            temperature=0.9, seed=3, logprobs=2)
    assert [c.index for c in reply.choices] == [0, 1]
    for i, choice in enumerate(reply.choices):
        alone = (await client.completions.create(model=served.id, prompt="def add(a, b):", max_tokens=8,
                                                 temperature=0.9, seed=3 + i, logprobs=2)).choices[0]
        assert choice.text == alone.text
        assert choice.logprobs.tokens == alone.logprobs.tokens
        assert "".join(choice.logprobs.tokens) == choice.text


async def test_tools_apply_to_every_choice(client, served):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}]
    kw = dict(model=served.id, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools,
              tool_choice="required", parallel_tool_calls=False, temperature=0.7, max_tokens=160)
    reply = await client.chat.completions.create(n=2, seed=8, **kw)
    for i, choice in enumerate(reply.choices):
        alone = (await client.chat.completions.create(seed=8 + i, **kw)).choices[0]
        assert choice.finish_reason == alone.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        assert [c.function.name for c in calls] == ["get_weather"]
        assert calls[0].function.arguments == alone.message.tool_calls[0].function.arguments
        assert "city" in json.loads(calls[0].function.arguments)  # each choice parsed its own call
    assert reply.choices[0].message.tool_calls[0].id != reply.choices[1].message.tool_calls[0].id


async def test_n_past_the_cap_is_a_400_naming_n(client, served):
    with pytest.raises(openai.BadRequestError) as err:
        await chat(client, served, n=MAX_CHOICES + 1)
    assert err.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError):
        await chat(client, served, n=0)


async def test_the_native_completion_route_still_refuses_n(node, served):
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"http://127.0.0.1:{node.api.port}/completion", json={"prompt": "x", "n": 2},
                            headers={"Authorization": f"Bearer {node.api_key}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


async def test_a_client_gone_mid_stream_frees_every_choice(node, client, served):
    """(ignore_eos and a long max_tokens: the choices cannot end by themselves within the test, so it is
    the client's going that stops them — review r54: a 400-token reply ended on its own in 0.1 s.)"""
    port = node.api.port
    body = {"model": served.id, "messages": MESSAGES, "max_tokens": 1500, "ignore_eos": True, "n": 4,
            "stream": True, "temperature": 0.9, "seed": 1}
    async with httpx.AsyncClient(timeout=30) as http, http.stream(
            "POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
            headers={"Authorization": f"Bearer {node.api_key}"}) as resp:
        rid = resp.headers["x-request-id"]
        seen = 0
        async for line in resp.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= 8:
                break
    batcher = served.engine.batcher
    await wait_until(lambda: batcher.active == 0 and served.lock.holders == 0 and not served.busy, timeout_s=20)
    assert not any(slot.busy for slot in batcher.slots)
    assert trace_of(node, rid).completion_tokens < 4 * 1500 // 4  # stopped, not run to its max_tokens


async def test_n_above_the_models_seats_is_a_400_not_a_hang(node, client, served):
    """n above max_concurrent (4 here) waited for ever for seats its own choices held, and the model
    served no one meanwhile (review r54); a 400 naming `n` now, as llama-server bounds n_cmpl by its slots."""
    async with asyncio.timeout(30):
        with pytest.raises(openai.BadRequestError) as err:
            await chat(client, served, n=served.lock.limit + 1)
    assert err.value.body["param"] == "n" and "at most 4" in err.value.body["message"]
    assert served.lock.holders == 0
    async with asyncio.timeout(30):
        _, reply = await chat(client, served, n=served.lock.limit, max_tokens=4)  # as many as the seats: served
    assert len(reply.choices) == served.lock.limit


async def test_concurrent_n_requests_take_their_seats_together(node, client, served):
    """Four n=2 requests at once: each took one seat for its first choice, then waited for a second that
    another held — none answered, nor anything else of the model (review r54). Seats are taken together now."""
    async with asyncio.timeout(120):
        replies = await asyncio.gather(*(chat(client, served, n=2, max_tokens=6, temperature=0.9, seed=i)
                                         for i in range(4)))
    assert all(len(reply.choices) == 2 for _, reply in replies)
    assert served.lock.holders == 0


async def test_a_seated_request_is_not_refused_by_the_queue_its_later_choices_see(node, client, served, monkeypatch):
    """Choice 0 holds every seat; the model's queue then fills (other clients). The later choices, seated
    already, still ran the queue-full check and the request failed with a 429 while those queued behind it
    were served (review r56). Only a run that queues is checked now."""
    from node.inference import choices as choices_mod

    prepare = choices_mod.ChoicesRun.prepare

    async def then_the_queue_is_full(self):
        await prepare(self)
        monkeypatch.setattr(node.models.config, "max_queue_per_model", served.waiting)  # full from now on

    monkeypatch.setattr(choices_mod.ChoicesRun, "prepare", then_the_queue_is_full)
    _, reply = await chat(client, served, n=2, max_tokens=4, temperature=0.9, seed=3)
    assert len(reply.choices) == 2


async def test_time_per_output_token_is_one_replys(node, client, served):
    """The choices are generated side by side: the request's decode time runs to the end of the
    longest one, and a reply's time per output token is its own. Over all their tokens n=4 read a
    quarter of it (a bug hunt, 2026-12-07); over their mean count, choices of unequal length read
    about twice it (review r64: lengths 22, 5, 1, 6 read 7.8 ms against 3.5)."""
    for seed in range(1, 60):  # seeded draws cut short by stop sequences: one long, one short
        raw = await client.chat.completions.with_raw_response.create(
            model=served.id, messages=MESSAGES, n=4, max_tokens=60, temperature=1.0, seed=seed,
            stop=[" the", " a "], logprobs=True)
        lengths = [len(c.logprobs.content) for c in raw.parse().choices]
        if max(lengths) >= 20 and min(lengths) <= 5:
            break
    else:
        pytest.fail("no seed gave choices of unequal length")
    trace = trace_of(node, raw.headers["x-request-id"])
    assert trace.choices == 4 and trace.decode_ms is not None  # (a stop sequence's tokens are not shown)
    # the longest choice decodes from about the first token to the end: its time per token
    assert trace.tpot_ms == pytest.approx(trace.decode_ms / (max(lengths) - 1), rel=0.2), (lengths, trace.summary_line())


async def test_decode_speed_is_one_replys_as_its_time_per_token(node, client, served):
    """tok_per_sec (the summary line, the Requests tab's tok/s, /api/status) counted every choice's
    tokens over the one decode time: n=4 read four times a reply's speed, tok_per_sec=565.6 beside
    tpot_ms=7.8 on one line (review r64). It is one reply's now, as tpot_ms."""
    rid, reply = await chat(client, served, n=4, temperature=0, max_tokens=12)
    assert {c.finish_reason for c in reply.choices} == {"length"}  # greedy, cut at max_tokens: 12 tokens each
    trace = trace_of(node, rid)
    assert trace.completion_tokens == 48 and trace.decode_ms
    assert trace.tok_per_sec == pytest.approx(12 / (trace.decode_ms / 1000))
    assert trace.tpot_ms == pytest.approx(trace.decode_ms / 11)
    line = trace.summary_line()
    assert f"tok_per_sec={round(trace.tok_per_sec, 1)} " in line and f"tpot_ms={round(trace.tpot_ms, 1)}" in line
