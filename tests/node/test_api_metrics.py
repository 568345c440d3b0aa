"""/metrics after known traffic on a real node (raw HTTP: the openai client's first use builds its
pydantic models on the test's loop, which the loop police fails on a loaded machine):
requests, tokens and errors by HTTP status match what was sent; a prompt refused before a route
(too long, overloaded) is not counted as processed."""

from __future__ import annotations

import json
import time

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from node.metrics import NodeMetrics
from node.trace import RequestTrace
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.sse import DONE, sse_data
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("metrics")
    async with running_node(node_config(base / "data", tiny_model(base))) as n:
        yield n


async def post(node, body) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{node.api.port}/v1/chat/completions", json=body,
            headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status, await r.text()


async def usage(node, body) -> dict:
    """The reply's usage (a stream's from its last chunk)."""
    status, text = await post(node, body)
    assert status == 200, text
    if not body.get("stream"):
        return json.loads(text)["usage"]
    chunks = [json.loads(d) for d in sse_data(text) if d != DONE]
    return next(c["usage"] for c in reversed(chunks) if c.get("usage"))


async def samples(node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{node.api.port}/metrics") as r:
        text = await r.text()
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for family in text_string_to_metric_families(text) for smp in family.samples}


def delta(before, after, name, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


async def idle(node):
    await wait_until(lambda: node.traces.in_flight == 0, 30, what="no request in flight")


async def test_known_traffic_is_counted_once_with_errors_by_status(node):
    model_id = node.models.all()[0].id
    before = await samples(node)
    t0 = time.monotonic()
    prompt = completion = 0
    for body in ({"max_tokens": 4}, {"max_tokens": 4},
                 {"max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}):
        used = await usage(node, {"model": model_id, "messages": [{"role": "user", "content": "hello"}],
                                  "temperature": 0, **body})
        prompt, completion = prompt + used["prompt_tokens"], completion + used["completion_tokens"]
    assert (await post(node, {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}))[0] == 404
    # a prompt longer than the context: refused (400) after tokenizing, never processed
    too_long = {"model": model_id, "messages": [{"role": "user", "content": "hello " * 400}]}
    assert (await post(node, too_long))[0] == 400
    await idle(node)
    after = await samples(node)
    local = {"model": model_id, "route": "local"}
    assert delta(before, after, "swarmllm_requests_total", outcome="ok", **local) == 3
    assert delta(before, after, "swarmllm_completion_tokens_total", **local) == completion
    prompt_total = sum(delta(before, after, "swarmllm_prompt_tokens_total", model=model_id, route=r)
                       for r in ("local", "none"))
    assert prompt_total == prompt  # the refused prompt's 2000 tokens are not in it
    assert delta(before, after, "swarmllm_ttft_seconds_count", **local) == 3
    # durations in seconds, Prometheus' base unit (they were ms: 3 requests summed to more than
    # the seconds that had passed)
    elapsed = time.monotonic() - t0
    for name in ("swarmllm_ttft_seconds_sum", "swarmllm_request_duration_seconds_sum"):
        assert 0 < delta(before, after, name, **local) <= elapsed, name
    assert delta(before, after, "swarmllm_request_errors_total", model="unknown", route="none", status="404") == 1
    assert delta(before, after, "swarmllm_request_errors_total", model=model_id, route="none", status="400") == 1
    assert delta(before, after, "swarmllm_requests_total", model=model_id, route="none", outcome="error") == 1


async def test_an_overloaded_request_is_a_429_error_with_no_prompt_processed(tmp_path):
    base = tmp_path
    async with running_node(node_config(base / "data", tiny_model(base), max_queue_per_model=0)) as busy:
        model_id = busy.models.all()[0].id
        got = await post(busy, {"model": model_id, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2})
        assert got[0] == 429, got
        await idle(busy)
        after = await samples(busy)
    assert delta({}, after, "swarmllm_request_errors_total", model=model_id, route="none", status="429") == 1
    assert not any(name == "swarmllm_prompt_tokens_total" and value for (name, _), value in after.items())


async def test_a_request_whose_client_left_mid_stream_is_counted_cancelled_not_as_a_duration(node):
    """A client gone mid-stream (an editor's autocomplete closes the last keystroke's request) was a
    sample of swarmllm_request_duration_seconds and the time-per-token histogram, its duration cut
    at the moment it left: a storm of them pulled the p50/p95 a dashboard shows far below what a
    finished reply takes (2026-12-07). It is counted under outcome="cancelled", as vLLM's
    finished_reason="abort", and its duration is no latency sample; a finished one still is."""
    model_id = node.models.all()[0].id
    local = {"model": model_id, "route": "local"}
    before = await samples(node)
    cancelled = node.traces.counts["cancelled"]
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://127.0.0.1:{node.api.port}/v1/chat/completions",
                          json={"model": model_id, "messages": [{"role": "user", "content": "hello"}],
                                "max_tokens": 200, "stream": True},
                          headers={"Authorization": f"Bearer {node.api_key}"}) as r:
            assert r.status == 200, await r.text()
            await r.content.readline()  # the first chunk: generating
            r.close()  # the client goes
    await wait_until(lambda: node.traces.counts["cancelled"] > cancelled, 30, what="the request to end cancelled")
    await idle(node)
    after = await samples(node)
    assert delta(before, after, "swarmllm_requests_total", outcome="cancelled", **local) == 1
    assert delta(before, after, "swarmllm_requests_total", outcome="ok", **local) == 0
    for name in ("swarmllm_request_duration_seconds_count", "swarmllm_time_per_output_token_seconds_count"):
        assert delta(before, after, name, **local) == 0, name
    await usage(node, {"model": model_id, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})
    await idle(node)
    assert delta(after, await samples(node), "swarmllm_request_duration_seconds_count", **local) == 1


def _cut_trace(**fields) -> RequestTrace:
    trace = RequestTrace("m", "chat.completions", route="local", resolved=True, admitted=0.0, **fields)
    trace.outcome = "cancelled"
    return trace


def _counts(metrics: NodeMetrics) -> dict[str, float]:
    return {s.name: s.value for fam in metrics.registry.collect() for s in fam.samples
            if s.name in ("swarmllm_request_duration_seconds_count", "swarmllm_time_per_output_token_seconds_count")
            and s.labels.get("model") == "m"}


async def test_a_request_given_up_before_its_first_token_or_after_its_reply_keeps_its_duration():
    """Review r42 (2026-12-07): leaving cancelled requests out of the duration histogram also left out
    a user who gave up after 90 s in the queue (no first token: the wait is the latency they met) and a
    stream whose whole reply was sent before the client closed at the last write; only a reply cut
    mid-way is no sample."""
    metrics = NodeMetrics()
    metrics.observe_trace(_cut_trace(finished=90.0))  # gave up waiting
    assert _counts(metrics)["swarmllm_request_duration_seconds_count"] == 1
    metrics.observe_trace(_cut_trace(dequeued=0.1, assembled=0.2, first_token=0.5, finished=20.0,
                                     completion_tokens=400, finish_reason="stop"))  # whole reply sent
    assert _counts(metrics) == {"swarmllm_request_duration_seconds_count": 2,
                                "swarmllm_time_per_output_token_seconds_count": 1}
    metrics.observe_trace(_cut_trace(dequeued=0.1, assembled=0.2, first_token=0.5, finished=3.0,
                                     completion_tokens=40))  # left mid-reply
    assert _counts(metrics) == {"swarmllm_request_duration_seconds_count": 2,
                                "swarmllm_time_per_output_token_seconds_count": 1}
