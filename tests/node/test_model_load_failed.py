"""A whole model whose load fails (here: a GGUF missing a tensor, whose vocabulary still reads).

Until 2026-12-06 each request naming it loaded it again and failed again with a 503, which the
openai SDK retried twice: three loads per request, tens of seconds each for a big file. Now the
failure is remembered with the file's size and mtime: a request gets its reason at once (500
`model_load_failed` with `x-should-retry: false`), until the file changes or an admin/app load
asks again. An unloaded model no longer shows the device it had; a request that finds its model
being unloaded no longer logs "On-demand loading"."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import aiohttp
import gguf
import numpy as np
import openai
import pytest
import pytest_asyncio

from node.errors import ModelUnavailable
from tests.support.nodes import TINY, node_config, running_node, tiny_model
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]


def without_tensor(src, dst, drop: str, drop_key: str | None = None):
    """A copy of a GGUF without one tensor: llama.cpp reads its vocabulary but cannot load it
    (without the key `drop_key` too: "tokenizer.ggml.tokens" leaves no vocabulary to read)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "llama")
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", drop_key):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), f.types[0])
    for t in r.tensors:
        if t.name != drop:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("loadfail")
    good = tiny_model(base, TINY, "good.gguf")
    broken = without_tensor(good, base / "broken.gguf", "blk.1.ffn_down.weight")
    async with running_node(node_config(base / "data", good, broken)) as n:
        yield n


def ids(node) -> tuple[str, str]:
    by_name = {m.entry.path.stem: m.id for m in node.models.all()}
    return by_name["good"], by_name["broken"]


def client(node, retries: int = 2):
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key,
                              max_retries=retries)


async def admin(node, method: str, path: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as s, s.request(
            method, f"http://127.0.0.1:{node.api.port}{path}", headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        text = await r.text()
        return r.status, json.loads(text) if r.content_type == "application/json" else text


def loads_failed(caplog) -> int:
    return sum("DIAG: load_model failed" in r.getMessage() for r in caplog.records)


async def ask(node, model: str, **kw):
    return await client(node).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **kw)


async def test_requests_get_the_failure_at_once_without_loading_again(node, caplog):
    caplog.set_level(logging.INFO)
    _, broken = ids(node)
    assert node.models.registered(broken).state == "failed"
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as refused:
            await ask(node, broken, stream=stream)
        err = refused.value
        assert err.status_code == 500, err
        assert err.response.headers.get("x-should-retry") == "false"
        assert err.body["code"] == "model_load_failed", err.body
        assert "failed to load" in err.message and "until its file changes" in err.message, err.message
    assert loads_failed(caplog) == 0, "a request loaded the failed model again"
    assert not any("On-demand loading" in r.getMessage() for r in caplog.records)
    status, body = await admin(node, "GET", "/api/admin/models")
    row = next(m for m in body["models"] if m["id"] == broken)
    assert row["state"] == "failed" and row["failed_at"] and row["device"] is None, row
    status, report = await admin(node, "GET", "/api/admin/diagnostics")
    assert "not loaded again for requests until its file changes" in str(report), str(report)[:3000]


async def test_a_changed_file_or_an_admin_load_tries_again(node, caplog):
    caplog.set_level(logging.INFO)
    _, broken = ids(node)
    status, body = await admin(node, "POST", f"/api/admin/models/{broken}/load")
    assert status == 500 and loads_failed(caplog) == 1, (status, body)
    path = node.models.registered(broken).entry.path
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file changed: a request loads again
    with pytest.raises(openai.APIStatusError):
        await ask(node, broken)
    assert loads_failed(caplog) == 2, "one load for the changed file, none for the SDK's retries"


async def test_an_unloaded_model_shows_no_device(node):
    good, _ = ids(node)
    await ask(node, good)
    served = node.models.registered(good)
    assert served.state == "loaded" and served.device == "cpu"
    status, _ = await admin(node, "POST", f"/api/admin/models/{good}/unload")
    assert status == 200
    status, body = await admin(node, "GET", "/api/admin/models")
    row = next(m for m in body["models"] if m["id"] == good)
    assert row["state"] == "unloaded" and row["device"] is None and row["cpu_placement_reason"] is None, row
    status, report = await admin(node, "GET", "/api/admin/diagnostics")
    line = next(ln for ln in str(report).splitlines() if ln.lstrip().startswith(good))
    assert "device=-" in line, line


async def test_a_model_being_unloaded_is_not_said_to_load_on_demand(node, caplog):
    caplog.set_level(logging.INFO)
    good, _ = ids(node)
    served = await node.models.async_load(good, after_unload=True)
    await served.lock.acquire()  # a request holds the model: the unload waits for it
    unload = asyncio.ensure_future(node.models.async_unload(good, force=True))
    try:
        await wait_until(lambda: served.state == "unloading", what="the unload to begin")
        with pytest.raises(ModelUnavailable):
            await node.models.async_load_on_demand(served, request_id="r1")
    finally:
        served.lock.release()
        await unload
    said = [r.getMessage() for r in caplog.records if "r1" in r.getMessage()]
    assert said and not any("On-demand loading" in m for m in said), said
    assert any("being unloaded" in m for m in said), said
