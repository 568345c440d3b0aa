""""Help serve" of a model whose origin does not state the file's sha256 (a plain HTTP server with
Range, a GitHub release, S3: no X-Linked-Etag, unlike the Hugging Face Hub). A downloads the file
from such an origin and serves it; B, knowing the model by its header, posts
`/api/admin/contribute`. Until 2026-12-07 B answered 500 "the file at … is not the swarm's copy":
the partial model opened from the origin got the id derived from its header and size, never the
holders' sha256, and stayed in B's catalog as a second model. Now, the origin's header and size
being the swarm's, B opens the partial model under the swarm's id with that origin named: its
layers come from A, checked against the origin. An origin that holds another file now is a 409
that says so, with nothing left behind in B's catalog or models folder."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import aiohttp
import pytest

from node.inference.synth import write_gguf
from tests.pipeline.test_autoserve import AUTO8
from tests.support.processes import NodeProcess
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama]

ARGS = ["--no-default-model", "--no-mdns", "--slice-dtype", "f32", "--activation-bits", "32", "--n-threads", "1"]


async def _call(node: NodeProcess, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.request(method, node.base + path, json=body, headers=node.auth) as r:
        return r.status, await r.json()


async def _holder_and_newcomer(origin: ThreadedOrigin, tmp_path, nodes: list[NodeProcess]) -> tuple[NodeProcess, str]:
    """A downloads the origin's file and loads it; B links to A and learns the model's header.
    (B, the model's id)"""
    a = NodeProcess(tmp_path / "a", args=ARGS)
    nodes.append(a)
    await a.async_wait_ready(90, path="/health")
    status, body = await _call(a, "POST", "/api/admin/models/download", {"url": origin.url})
    assert status in (200, 201, 202), body

    async def a_serves() -> str | None:
        status, body = await _call(a, "GET", "/v1/models")
        ids = [m["id"] for m in body.get("data", [])] if status == 200 else []
        for model_id in (i for i in ids if i.startswith("auto8-")):
            if (await _call(a, "POST", f"/api/admin/models/{model_id}/load"))[0] == 200:
                return model_id
        return None
    model_id = await wait_until(a_serves, 60, 0.5, "A's download to land and load")
    b = NodeProcess(tmp_path / "b", args=[*ARGS, "--bootstrap", f"127.0.0.1:{a.peer_port}"])
    nodes.append(b)
    await b.async_wait_ready(90, path="/health")

    async def b_hears_the_origin() -> bool:
        status, body = await _call(b, "GET", "/api/admin/peers")
        return status == 200 and any(m.get("origin_url") for p in body["peers"] if p["state"] == "connected"
                                     for m in p.get("models") or [])
    await wait_until(b_hears_the_origin, 60, 0.3, "A's advert (with its origin) to reach B")

    async def b_knows_it() -> bool:
        status, body = await _call(b, "GET", "/v1/models")
        return status == 200 and any(m["id"] == model_id for m in body["data"])
    await wait_until(b_knows_it, 60, 0.3, "B to register A's model from its header")
    return b, model_id


async def _b_models(b: NodeProcess) -> list[str]:
    """The models B lists (its catalog and the swarm's)."""
    status, body = await _call(b, "GET", "/v1/models")
    assert status == 200, body
    return sorted(m["id"] for m in body["data"])


async def test_help_serve_works_with_an_origin_that_states_no_sha256(tmp_path):
    model = write_gguf(tmp_path / "auto8.gguf", AUTO8)
    nodes: list[NodeProcess] = []
    with ThreadedOrigin(model.read_bytes(), name="auto8.gguf") as origin:  # an ETag, no X-Linked-Etag
        try:
            b, model_id = await _holder_and_newcomer(origin, tmp_path, nodes)
            assert await _b_models(b) == [model_id]
            status, body = await _call(b, "POST", "/api/admin/contribute", {"model": model_id, "budget_mb": 4})
            assert status == 200, body  # was 500 "… is not the swarm's copy of …"

            def b_serves() -> bool:
                held = list((b.data_dir / "models").glob("*.partial/parts/layer-*.bin"))
                return 0 < len(held) < AUTO8.n_layers and "DIAG: serving slice" in b.node_log()
            await wait_until(b_serves, 90, 0.5, "B to fetch the layers it chose and serve them")
            [directory] = (b.data_dir / "models").glob("*.partial")
            manifest = json.loads((directory / "manifest.json").read_text())
            assert manifest["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()  # the swarm's id
            # its layers came from A and were checked against the origin (its version recorded)
            assert manifest["validator"] == origin.etag and not manifest["unchecked"], manifest
            log = b.node_log()
            assert any("parts fetched from a peer" in ln and "spot_checked=True" in ln for ln in log.splitlines()), \
                log[-3000:]
            assert await _b_models(b) == [model_id]  # no second model (the derived id) in B's catalog
        finally:
            for n in nodes:
                n.terminate(timeout_s=20)


@pytest.mark.parametrize("change", ["another-header", "another-sha256"])
async def test_help_serve_refuses_with_409_when_the_origin_holds_another_file(tmp_path, change):
    model = write_gguf(tmp_path / "auto8.gguf", AUTO8)
    other = write_gguf(tmp_path / "other.gguf", dataclasses.replace(AUTO8, n_layers=6))  # another header
    nodes: list[NodeProcess] = []
    with ThreadedOrigin(model.read_bytes(), name="auto8.gguf") as origin:
        try:
            b, model_id = await _holder_and_newcomer(origin, tmp_path, nodes)
            assert await _b_models(b) == [model_id]
            if change == "another-header":  # the file at the URL replaced since (a plain server)
                origin.data, origin.etag = other.read_bytes(), '"v2"'
            else:  # the same header and size, but the origin states another file's sha256 (as the Hub does)
                origin.linked_etag = "f" * 64
            status, body = await _call(b, "POST", "/api/admin/contribute", {"model": model_id, "budget_mb": 4})
            assert status == 409, body
            assert "another file" in body["error"]["message"], body
            assert await _b_models(b) == [model_id]  # no stray partial model in the catalog...
            assert not list((b.data_dir / "models").glob("*.partial"))  # ...nor in the models folder
            status, body = await _call(b, "GET", "/api/admin/contribute")
            assert status == 200 and not body["models"], body  # nothing chosen
        finally:
            for n in nodes:
                n.terminate(timeout_s=20)
