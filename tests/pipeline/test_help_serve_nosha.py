""""Help serve" of a model whose origin does not state the file's sha256 (a plain HTTP server with
Range, a GitHub release, S3: no X-Linked-Etag, unlike the Hugging Face Hub). A downloads the file
from such an origin and serves it; B, knowing the model by its header, posts
`/api/admin/contribute`. Until 2026-12-07 B answered 500 "the file at … is not the swarm's copy";
then the origin was adopted on its header and size alone, and (review 39) an origin with the same
header and size but other bytes had them served under the swarm's sha256 and the honest holder
distrusted. Now such an origin is not used for the swarm's model at all: B opens it under the
swarm's id from peers only (its layers A's), whatever the origin holds now. An origin stating
another sha256 is a 409 that says so, with nothing left behind in B's catalog or models folder."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import aiohttp
import pytest

from node.inference.synth import write_gguf
from node.models.gguf_meta import read_header
from node.models.partial import PartialStore
from tests.pipeline.test_autoserve import AUTO8
from tests.support.processes import NodeProcess
from tests.support.rangeserver import ThreadedOrigin, other_bytes
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


def _held_bytes_are(directory, real: bytes) -> int:
    """Every tensor B holds is the real file's bytes (AssertionError else); how many layer parts."""
    store = PartialStore(directory)
    manifest = store.load()
    layers = [p for p in manifest.complete if p.startswith("layer-")]
    for part in manifest.complete:
        data = store.part_path(part).read_bytes()
        for t in manifest.part_tensors(part):
            assert data[t.local:t.local + t.n_bytes] == real[t.offset:t.offset + t.n_bytes], (part, t.name)
    return len(layers)


async def _help_serve_from_peers(b: NodeProcess, model_id: str, real: bytes) -> dict:
    """B's Help serve opens the swarm's model from A alone: its manifest."""
    status, body = await _call(b, "POST", "/api/admin/contribute", {"model": model_id, "budget_mb": 4})
    assert status == 200, body  # was 500 "… is not the swarm's copy of …"

    def b_serves() -> bool:
        held = list((b.data_dir / "models").glob("*.partial/parts/layer-*.bin"))
        return 0 < len(held) < AUTO8.n_layers and "DIAG: serving slice" in b.node_log()
    await wait_until(b_serves, 90, 0.5, "B to fetch the layers it chose and serve them")
    [directory] = (b.data_dir / "models").glob("*.partial")
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["sha256"] == hashlib.sha256(real).hexdigest()  # the swarm's id
    log = b.node_log()
    assert "lied=True" not in log, log[-3000:]  # the honest holder is not taken for a liar
    assert _held_bytes_are(directory, real) > 0  # B holds (and serves) the swarm's bytes only
    assert not manifest["origin_url"] and manifest["validator"] is None, manifest  # the origin is not used
    assert "states no sha256, not used" in log, log[-3000:]
    assert await _b_models(b) == [model_id]  # no second model (the derived id) in B's catalog
    return manifest


async def test_help_serve_works_with_an_origin_that_states_no_sha256(tmp_path):
    model = write_gguf(tmp_path / "auto8.gguf", AUTO8)
    nodes: list[NodeProcess] = []
    with ThreadedOrigin(model.read_bytes(), name="auto8.gguf") as origin:  # an ETag, no X-Linked-Etag
        try:
            b, model_id = await _holder_and_newcomer(origin, tmp_path, nodes)
            assert await _b_models(b) == [model_id]
            await _help_serve_from_peers(b, model_id, model.read_bytes())
        finally:
            for n in nodes:
                n.terminate(timeout_s=20)


@pytest.mark.parametrize("change", ["altered-bytes", "another-header"])
async def test_help_serve_never_takes_an_origin_without_sha256_for_the_swarms_file(tmp_path, change):
    """Review 39's reproducer: the file at the origin replaced in place by one with the same header
    and size but other tensor bytes (a re-upload, a hostile holder's own origin). B must neither
    hold nor serve those bytes under the swarm's sha256 nor distrust A, whose bytes are the real
    ones; nor does an origin holding another header now stop the Help serve (A gives the layers)."""
    model = write_gguf(tmp_path / "auto8.gguf", AUTO8)
    real = model.read_bytes()
    nodes: list[NodeProcess] = []
    with ThreadedOrigin(real, name="auto8.gguf") as origin:
        try:
            b, model_id = await _holder_and_newcomer(origin, tmp_path, nodes)
            if change == "altered-bytes":
                offset = read_header(model).data_offset
                altered = other_bytes(real, offset)
                assert len(altered) == len(real)
                origin.data, origin.etag = altered, '"v2"'
            else:
                other = write_gguf(tmp_path / "other.gguf", dataclasses.replace(AUTO8, n_layers=6))
                origin.data, origin.etag = other.read_bytes(), '"v2"'
            await _help_serve_from_peers(b, model_id, real)
        finally:
            for n in nodes:
                n.terminate(timeout_s=20)


async def test_help_serve_refuses_with_409_when_the_origin_states_another_sha256(tmp_path):
    model = write_gguf(tmp_path / "auto8.gguf", AUTO8)
    nodes: list[NodeProcess] = []
    with ThreadedOrigin(model.read_bytes(), name="auto8.gguf") as origin:
        try:
            b, model_id = await _holder_and_newcomer(origin, tmp_path, nodes)
            assert await _b_models(b) == [model_id]
            origin.linked_etag = "f" * 64  # the same header and size, another file's sha256 (as the Hub states it)
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
