"""A coordinator's per-peer serving figures (`-- peer serving performance --`, the planner's
measured ms/layer) are kept for the nodes of its routes only.

Found by the 2026-12-07 soak: the coordinator took a PeerPerf for every node id any RESULT's
telemetry named, whatever its route was. Each hop writes its own id there, but the list comes back
from the last segment, a peer: one whose telemetry named other ids (another version, a bug, a
member of an open swarm) added one entry per name per step, for good (the table's "removed" event,
which drops a forgotten peer's figures, never comes for an id no link had), and diagnostics printed
them all. Now telemetry naming a node off the attempt's route is not counted as its performance.

Real nodes on loopback: a holds layers 0-2 and coordinates, b holds 3-5; b's telemetry is made to
name a new node id every step, as such a peer's would."""

from __future__ import annotations

import itertools

import aiohttp

from node.inference.pipeline import wire
from tests.pipeline.swarm import split_model
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

REQUESTS = 3
TOKENS = 6


async def test_telemetry_naming_nodes_off_the_route_is_not_kept(tmp_path, monkeypatch):
    model = split_model(tmp_path)
    common = dict(slice_dtype="f32", slice_kv_dtype="f32", activation_bits=32)
    async with running_node(node_config(tmp_path / "a", model, layers="0-2", **common)) as a:
        boot = [f"127.0.0.1:{a.peers.listen_port}"]
        async with running_node(node_config(tmp_path / "b", model, layers="3-5", bootstrap=boot, **common)) as b, \
                aiohttp.ClientSession() as s:
            auth = {"Authorization": f"Bearer {a.api_key}"}

            async def routed() -> str | None:
                async with s.get(f"http://127.0.0.1:{a.api.port}/v1/models", headers=auth) as r:
                    ids = [m["id"] for m in (await r.json())["data"] if m["name"] == "split6"]
                return ids[0] if ids and a.peers.link(b.node_id) else None
            model_id = await wait_until(routed, 60, 0.1, "a routing split6 over b")

            async def chat(i: int) -> None:
                body = {"model": model_id, "max_tokens": TOKENS, "temperature": 0,
                        "messages": [{"role": "user", "content": f"count {i}"}]}
                async with s.post(f"http://127.0.0.1:{a.api.port}/v1/chat/completions", json=body,
                                  headers=auth) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["usage"]["completion_tokens"] >= 1

            await chat(0)  # an honest chain: b's figures are measured
            assert set(a.pipeline.perf) == {b.node_id}

            names = (f"{n:064x}" for n in itertools.count(1))
            honest = wire.HopTelemetry.as_wire

            def naming_others(tele: wire.HopTelemetry) -> dict:
                out = honest(tele)
                if tele.node == b.node_id:
                    out["node"] = next(names)  # a new id each step
                return out
            monkeypatch.setattr(wire.HopTelemetry, "as_wire", naming_others)
            for i in range(1, REQUESTS + 1):
                await chat(i)
            assert a.traces.counts["ok"] == REQUESTS + 1
            assert set(a.pipeline.perf) == {b.node_id}, f"{len(a.pipeline.perf)} nodes measured"
