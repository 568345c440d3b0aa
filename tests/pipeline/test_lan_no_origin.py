"""A LAN swarm with no internet: A serves auto8 whole, downloaded earlier from the Hub stand-in (now
gone) or given the file (no origin named at all); B and C click "Help serve" with room for about half the layers each. No origin can
be read: B and C learn the header from A (checked against its advertised hash), open a partial model
from it, fetch the layers they choose from A, and serve them; with A paused, a chat (the official
openai client) goes through the chain B + C and answers what llama.cpp answers on the whole file.
Until 2026-12-06 Help serve failed there (the partial model's open probed the origin)."""

from __future__ import annotations

import asyncio
import hashlib
import json

import aiohttp
import openai
import pytest

from node.inference.synth import write_gguf
from tests.pipeline.swarm import llama_greedy
from tests.pipeline.test_autoserve import AUTO8, held, per_layer
from tests.pipeline.test_help_serve_origin import _HubThread
from tests.support.processes import NodeProcess, hub_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

ARGS = ["--no-default-model", "--no-mdns", "--slice-dtype", "f32", "--activation-bits", "32", "--n-threads", "1"]
URL = "hf://org/auto8/auto8.gguf"
PROMPT = "who holds the layers?"


async def _call(node: NodeProcess, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.request(method, node.base + path, json=body, headers=node.auth) as r:
        return r.status, await r.json()


async def _holder(tmp_path, model, downloaded: bool) -> tuple[NodeProcess, str]:
    """A serving auto8 whole: downloaded from the Hub stand-in (which then goes), or given the file
    (no origin named at all). (A, model id)"""
    sha256 = hashlib.sha256(model.read_bytes()).hexdigest()
    if not downloaded:
        a = NodeProcess(tmp_path / "a", args=[*ARGS, "--model", str(model)])
        await a.async_wait_ready(90)
        return a, f"auto8-{sha256[:8]}"
    hub = _HubThread(model.read_bytes())
    env = hub_env(hub.srv.hub, tmp_path / "hf-home")
    a = NodeProcess(tmp_path / "a", args=ARGS, env=env)
    try:
        await a.async_wait_ready(90, path="/health")
        status, body = await _call(a, "POST", "/api/admin/models/download", {"url": URL})
        assert status in (200, 201, 202), body

        async def a_loaded() -> bool:
            status, _ = await _call(a, "POST", f"/api/admin/models/auto8-{sha256[:8]}/load")
            return status == 200
        await wait_until(a_loaded, 60, 0.5, "A's download to land and load")
    except BaseException:
        a.terminate(timeout_s=20)
        raise
    finally:
        hub.close()  # the internet goes: nothing below can reach the origin
    return a, f"auto8-{sha256[:8]}"


@pytest.mark.parametrize("downloaded", [True, False], ids=["origin-gone", "no-origin-named"])
async def test_help_serve_with_no_origin_takes_the_layers_from_the_whole_holder(tmp_path, downloaded):
    model = write_gguf(tmp_path / "auto8.gguf", AUTO8)
    expected = await asyncio.to_thread(llama_greedy, model, PROMPT, 16)
    a, model_id = await _holder(tmp_path, model, downloaded)
    sha256 = hashlib.sha256(model.read_bytes()).hexdigest()
    env = hub_env("http://127.0.0.1:9", tmp_path / "hf-home")
    nodes = [a]
    try:
        helpers = []
        for name in ("b", "c"):
            p = NodeProcess(tmp_path / name, args=[*ARGS, "--bootstrap", f"127.0.0.1:{a.peer_port}"], env=env)
            nodes.append(p)
            helpers.append(p)
            await p.async_wait_ready(90, path="/health")

            async def knows_it(p=p) -> bool:
                status, body = await _call(p, "GET", "/v1/models")
                return status == 200 and any(m["id"] == model_id for m in body["data"])
            await wait_until(knows_it, 60, 0.3, f"{name} to register A's model from A's header")
            status, body = await _call(p, "POST", "/api/admin/contribute", {"model": model_id, "budget_mb": 4})
            assert status == 200, body

            async def serves(p=p) -> bool:
                return bool((await held([p]))[p.name])
            await wait_until(serves, 90, 0.5, f"{name} to serve the layers it chose")

        async def covered() -> bool:
            return min(per_layer(await held(helpers))) >= 1
        await wait_until(covered, 90, 0.5, "B and C to cover every layer between them")
        for p in helpers:
            log = p.node_log()
            assert "partial model created from the swarm's header" in log, log[-3000:]
            fetched = [ln for ln in log.splitlines() if "parts fetched from a peer" in ln]
            assert fetched and all("spot_checked=False" in ln for ln in fetched), fetched
            [d] = (tmp_path / p.name / "models").glob("*.partial")
            manifest = json.loads((d / "manifest.json").read_text())
            assert manifest["sha256"] == sha256  # the swarm's id: it chains with A's file
            assert set(manifest["unchecked"]) == set(manifest["complete"])  # no origin has vouched yet

        status, body = await _call(a, "POST", "/api/admin/contribute", {"paused": True})
        assert status == 200, body
        b = helpers[0]

        def ask() -> openai.types.chat.ChatCompletion:
            client = openai.OpenAI(base_url=b.base + "/v1", api_key=b.api_key, max_retries=0, timeout=120)
            return client.chat.completions.with_raw_response.create(
                model=model_id, messages=[{"role": "user", "content": PROMPT}], max_tokens=16, temperature=0)

        async def chained() -> bool:  # once B no longer counts on A (its pause announced)
            raw = await asyncio.to_thread(ask)
            return raw.headers.get("x-swarm-route") == "distributed" and int(raw.headers["x-swarm-segments"]) >= 2
        await wait_until(chained, 60, 0.5, "B to route through the chain B + C")
        raw = await asyncio.to_thread(ask)
        assert raw.parse().choices[0].message.content == expected
    finally:
        for n in nodes:
            n.terminate(timeout_s=20)
