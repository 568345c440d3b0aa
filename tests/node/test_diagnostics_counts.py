"""The diagnostics report's header counts every request the failure ring keeps as failed: a stream
the node cut off because its client took nothing (`stalled`) too (review r28, finding 2: the header
said "1 failed" while the ring below it listed two stalled streams besides the error)."""

from __future__ import annotations

import aiohttp

from node.trace import RequestTrace
from tests.support.nodes import node_config, running_node


async def test_the_header_counts_stalled_streams_as_failed(tmp_path):
    async with running_node(node_config(tmp_path / "data")) as node:
        hub = node.traces
        # how the API ends them: ok, an error, a client gone, two streams whose client stopped reading
        for outcome in ("ok", "error", "cancelled", "stalled", "stalled"):
            trace = hub.start(RequestTrace(model="m", operation="chat.completions", stream=True))
            hub.finish(trace, outcome, error_type="Err" if outcome == "error" else None)
        async with aiohttp.ClientSession() as s, s.get(
                f"http://127.0.0.1:{node.api.port}/api/admin/diagnostics",
                headers={"Authorization": f"Bearer {node.api_key}"}) as r:
            assert r.status == 200
            text = await r.text()
        header = next(line for line in text.splitlines() if line.startswith("requests: "))
        assert header == "requests: 5 started, 1 ok, 3 failed (2 stalled), 1 cancelled", header
        failures = text.split("-- recent inference failures --")[1].split("-- recent requests --")[0]
        assert failures.count("outcome=stalled") == 2, failures
