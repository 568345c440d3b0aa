"""Layers fetched from a peer that holds the model's whole file on disk, not loaded. Two laptops on a
LAN: A downloaded the GGUF from the Hub and did not load it (its RAM is short); B serves layers 0-3
of the same model by URL. B's layers come from A (the origin sends B only its header probe,
`globals` and one spot-check range per part), though A's advert lists no model: its HELLO's
`files` names the file. A paused lists no file and B takes every layer from the origin; a file A's
disk altered is caught by the spot check and B's layers come from the origin; a file deleted from
A's models folder drops out of its advert. (Before 2026-12-06 only a loaded model's file was handed
out: B fetched every layer from the internet, or failed offline.)"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest

from node import const
from node.inference.synth import write_gguf
from node.models.partial.probe import PROBE_BYTES
from tests.pipeline.test_autoserve import AUTO8, held
from tests.pipeline.test_help_serve_origin import _HubThread
from tests.pipeline.test_partial_swarm import _parts_match_origin
from tests.pipeline.test_whole_holder_parts import _alter_layers, _call, _from_peer
from tests.support.processes import NodeProcess, hub_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

ARGS = ["--no-default-model", "--no-mdns", "--slice-dtype", "f32", "--activation-bits", "32", "--n-threads", "1"]
URL = "hf://org/auto8/auto8.gguf"


async def _files_b_hears(b: NodeProcess) -> list[str] | None:
    """The `files` of B's connected peer A (None: not linked yet)."""
    _status, body = await _call(b, "GET", "/api/admin/peers")
    peers = [p for p in body["peers"] if p["state"] == "connected"]
    return peers[0].get("files", []) if peers else None


async def _pair(tmp_path, *, alter: bool = False, pause_a: bool = False,
                after: Callable[[NodeProcess, NodeProcess, str], Awaitable[None]] | None = None):
    """A downloads auto8 from the Hub stand-in and leaves it unloaded; B (linked to A, paused until
    it has heard A's advert) serves layers 0-3 of it by URL. (origin bytes sent for B, A's short id, B)"""
    data = write_gguf(tmp_path / "auto8.gguf", AUTO8).read_bytes()
    hub = _HubThread(data)
    env = {**hub_env(hub.srv.hub, tmp_path / "hf-home"), "SWARMLLM_MODELS_WATCH_S": "0.5",
           "SWARMLLM_PUBLIC_LAN_ORIGINS": "true"}  # the Hub stand-in is on 127.0.0.1 (download/public.py)
    a = NodeProcess(tmp_path / "a", args=ARGS, env=env)
    nodes = [a]
    try:
        await a.async_wait_ready(90, path="/health")
        status, body = await _call(a, "POST", "/api/admin/models/download", {"url": URL})
        assert status in (200, 201, 202), body
        model_id, sha = f"auto8-{hub.srv.sha256[:8]}", hub.srv.sha256

        async def a_has_it() -> bool:
            _status, body = await _call(a, "GET", "/api/admin/models")
            return any(m["id"] == model_id for m in body["models"])
        await wait_until(a_has_it, 60, 0.3, "A's download to land")
        _status, body = await _call(a, "GET", "/api/admin/models")
        assert [m["state"] for m in body["models"] if m["id"] == model_id] != ["loaded"]
        if alter:
            [file] = (tmp_path / "a" / "models").glob("*.gguf")
            _alter_layers(file, range(AUTO8.n_layers))
        before = hub.srv.sent
        b = NodeProcess(tmp_path / "b", args=[*ARGS, "--model", URL, "--layers", "0-3",
                                              "--bootstrap", f"127.0.0.1:{a.peer_port}"],
                        env={**env, "SWARMLLM_CONTRIBUTE": "false"})
        nodes.append(b)
        await b.async_wait_ready(90, path="/health")

        async def b_hears_a_file() -> bool:
            return sha in (await _files_b_hears(b) or [])
        await wait_until(b_hears_a_file, 60, 0.3, "A's advert of its file to reach B")
        if pause_a:
            status, body = await _call(a, "POST", "/api/admin/contribute", {"paused": True})
            assert status == 200 and body["paused"] is True, body

            async def b_hears_no_file() -> bool:
                return await _files_b_hears(b) == []
            await wait_until(b_hears_no_file, 30, 0.3, "A's paused advert (no files) to reach B")
        status, body = await _call(b, "POST", "/api/admin/contribute", {"paused": False})
        assert status == 200, body

        async def b_serves() -> bool:
            return bool((await held([b]))["b"])
        await wait_until(b_serves, 90, 0.5, "B to serve its layers")
        peers = (await b.async_get_json("/api/admin/peers"))["peers"]
        if after is not None:
            await after(a, b, sha)
        return data, hub.srv.sent - before, [p["node_id"][:8] for p in peers], b
    finally:
        for n in nodes:
            n.terminate(timeout_s=20)
        hub.close()


def _manifest(tmp_path) -> dict:
    [b_dir] = (tmp_path / "b" / "models").glob("*.partial")
    return json.loads((b_dir / "manifest.json").read_text())


async def test_layers_come_from_a_peer_holding_the_file_unloaded(tmp_path):
    async def delete_then_dropped(a: NodeProcess, b: NodeProcess, sha: str) -> None:
        [file] = (tmp_path / "a" / "models").glob("*.gguf")
        file.unlink()  # the owner deletes it: the models folder's watch drops it, and so does A's advert

        async def dropped() -> bool:
            return await _files_b_hears(b) == []
        await wait_until(dropped, 30, 0.3, "A's advert without the deleted file to reach B")

    data, origin_sent, [a_id], b = await _pair(tmp_path, after=delete_then_dropped)
    log_b = b.node_log()
    got = [f for f in _from_peer(log_b) if int(f.get("parts", "0")) > 0]
    assert got, log_b[-4000:]
    assert all(f["peer_id"] == a_id for f in got)
    assert all(f["lied"] == "False" for f in got) and any(f["spot_checked"] == "True" for f in got)
    assert _parts_match_origin(tmp_path / "b", data) == []
    manifest = _manifest(tmp_path)
    taken = [p for p in manifest["complete"] if p != "globals"]
    assert any(p.startswith("layer-") for p in taken)
    # the origin's part: B's header probe, `globals` and one check range per part taken
    globals_bytes = sum(t[3] for t in manifest["tensors"] if t[1] == "globals")
    bound = manifest["header_bytes"] + PROBE_BYTES + globals_bytes + len(taken) * const.PARTIAL_SPOT_CHECK_BYTES
    assert origin_sent <= bound, (origin_sent, bound, taken)


async def test_a_paused_holder_lists_no_file_and_the_origin_gives_the_layers(tmp_path):
    data, origin_sent, [a_id], b = await _pair(tmp_path, pause_a=True)
    log_b = b.node_log()
    assert not [f for f in _from_peer(log_b) if int(f.get("parts", "0")) > 0], log_b[-4000:]
    assert f"peer_id={a_id}" not in "".join(ln for ln in log_b.splitlines() if "asking a peer for layers" in ln)
    assert _parts_match_origin(tmp_path / "b", data) == []
    manifest = _manifest(tmp_path)
    layers_bytes = sum(t[3] for t in manifest["tensors"] if t[1].startswith("layer-") and t[1] in manifest["complete"])
    assert layers_bytes and origin_sent >= layers_bytes


async def test_a_file_altered_on_the_holders_disk_is_caught_and_the_origin_gives_the_layers(tmp_path):
    data, origin_sent, _a, b = await _pair(tmp_path, alter=True)
    log_b = b.node_log()
    assert "do not match the origin, quarantined" in log_b, log_b[-4000:]
    assert any(f["lied"] == "True" for f in _from_peer(log_b))
    assert _parts_match_origin(tmp_path / "b", data) == []
    manifest = _manifest(tmp_path)
    assert any(p.startswith("layer-") for p in manifest["complete"]) and not manifest.get("unchecked")
    layers_bytes = sum(t[3] for t in manifest["tensors"] if t[1].startswith("layer-") and t[1] in manifest["complete"])
    assert origin_sent >= layers_bytes  # the refetch: its layers from the origin
