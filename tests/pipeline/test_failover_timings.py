"""The request's timings after a failover mid-stream: ttft_ms is still the time to the first token.

A failover assembles a second chain after tokens were already streamed; that second assembly must
not move the start of ttft past the first token (it read 0.0 in the `DIAG: request complete` line,
the admin trace and the metrics after every failover: the first token looked instant)."""

from __future__ import annotations

import json
import re

import pytest

from tests.pipeline.swarm import (
    llama_greedy,
    run,
    split_model,
    start_slice_node,
    stream_and_signal,
    wait_for_route,
    wait_peers,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

PROMPT = "tell me about the swarm"


def test_ttft_after_a_failover_mid_stream_is_the_first_tokens(tmp_path):
    model = split_model(tmp_path)
    a = start_slice_node(tmp_path, "a", model, "0-1")
    procs = [a, *(start_slice_node(tmp_path, name, model, layers, bootstrap=[a.peer_port])
                  for name, layers in (("b", "2-3"), ("b2", "2-3"), ("c", "4-5")))]
    try:
        async def ready():
            for p in procs:
                await p.async_wait_ready()
            await wait_peers(a, 3)
            short = {(await p.async_get_json("/api/admin/stats"))["short_id"]: p for p in procs}
            return await wait_for_route(a, "split6"), short
        model_id, by_short = run(ready())
        result = run(stream_and_signal(a, model_id, PROMPT, 40, lambda nodes: by_short[nodes[1]], after=6))
        assert result.outcome == "ok", result.error
        assert result.text == llama_greedy(model, PROMPT, 40)
        request_id = {k.lower(): v for k, v in result.headers.items()}["x-request-id"]

        def summary():
            found = [ln for ln in a.node_log().splitlines() if "DIAG: request complete" in ln and request_id in ln]
            return found[-1] if found else None
        line = run(wait_until(summary, 10, 0.05, "the request's summary line"))
        assert "assemblies=2" in line and "outcome=ok" in line, line
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        ttft, decode, total = float(fields["ttft_ms"]), float(fields["decode_ms"]), float(fields["total_ms"])
        assert ttft > 0, line
        assert ttft + decode <= total + 1, line
        status, body = a.get("/api/admin/requests")
        assert status == 200
        trace = next(t for t in json.loads(body)["recent"] if t["request_id"] == request_id)
        assert trace["ttft_ms"] > 0, trace
    finally:
        for p in procs:
            p.terminate()
