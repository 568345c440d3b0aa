"""node.log at the default level over a day: a request is ONE INFO line, its `DIAG: request
complete` summary on the coordinator. The first `DIAG: pipeline assembled` (the route the
summary names again) was INFO on the coordinator; a segment's `DIAG: KV session freed` (each slice, each
request whose session was not kept: every cancelled one) was INFO too, on the coordinator and on
every peer holding a slice, so an editor's cancelled completions filled the peers' logs with lines
that say nothing a user can act on. They are DEBUG (-v) now; a failover's
new route (`attempt=2`) stays INFO."""

from __future__ import annotations

import logging

import aiohttp

from tests.pipeline.swarm import split_model
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

REQUESTS = 4


async def test_a_cancelled_split_request_frees_its_sessions_without_info_lines(tmp_path, caplog):
    model = split_model(tmp_path)
    common = dict(slice_dtype="f32", slice_kv_dtype="f32", activation_bits=32)
    async with running_node(node_config(tmp_path / "a", model, layers="0-2", **common)) as a:
        boot = [f"127.0.0.1:{a.peers.listen_port}"]
        async with running_node(node_config(tmp_path / "b", model, layers="3-5", bootstrap=boot, **common)) as b, \
                aiohttp.ClientSession() as s:
            auth = {"Authorization": f"Bearer {a.api_key}"}
            url = f"http://127.0.0.1:{a.api.port}/v1/chat/completions"

            async def routed() -> str | None:
                async with s.get(f"http://127.0.0.1:{a.api.port}/v1/models", headers=auth) as r:
                    ids = [m["id"] for m in (await r.json())["data"] if m["name"] == "split6"]
                return ids[0] if ids and a.peers.link(b.node_id) else None
            model_id = await wait_until(routed, 60, 0.1, "a routing split6 over b")
            caplog.clear()
            caplog.set_level(logging.INFO)
            caplog.set_level(logging.DEBUG, logger="node.inference.pipeline.worker")  # (and the handler)
            for i in range(REQUESTS):
                body = {"model": model_id, "max_tokens": 400, "temperature": 0, "stream": True,
                        "messages": [{"role": "user", "content": f"count {i}"}]}
                async with s.post(url, json=body, headers=auth) as r:
                    assert r.status == 200
                    await r.content.readline()  # the first event: the sessions are open on a and b
                # the connection closed mid-stream: the coordinator cancels, both segments free

                def done(n=i + 1) -> bool:
                    return a.traces.counts["cancelled"] >= n and a.traces.in_flight == 0
                await wait_until(done, 30, 0.05, "the request to end cancelled")

            def freed() -> bool:
                return a.slice_host.session_count() == 0 and b.slice_host.session_count() == 0
            await wait_until(freed, 30, 0.05, "both nodes to free the cancelled requests' sessions")
            info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    summaries = [m for m in info if m.startswith("DIAG: request complete")]
    assert len(summaries) == REQUESTS and len(info) == REQUESTS, info  # a request: one INFO line, on both nodes
    frees = [r for r in caplog.records if "KV session freed" in r.getMessage()]
    assert frees, "the sessions were freed (DEBUG lines)"
    noisy = [r.getMessage() for r in frees if r.levelno >= logging.INFO]
    assert not noisy, noisy
