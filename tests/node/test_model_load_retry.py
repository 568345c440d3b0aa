"""A failed whole-model load, reviewed (2026-12-06): which requests get its 500 and when a load is
tried again. A model without a readable vocabulary gets the 500 `model_load_failed` (was a retried
503) worded for that case; local embeddings are refused before they queue; a file replaced while
the load failed is the changed file (its identity is the one the load read); a failure lapses
after LOAD_FAILURE_RETRY_S or once another model's weights are freed; a browser SDK can read
`x-should-retry` (CORS)."""

from __future__ import annotations

import asyncio
import logging
import os

import aiohttp
import openai
import pytest
import pytest_asyncio

from node import const
from node.inference.llama_engine import LlamaEngine
from tests.node.test_model_load_failed import admin, ask, client, loads_failed, without_tensor
from tests.support.nodes import TINY, node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

APP = "http://localhost:3000"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("loadretry")
    good = tiny_model(base, TINY, "good.gguf")
    broken = without_tensor(good, base / "broken.gguf", "blk.1.ffn_down.weight")
    novocab = without_tensor(good, base / "novocab.gguf", "", drop_key="tokenizer.ggml.tokens")
    async with running_node(node_config(base / "data", good, broken, novocab, cors_origins=[APP])) as n:
        yield n


def model(node, stem: str) -> str:
    return next(m.id for m in node.models.all() if m.entry.path.stem == stem)


async def test_no_vocabulary_is_the_500_for_chat_completions_and_embeddings(node):
    novocab = model(node, "novocab")
    assert node.models.registered(novocab).tokenizer is None
    c = client(node)
    calls = [lambda: c.chat.completions.create(model=novocab, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=2),
             lambda: c.completions.create(model=novocab, prompt="hi", max_tokens=2),
             lambda: c.embeddings.create(model=novocab, input="hi")]
    for call in calls:
        with pytest.raises(openai.APIStatusError) as refused:
            await call()
        err = refused.value
        assert err.status_code == 500 and err.body["code"] == "model_load_failed", (err.status_code, err.body)
        assert err.response.headers.get("x-should-retry") == "false"
        assert "vocabulary" in err.message and "admin API" not in err.message, err.message


async def test_a_browser_sdk_can_read_x_should_retry(node):
    body = {"model": model(node, "broken"), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"Authorization": f"Bearer {node.api_key}", "Origin": APP}
    async with aiohttp.ClientSession() as s, s.post(
            f"http://127.0.0.1:{node.api.port}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 500 and r.headers["x-should-retry"] == "false"
        exposed = [h.strip() for h in r.headers["Access-Control-Expose-Headers"].split(",")]
        assert "x-should-retry" in exposed, exposed


async def test_local_embeddings_are_refused_before_they_queue(node):
    served = node.models.registered(model(node, "broken"))
    assert served.state == "failed"
    for _ in range(served.lock.limit):  # every slot held: were the request to queue, it would wait here
        await served.lock.acquire()
    task = asyncio.ensure_future(client(node, retries=0).embeddings.create(model=served.id, input="hi"))
    try:
        await wait_until(lambda: task.done() or served.waiting, what="the refusal, or the request queued")
        assert task.done() and not served.waiting, "the embeddings request queued for a failed model"
        with pytest.raises(openai.APIStatusError) as refused:
            task.result()
        assert refused.value.status_code == 500 and refused.value.body["code"] == "model_load_failed"
    finally:
        for _ in range(served.lock.limit):
            served.lock.release()
        with pytest.raises(openai.APIStatusError):
            await task


async def test_a_file_replaced_while_its_load_failed_is_loaded_again(node, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    broken = model(node, "broken")
    path = node.models.registered(broken).entry.path
    load = LlamaEngine.load

    def load_while_replaced(engine):  # a new copy lands while llama.cpp fails on the old one
        try:
            load(engine)
        finally:
            st = os.stat(engine.path)
            os.utime(engine.path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))

    monkeypatch.setattr(LlamaEngine, "load", load_while_replaced)
    status, _ = await admin(node, "POST", f"/api/admin/models/{broken}/load")
    monkeypatch.setattr(LlamaEngine, "load", load)
    assert status == 500 and loads_failed(caplog) == 1 and path.exists()
    with pytest.raises(openai.APIStatusError):
        await ask(node, broken)
    assert loads_failed(caplog) == 2, "the replaced file was taken for the one that failed"


async def test_freed_memory_lets_a_request_try_again_once(node, caplog):
    caplog.set_level(logging.INFO)
    good, broken = model(node, "good"), model(node, "broken")
    await ask(node, good)
    status, _ = await admin(node, "POST", f"/api/admin/models/{good}/unload")
    assert status == 200
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as refused:
            await ask(node, broken)
        assert refused.value.status_code == 500
    assert loads_failed(caplog) == 1, "after an unload freed memory: one load, then the new failure stands"


async def test_a_failure_lapses_after_its_time(node, caplog):
    caplog.set_level(logging.INFO)
    served = node.models.registered(model(node, "broken"))
    served.failure.since -= const.LOAD_FAILURE_RETRY_S  # it failed that long ago
    for _ in range(2):
        with pytest.raises(openai.APIStatusError):
            await ask(node, served.id)
    assert loads_failed(caplog) == 1, "a failure past LOAD_FAILURE_RETRY_S: one load, then the new one stands"
