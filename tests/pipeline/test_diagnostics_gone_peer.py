"""A peer that served a chain and then went away keeps its row in the diagnostics report's
`-- peer serving performance --` until the peer table forgets it (PEER_FORGET_S, an hour); the row
read as current (2026-12-07). Now it says GONE, with the link's state and when the peer was last
seen, and every row says how old its figures are.

Real nodes on loopback: a holds layers 0-2 and coordinates, b holds 3-5, then b stops."""

from __future__ import annotations

import re

import aiohttp
import openai

from tests.pipeline.swarm import split_model
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until


async def _perf_rows(node) -> list[str]:
    url = f"http://127.0.0.1:{node.api.port}/api/admin/diagnostics"
    async with aiohttp.ClientSession() as s, s.get(url, headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        assert r.status == 200
        text = await r.text()
    return text.split("-- peer serving performance --\n")[1].split("\n\n")[0].splitlines()


async def test_a_gone_peers_performance_row_says_it_is_gone(tmp_path):
    model = split_model(tmp_path)
    common = dict(slice_dtype="f32", slice_kv_dtype="f32", activation_bits=32)
    async with running_node(node_config(tmp_path / "a", model, layers="0-2", **common)) as a:
        boot = [f"127.0.0.1:{a.peers.listen_port}"]
        async with running_node(node_config(tmp_path / "b", model, layers="3-5", bootstrap=boot, **common)) as b:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{a.api.port}/v1", api_key=a.api_key, max_retries=0)
            try:
                async def routed() -> str | None:
                    ids = [m.id for m in (await client.models.list()).data if m.id.startswith("split6")]
                    return ids[0] if ids and a.peers.link(b.node_id) else None
                model_id = await wait_until(routed, 60, 0.1, "a routing split6 over b")
                reply = await client.chat.completions.create(model=model_id, max_tokens=4, temperature=0,
                                                             messages=[{"role": "user", "content": "count"}])
                assert reply.usage.completion_tokens >= 1
            finally:
                await client.close()
            rows = [row for row in await _perf_rows(a) if row.startswith(b.short_id)]
            assert len(rows) == 1 and re.search(r" measured=\d+s ago$", rows[0]), rows
            b_id = b.node_id
        # b has stopped: its link closes, the table keeps it (to dial it again) for PEER_FORGET_S
        await wait_until(lambda: (p := a.peers.peer(b_id)) is not None and p.state != "connected", 30, 0.1,
                         "a to see b's link down")
        rows = [row for row in await _perf_rows(a) if row.startswith(b_id[:8])]
    assert len(rows) == 1, rows
    assert re.search(r" rtt_ms=- .* measured=\d+s ago GONE \((disconnected|[a-z_]+), last seen \d+s ago\)$", rows[0]), rows
