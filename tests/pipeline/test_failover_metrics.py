"""A failover and a wait for a lost peer show in GET /metrics (swarmllm_failovers_total by cause,
swarmllm_route_regain_wait_seconds by outcome), not only in the log and the request's trace."""

from __future__ import annotations

import asyncio
import re
import signal

import aiohttp
import pytest

from tests.pipeline.swarm import split_model, start_chain3, wait_for_route, wait_peers
from tests.support.sse import SseJson, delta_text
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow]


def _sample(text: str, name: str, **labels: str) -> float | None:
    """The value of metric `name` whose labels include `labels` (None: no such series)."""
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return None


def test_a_holder_restarted_mid_stream_counts_a_failover_and_a_regained_wait(tmp_path):
    model = split_model(tmp_path)
    procs = a, _b, c = start_chain3(tmp_path, model)
    try:
        async def go() -> tuple[dict | None, str]:
            for p in procs:
                await p.async_wait_ready()
            await wait_peers(a, 2)
            model_id = await wait_for_route(a, "split6")
            body = {"model": model_id, "messages": [{"role": "user", "content": "count the peers"}],
                    "max_tokens": 200, "stream": True, "temperature": 0}
            chunks, error = 0, None
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
                async with s.post(a.base + "/v1/chat/completions", json=body, headers=a.auth) as r:
                    assert r.status == 200
                    async for event in SseJson(r):
                        if "error" in event:
                            error = event
                            break
                        chunks += bool(delta_text(event))
                        if chunks == 4:  # the last segment's node dies and starts again (same identity)
                            await asyncio.to_thread(c.kill)
                            c.start()


                async def counted() -> str | None:  # the trace is observed as the request finishes
                    async with s.get(a.base + "/metrics") as r:
                        text = await r.text()
                    return text if _sample(text, "swarmllm_failovers_total", cause="link_drop") else None
                return error, await wait_until(counted, 20, 0.1, "the failover counted in /metrics")

        error, metrics = asyncio.run(go())
        assert error is None, error
        assert _sample(metrics, "swarmllm_failovers_total", cause="link_drop", route="distributed") == 1, metrics
        assert _sample(metrics, "swarmllm_route_regain_wait_seconds_count", outcome="regained") == 1, metrics
        assert _sample(metrics, "swarmllm_route_regain_wait_seconds_sum", outcome="regained") > 0
    finally:
        for p in procs:
            p.terminate()


def test_a_holder_silent_mid_stream_that_speaks_again_is_taken_back_and_its_wait_counted(tmp_path):
    """A Wi-Fi blip or a short pause (SIGSTOP) of the only holder of some layers, over before its
    link is found dead: the request waits for it and, once it speaks again on the same link, takes
    it back. The stream went on (was: an SSE 503 "left out after failing this request" once it
    spoke again, though it was there to serve), and /metrics counts the failover and the wait."""
    model = split_model(tmp_path)
    procs = a, _b, c = start_chain3(tmp_path, model)
    try:
        async def go() -> tuple[dict | None, int, str]:
            for p in procs:
                await p.async_wait_ready()
            await wait_peers(a, 2)
            model_id = await wait_for_route(a, "split6")
            body = {"model": model_id, "messages": [{"role": "user", "content": "count the peers"}],
                    "max_tokens": 200, "stream": True, "temperature": 0}
            chunks, error = 0, None
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
                async with s.post(a.base + "/v1/chat/completions", json=body, headers=a.auth) as r:
                    assert r.status == 200
                    async for event in SseJson(r):
                        if "error" in event:
                            error = event
                            break
                        chunks += bool(delta_text(event))
                        if chunks == 4:  # the last segment's node pauses until the request waits for it
                            c.send_signal(signal.SIGSTOP)
                            try:
                                await wait_until(lambda: "pipeline waiting for a lost peer" in a.node_log(), 20,
                                                 0.05, "the stream waiting for c")
                            finally:
                                c.send_signal(signal.SIGCONT)

                async def counted() -> str | None:  # the trace is observed as the request finishes
                    async with s.get(a.base + "/metrics") as r:
                        text = await r.text()
                    return text if _sample(text, "swarmllm_route_regain_wait_seconds_count") else None
                return error, chunks, await wait_until(counted, 20, 0.1, "the wait counted in /metrics")

        error, chunks, metrics = asyncio.run(go())
        assert error is None, error
        assert chunks > 4
        silences = sum(_sample(metrics, "swarmllm_failovers_total", cause=cause) or 0
                       for cause in ("ack_deadline", "result_deadline"))
        assert silences == 1, metrics
        assert _sample(metrics, "swarmllm_failovers_total", cause="link_drop") is None, metrics  # the same link
        assert _sample(metrics, "swarmllm_route_regain_wait_seconds_count", outcome="regained") == 1, metrics
        assert _sample(metrics, "swarmllm_route_regain_wait_seconds_sum", outcome="regained") > 0
        assert "DIAG: pipeline route regained" in a.node_log()
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.terminate()


def test_a_wait_for_a_lost_peer_cut_short_by_the_client_leaving_is_counted(tmp_path):
    """The client gives up while its stream waits for a holder to link again: the wait was in no
    metric and the trace said nothing of it. It counts as outcome=client_gone, and the request's
    trace (/api/admin/requests) lists it."""
    model = split_model(tmp_path)
    procs = a, _b, c = start_chain3(tmp_path, model)
    try:
        async def go() -> tuple[str, dict]:
            for p in procs:
                await p.async_wait_ready()
            await wait_peers(a, 2)
            model_id = await wait_for_route(a, "split6")
            body = {"model": model_id, "messages": [{"role": "user", "content": "count the peers"}],
                    "max_tokens": 200, "stream": True, "temperature": 0}
            chunks = 0
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
                async with s.post(a.base + "/v1/chat/completions", json=body, headers=a.auth) as r:
                    assert r.status == 200
                    request_id = r.headers["x-request-id"]
                    async for event in SseJson(r):
                        assert "error" not in event, event
                        chunks += bool(delta_text(event))
                        if chunks == 4:  # gone for good: the stream waits for it
                            await asyncio.to_thread(c.kill)
                            await wait_until(lambda: "pipeline waiting for a lost peer" in a.node_log(), 20,
                                             0.05, "the stream waiting for c")
                            break  # the client leaves: the connection closes

                async def counted() -> str | None:  # the trace is observed as the request finishes
                    async with s.get(a.base + "/metrics") as r:
                        text = await r.text()
                    return text if _sample(text, "swarmllm_route_regain_wait_seconds_count") else None
                metrics = await wait_until(counted, 20, 0.1, "the wait counted in /metrics")
                async with s.get(a.base + "/api/admin/requests", headers=a.auth) as r:
                    recent = (await r.json())["recent"]
            return metrics, next(t for t in recent if t["request_id"] == request_id)

        metrics, trace = asyncio.run(go())
        assert _sample(metrics, "swarmllm_route_regain_wait_seconds_count", outcome="client_gone") == 1, metrics
        assert _sample(metrics, "swarmllm_route_regain_wait_seconds_sum", outcome="client_gone") > 0
        assert _sample(metrics, "swarmllm_route_regain_wait_seconds_count", outcome="gave_up") is None, metrics
        assert trace["outcome"] == "cancelled", trace
        assert [w["outcome"] for w in trace["regain_waits"]] == ["client_gone"], trace
        assert trace["failure_causes"] == ["link_drop"], trace
        assert "DIAG: pipeline wait for a lost peer ended: the client left" in a.node_log()
    finally:
        for p in procs:
            p.terminate()
