"""One node serving two models: one is unloaded and loaded again while the other streams.

A forced unload of model A mid-stream ends A's streams with an error event and leaves B's streams
untouched. While A's weights are being freed, /v1/models and the admin API say "unloading" (they
said "loaded"), and a load asked for meanwhile comes after the unload: until 2026-12-06 it answered
200 "loaded" at once and the unload then freed the model, so the user's Load left it unloaded."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
import openai
import pytest
import pytest_asyncio

from node.inference.llama_engine import LlamaEngine
from node.inference.manager import ModelManager
from node.inference.synth import SynthSpec
from tests.support.nodes import TINY, node_config, openai_client, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("multimodel")
    alpha = tiny_model(base, SynthSpec(**{**TINY.__dict__, "name": "alpha", "seed": 1}), "alpha.gguf")
    beta = tiny_model(base, SynthSpec(**{**TINY.__dict__, "name": "beta", "seed": 2}), "beta.gguf")
    async with running_node(node_config(base / "data", alpha, beta)) as n:
        yield n


@pytest.fixture
def client(node):
    """Made off the loop: the SDK builds its types on first use (0.3 s of CPU)."""
    return openai_client(node)


def ids(node) -> tuple[str, str]:
    by_name = {m.entry.name: m.id for m in node.models.all()}
    return by_name["alpha"], by_name["beta"]


async def admin(node, path: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{node.api.port}{path}",
                                                    headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status, json.loads(await r.text())


async def listed_states(node) -> dict[str, str]:
    """/v1/models: each model's state."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{node.api.port}/v1/models",
                                                   headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        return {m["id"]: m["state"] for m in (await r.json())["data"]}


async def stream(client, model: str, seed: int) -> tuple[str, str | None]:
    """("ok", finish_reason) or ("error", message) of one streamed chat."""
    try:
        chunks = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"count {seed}"}], max_tokens=200,
            temperature=1, seed=seed, stream=True)
        finish = None
        async for chunk in chunks:
            if chunk.choices:
                finish = chunk.choices[0].finish_reason or finish
        return "ok", finish
    except openai.APIError as exc:
        return "error", exc.message


async def test_unload_and_reload_one_model_while_the_other_streams(node, client, monkeypatch):
    a, b = ids(node)
    closing, release = threading.Event(), threading.Event()
    real_close = LlamaEngine.close

    def held_close(self):  # in the model's thread: the unload stays in progress until released
        if self.model_id == a:
            closing.set()
            release.wait(30)
        return real_close(self)

    monkeypatch.setattr(LlamaEngine, "close", held_close)
    real_submit = LlamaEngine.submit

    def paced_submit(self, job, channel, is_eog, vocab=None):  # 5 ms a token: the unload lands mid-stream
        return real_submit(self, job, channel, lambda token: time.sleep(0.005) or is_eog(token), vocab)

    monkeypatch.setattr(LlamaEngine, "submit", paced_submit)
    loads_asked: list[str] = []
    real_load = ModelManager.async_load

    async def noted_load(self, model_id, **kw):  # runs on to its first wait in the same loop step
        loads_asked.append(model_id)
        return await real_load(self, model_id, **kw)

    monkeypatch.setattr(ModelManager, "async_load", noted_load)
    tasks = [asyncio.create_task(stream(client, m, i)) for i, m in enumerate([a, a, b, b])]
    load = None
    try:
        served_a, served_b = node.models.get(a), node.models.get(b)
        await wait_until(lambda: served_a.lock.holders == 2 and served_b.lock.holders == 2,
                         what="two streams on each model")
        unload = asyncio.create_task(admin(node, f"/api/admin/models/{a}/unload?force=1"))
        await wait_until(closing.is_set, what="alpha's weights being freed")
        assert await listed_states(node) == {a: "unloading", b: "loaded"}
        load = asyncio.create_task(admin(node, f"/api/admin/models/{a}/load"))
        await wait_until(lambda: a in loads_asked, what="the load reaching the node")
        release.set()
        status, body = await unload
        assert status == 200 and body["model"]["state"] == "unloaded", body
        status, body = await load
        assert status == 200 and body["model"]["state"] == "loaded", body
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        release.set()
        for t in [*tasks, *([load] if load else [])]:
            t.cancel()
        await asyncio.gather(*tasks, *([load] if load else []), return_exceptions=True)
    # alpha's streams end with the unload's error, beta's run in full
    assert [r[0] for r in results[:2]] == ["error", "error"], results
    assert all("was unloaded" in r[1] for r in results[:2]), results
    assert results[2:] == [("ok", "length"), ("ok", "length")], results
    # the load asked for during the unload came after it: alpha is loaded and serves
    assert served_a.state == "loaded" and served_a.engine is not None
    assert await listed_states(node) == {a: "loaded", b: "loaded"}
    assert await stream(client, a, 9) == ("ok", "length")
    await client.close()


async def test_two_unloads_at_once_one_cancelled_then_a_load(node, monkeypatch):
    """A second unload waits for the first (one at a time). Two that overlapped, one of them
    cancelled (its HTTP client gone), let a load in between them: the other then closed the new
    engine, and the first engine's weights stayed loaded for good under a model said 'unloaded'
    (found in review, 2026-12-06)."""
    a, _ = ids(node)
    served = node.models.get(a)
    if served.state != "loaded":
        await node.models.async_load(a)
    first_engine = served.engine
    closing, release = threading.Event(), threading.Event()
    closed: list[object] = []
    real_close = LlamaEngine.close

    def held_close(self):
        if self.model_id == a:
            closed.append(self)
            closing.set()
            release.wait(30)
        return real_close(self)

    monkeypatch.setattr(LlamaEngine, "close", held_close)
    u1 = asyncio.create_task(node.models.async_unload(a, force=True))
    try:
        await wait_until(closing.is_set, what="the first unload freeing the weights")
        u2 = asyncio.create_task(node.models.async_unload(a, force=True))
        await asyncio.sleep(0.05)
        u2.cancel()  # its client went away
        await asyncio.gather(u2, return_exceptions=True)
        assert served.unloading is not None and served.state == "unloading"  # still the first's
        load = asyncio.create_task(node.models.async_load(a, after_unload=True))
        await asyncio.sleep(0.05)
        assert not load.done()  # it waits for the unload under way
        release.set()
        await asyncio.wait_for(u1, 30)
        await asyncio.wait_for(load, 60)
    finally:
        release.set()
    assert closed == [first_engine]  # the first engine was closed, the new one was not
    assert served.state == "loaded" and served.engine is not None and served.engine is not first_engine
