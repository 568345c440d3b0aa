""""Help serve" on a node without the file takes the origin a holder names now. A laptop that
learned a model's header from a holder with no origin (a file copied onto it) could not help serve
once another holder that had downloaded it joined: the origin of the first advert was kept, and
`POST /api/admin/contribute` answered 500 "its holders name no origin" until a restart."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest

from node.inference.synth import write_gguf
from tests.pipeline.test_autoserve import AUTO8
from tests.support.hubserver import HubServer
from tests.support.processes import NodeProcess, hub_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama]

ARGS = ["--no-default-model", "--no-mdns", "--slice-dtype", "f32", "--activation-bits", "32", "--n-threads", "1"]


class _HubThread:
    """A HubServer on a loop of its own thread (the nodes are other processes)."""

    def __init__(self, data: bytes):
        self.srv = HubServer(data, path="/org/auto8/resolve/main/auto8.gguf")
        self.srv.uses_per_signature = 1_000_000
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self.srv.start(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.srv.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


async def _call(node: NodeProcess, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.request(method, node.base + path, json=body, headers=node.auth) as r:
        return r.status, await r.json()


async def test_help_serve_uses_the_origin_a_later_holder_names(tmp_path):
    model = write_gguf(tmp_path / "auto8.gguf", AUTO8)
    hub = _HubThread(model.read_bytes())
    env = hub_env(hub.srv.hub, tmp_path / "hf-home")
    nodes: list[NodeProcess] = []
    try:
        # A: the file copied onto it (no origin); B: a fresh laptop linked to A
        a = NodeProcess(tmp_path / "a", args=[*ARGS, "--model", str(model)], env=env)
        nodes.append(a)
        await a.async_wait_ready(90)
        b = NodeProcess(tmp_path / "b", args=[*ARGS, "--bootstrap", f"127.0.0.1:{a.peer_port}"], env=env)
        nodes.append(b)
        await b.async_wait_ready(90, path="/health")
        model_id = f"auto8-{hub.srv.sha256[:8]}"

        async def b_knows_it() -> bool:
            status, body = await _call(b, "GET", "/v1/models")
            return status == 200 and any(m["id"] == model_id for m in body["data"])
        await wait_until(b_knows_it, 60, 0.3, "B to register A's model from its header")

        # C downloads the same file from the Hub (its origin recorded), loads it and links with B
        c = NodeProcess(tmp_path / "c", args=[*ARGS, "--bootstrap", f"127.0.0.1:{b.peer_port}"], env=env)
        nodes.append(c)
        await c.async_wait_ready(90, path="/health")
        status, body = await _call(c, "POST", "/api/admin/models/download", {"url": "hf://org/auto8/auto8.gguf"})
        assert status in (200, 201, 202), body

        async def c_loaded() -> bool:
            status, _ = await _call(c, "POST", f"/api/admin/models/{model_id}/load")
            return status == 200
        await wait_until(c_loaded, 60, 0.5, "C's download to land and load")

        async def b_hears_c_origin() -> bool:
            status, body = await _call(b, "GET", "/api/admin/peers")
            return any(m.get("origin_url") for p in body["peers"] if p["state"] == "connected"
                       for m in p.get("models") or [])
        await wait_until(b_hears_c_origin, 60, 0.3, "C's advert (with its origin) to reach B")

        status, body = await _call(b, "POST", "/api/admin/contribute", {"model": model_id, "budget_mb": 4})
        assert status == 200, body

        def b_holds_layers() -> bool:  # only the layers it chose, fetched into a partial model
            held = sorted(p.name for p in (b.data_dir / "models").glob("*.partial/parts/layer-*.bin"))
            return 0 < len(held) < AUTO8.n_layers and "DIAG: serving slice" in b.node_log()
        await wait_until(b_holds_layers, 60, 0.5, "B to fetch its layers from the origin C named")
    finally:
        for n in nodes:
            n.terminate(timeout_s=20)
        hub.close()
