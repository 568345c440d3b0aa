"""Continuous batching and the prefix cache through a real node on 127.0.0.1 and the official
`openai` client, with the default model: concurrent requests give the text they give alone, more
than max_concurrent queue (queue_ms and the model's `waiting` say so), a conversation's second
turn reuses the first's KV (usage.prompt_tokens_details.cached_tokens, the trace's summary line),
a client that goes away mid-stream frees its sequence for the others."""

from __future__ import annotations

import asyncio

import openai
import pytest
import pytest_asyncio

from node.resources import default_model_path
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama,
              pytest.mark.skipif(not default_model_path().exists(), reason="the default model is not in resources/")]

MAX_CONCURRENT = 4
QUESTIONS = ["What does len() return?", "How do I open a file?", "Explain list.append.", "What is a dict?",
             "How does range work?", "What is None?", "Describe str.split.", "What does zip do?"]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("batching")
    config = node_config(base / "data", include_default_model=True, max_concurrent=MAX_CONCURRENT, kv_cache_seqs=4)
    async with running_node(config) as n:
        yield n


@pytest.fixture
def client(node):
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key, max_retries=0)


@pytest.fixture
def served(node):
    return node.models.all()[0]


def trace_of(node, request_id: str):
    return next(t for t in node.traces.recent if t.request_id == request_id)


async def ask(client, served, question: str, **kw):
    raw = await client.chat.completions.with_raw_response.create(
        model=served.id, messages=[{"role": "user", "content": question}], **{"max_tokens": 24, **kw})
    return raw.headers["x-request-id"], raw.parse()


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 7}], ids=["greedy", "seeded"])
async def test_eight_at_once_give_the_text_each_gives_alone_and_the_rest_queue(node, client, served, sampling):
    alone = [(await ask(client, served, q, **sampling))[1].choices[0].message.content for q in QUESTIONS]
    seen = {"waiting": 0, "active": 0}

    def watch(event, model):
        seen["waiting"] = max(seen["waiting"], model.waiting)
        seen["active"] = max(seen["active"], model.lock.holders)
    unsubscribe = node.models.subscribe(watch)
    try:
        results = await asyncio.gather(*(ask(client, served, q, **sampling) for q in QUESTIONS))
    finally:
        unsubscribe()
    assert [r.choices[0].message.content for _, r in results] == alone
    assert seen["active"] == MAX_CONCURRENT and seen["waiting"] >= 1  # 4 decode together, the others queue
    traces = [trace_of(node, rid) for rid, _ in results]
    queued = [t for t in traces if t.queue_ms > 5]
    assert len(queued) >= len(QUESTIONS) - MAX_CONCURRENT  # their wait is in queue_ms
    assert served.engine.batcher.max_active_seen == MAX_CONCURRENT
    assert not served.busy and served.waiting == 0 and served.lock.holders == 0


async def test_the_second_turn_of_a_conversation_reuses_the_first(node, client, served):
    messages = [{"role": "user", "content": "Tell me about the os module, in detail please."}]
    first = await client.chat.completions.create(model=served.id, messages=messages, max_tokens=32, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And os.path?"}]
    raw = await client.chat.completions.with_raw_response.create(model=served.id, messages=messages, max_tokens=16,
                                                                 temperature=0)
    second = raw.parse()
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens < cached < second.usage.prompt_tokens
    trace = trace_of(node, raw.headers["x-request-id"])
    assert trace.cached_tokens == cached and f"cached_tokens={cached}" in trace.summary_line()
    # asked again, streamed: everything but its last prompt token is cached now, and the reply is the same
    stream = await client.chat.completions.create(model=served.id, messages=messages, max_tokens=16, temperature=0,
                                                  stream=True, stream_options={"include_usage": True})
    text, usage = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    assert text == second.choices[0].message.content
    assert usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 1  # all but the last token


async def test_a_client_gone_mid_stream_frees_its_sequence_for_the_others(node, client, served):
    reference = (await ask(client, served, QUESTIONS[1], temperature=0, max_tokens=48))[1].choices[0].message.content
    batcher = served.engine.batcher

    async def abandon():
        stream = await client.chat.completions.create(
            model=served.id, messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=200, temperature=0,
            stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await stream.close()  # the connection goes: the node cancels the run

    other = asyncio.ensure_future(ask(client, served, QUESTIONS[1], temperature=0, max_tokens=48))
    await abandon()
    await wait_until(lambda: batcher.active <= 1, 20, 0.01, "the abandoned sequence to leave the batch")
    _, reply = await other
    assert reply.choices[0].message.content == reference
    await wait_until(lambda: served.lock.holders == 0 and not served.busy, 20, 0.02, "the model to be idle")
    cancelled = [t for t in node.traces.recent if t.outcome == "cancelled"]
    assert cancelled and cancelled[-1].completion_tokens < 200
