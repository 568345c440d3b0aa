"""The Swarm tab on a real swarm on loopback: a node B serves layers 0-1 of a 4-layer model fetched
from a local origin; the app's node holds no file of it. The layer map shows B and the gap (2-3);
"Help serve this model" makes the app's node choose and fetch the gap's layers (checked through the
node's admin API, not the widget); a request then runs on the chain B → this node, which the map
draws hop by hop; "Pause contributing" frees the slice, resuming brings it back; both persist."""

from __future__ import annotations

import asyncio
import math
import tomllib

import aiohttp
import openai
import pytest
from PySide6.QtCore import Qt

from app.ui.swarm_model import LayerMapModel, RateSeries
from node.inference.synth import SynthSpec, write_gguf
from node.node import Node
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui, pytest.mark.slow]

# ~10 MB per layer at f32 (weights and KV): a budget of a few tens of MB fits two layers and the head
FOUR = SynthSpec(n_layers=4, hidden=512, n_heads=8, n_kv_heads=4, ffn=1024, n_ctx=512, name="four")


async def _admin(node, method: str, path: str, body: dict | None = None) -> dict:
    async with aiohttp.ClientSession() as session, session.request(
            method, f"http://127.0.0.1:{node.api.port}{path}", json=body,
            headers={"Authorization": f"Bearer {node.api_key}"}) as resp:
        data = await resp.json()
        assert resp.status == 200, data
        return data


def _tensor_bytes(path, prefixes: tuple[str, ...]) -> int:
    from node.inference.weights.gguf_file import GgufFile

    f = GgufFile(path)
    return sum(t.n_bytes for name, t in f.tensors.items() if name.startswith(prefixes))


async def _held_bytes(node, model_id: str) -> int:
    """Bytes of the partial model's directory (its layers' files, complete or not)."""
    path = node.catalog.entries[model_id].path

    def total() -> int:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return await asyncio.get_running_loop().run_in_executor(None, total)


def _serving(summary: dict) -> list[tuple[list[int], str]]:
    return [(s["layers"], s["state"]) for m in summary["models"] for s in m["serving"]]


def test_help_serve_fills_the_gap_and_the_map_draws_the_chain(qtbot, run, qtmodeltester, tmp_path):
    path = tmp_path / "four.gguf"
    write_gguf(path, FOUR)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()

    async def body():
        with ThreadedOrigin(path.read_bytes(), "four.gguf") as origin:
            b = Node(node_config(tmp_path / "b", layers="0-1", slice_dtype="f32", models=[origin.url]))
            await b.start()
            try:
                config = node_config(tmp_path / "a", slice_dtype="f32", slice_budget_mb=0,
                                     bootstrap=[f"127.0.0.1:{b.peers.listen_port}"])
                async with running_app(config) as app:
                    app.window.show_tab("Swarm")  # (the model is sized once its panel is seen)
                    tab = app.window.swarm_tab
                    panel = tab.contribute
                    layer_map = app.feeds.layer_map
                    await wait_until(lambda: layer_map.current() is not None and layer_map.rowCount() == 1,
                                     DEADLINE_S, what="B's layers in the map")
                    qtmodeltester.check(layer_map, force_py=True)  # and it stays attached: every later change is checked
                    current = layer_map.current()
                    assert current.n_layers == 4 and current.gaps == [(2, 3)]
                    assert tab.coverage.text() == "gap: layers 2–3"
                    assert "gap: layers 2–3" in tab.map_view.describe()
                    assert layer_map.cell_text(layer_map.keys()[0], "Layers") == "0–1 of 4"
                    model_id = current.model_id
                    assert tab.picker.currentText() == model_id
                    # the header comes from B (or the origin B names); until then the box is off
                    await wait_until(lambda: model_id in app.node.catalog.entries and panel.help_box.isEnabled(),
                                     DEADLINE_S, what="the model's header here")
                    await wait_until(lambda: " layers (" in panel.budget_label.text(), DEADLINE_S,
                                     what="the budget's size in layers")

                    # help serve it through the panel: a budget, then the box
                    cost = panel.cost[model_id]
                    budget = int(cost["head_mb"] + 2.5 * cost["per_layer_mb"])  # two layers and the head
                    assert budget < cost["head_mb"] + 3 * cost["per_layer_mb"]
                    # the label counts as the node does: 3 layers fit, 2 with the output head (it
                    # said "≈ 2 of 4" while a node served 3 layers that did not end the model)
                    three = math.ceil(3 * cost["per_layer_mb"])
                    if three < 3 * cost["per_layer_mb"] + cost["head_mb"] and cost["head_mb"] < cost["per_layer_mb"]:
                        panel.slider.setValue(three)
                        assert "≈ 3 of 4 layers, 2 with the output head" in panel.budget_label.text(), \
                            panel.budget_label.text()
                    panel.slider.setValue(budget)
                    fit = panel.budget_label.text()  # the node's own count: 2 of the last layers (the head)
                    assert fit.startswith(f"{budget:,} MiB ≈ ") and ("2 with the output head" in fit or "≈ 2 of 4" in fit)
                    panel.help_box.click()

                    async def chosen():
                        summary = await _admin(app.node, "GET", "/api/admin/contribute")
                        return _serving(summary) == [([2, 3], "loaded")]
                    deadline = asyncio.get_running_loop().time() + DEADLINE_S
                    while not await chosen():
                        assert asyncio.get_running_loop().time() < deadline, "the gap's layers were not served"
                        await asyncio.sleep(0.2)
                    summary = await _admin(app.node, "GET", "/api/admin/contribute")
                    assert summary["models"][0]["model"] == model_id and summary["models"][0]["budget_mb"] == budget
                    kept = tomllib.loads((tmp_path / "a" / "config.toml").read_text())["desktop"]
                    assert kept["contribute_models"] == {model_id: budget}
                    await wait_until(lambda: layer_map.current() is not None and not layer_map.current().gaps,
                                     DEADLINE_S, what="the gap filled in the map")
                    assert "Serving layers 2–3" in panel.status.text()

                    # a request on the chain B (0-1) → this node (2-3), drawn over the map
                    await wait_until(lambda: model_id in [m["id"] for m in app.node.list_openai_models()],
                                     DEADLINE_S, what="the model servable")
                    client = openai.AsyncOpenAI(base_url=app.node.api_url, api_key=app.node.api_key, max_retries=0)
                    try:
                        reply = await client.chat.completions.with_raw_response.create(
                            model=model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
                    finally:
                        await client.close()
                    assert reply.headers["x-swarm-route"] == "distributed"
                    await wait_until(lambda: layer_map.current() is not None and
                                     sorted(h.hop for h in layer_map.current().holders if h.hop is not None) == [0, 1],
                                     DEADLINE_S, what="the chain drawn")
                    hops = {h.hop: h for h in layer_map.current().holders if h.hop is not None}
                    assert hops[0].node_id == b.node_id and (hops[0].start, hops[0].end) == (0, 2)
                    assert hops[1].this_node and (hops[1].start, hops[1].end) == (2, 4)
                    assert hops[0].transport == "direct" and hops[1].hop_ms is not None
                    assert "hop 1 of the last request" in tab.map_view.describe()
                    assert any(v > 0 for v in app.feeds.rates.series()[1])  # requests/min saw it

                    # pause: no slice, said in the API and the file; resume: chosen again
                    app.tray.pause_action.trigger()

                    async def serving_now() -> list:
                        return _serving(await _admin(app.node, "GET", "/api/admin/contribute"))
                    while await serving_now():
                        assert asyncio.get_running_loop().time() < deadline + DEADLINE_S, "the pause kept the slice"
                        await asyncio.sleep(0.2)
                    assert (await _admin(app.node, "GET", "/api/admin/contribute"))["paused"] is True
                    assert not app.node.slice_host.slices
                    assert tomllib.loads((tmp_path / "a" / "config.toml").read_text())["desktop"]["contribute"] is False
                    await wait_until(lambda: panel.pause_box.isChecked(), DEADLINE_S, what="the panel's pause box")
                    await _admin(app.node, "POST", "/api/admin/contribute", {"paused": False})
                    while await serving_now() != [([2, 3], "loaded")]:
                        assert asyncio.get_running_loop().time() < deadline + 2 * DEADLINE_S, "resume served nothing"
                        await asyncio.sleep(0.2)

                    # stop helping: the box, then nothing served and nothing kept
                    panel.help_box.click()
                    while await serving_now():
                        assert asyncio.get_running_loop().time() < deadline + 3 * DEADLINE_S, "stop kept the slice"
                        await asyncio.sleep(0.2)
                    kept = tomllib.loads((tmp_path / "a" / "config.toml").read_text())["desktop"]
                    assert kept["contribute_models"] == {}
            finally:
                await b.stop()

    run(body(), timeout_s=400)


def test_the_admin_api_refuses_bad_contribute_bodies(qtbot, run, tmp_path, tiny_model):
    async def body():
        async with running_app(node_config(tmp_path, tiny_model)) as app:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{app.node.api.port}/api/admin/contribute"
                auth = {"Authorization": f"Bearer {app.node.api_key}"}
                for bad, words in (({"model": "tiny", "budget_mb": -1}, "budget_mb"),
                                   ({"model": "tiny", "budget_mb": "lots"}, "budget_mb"),
                                   ({"paused": "yes"}, "paused"), ({"model": "nope"}, "nope"),
                                   ({"model": "tiny", "stop": True}, "not helping"), ({"colour": 1}, "unknown"),
                                   ([], "JSON object")):
                    async with session.post(url, json=bad, headers=auth) as resp:
                        text = await resp.text()
                        assert resp.status in (400, 404), (bad, resp.status, text)
                        assert words in text, (bad, text)
                async with session.get(url, headers=auth) as resp:
                    assert (await resp.json()) == {"paused": False, "models": [], "failures": []}

    run(body())


def test_layer_map_model_from_adverts(qapp, qtmodeltester):
    """The map built from adverts alone: holders sorted by layers, whole holders last, gaps named,
    malformed adverts skipped, a loading advert drawn but not counted as coverage."""
    from types import SimpleNamespace

    from app.ui.swarm_model import build_maps

    sha = "ab" * 32

    def peer(node_id, *models):
        return SimpleNamespace(node_id=node_id, state="connected", models=list(models))

    def advert(start, end, **extra):
        return {"sha256": sha, "name": "m", "n_layers": 8, "start": start, "end": end, **extra}

    peers = [peer("b" * 64, advert(0, 3, ms_per_layer=2.0)), peer("c" * 64, advert(3, 5, loading=True)),
             peer("d" * 64, {"sha256": sha, "name": "m", "n_layers": 8, "whole": True}),
             peer("e" * 64, {"sha256": sha, "start": "x"})]
    maps = build_maps("a" * 64, [advert(6, 8, ms_per_layer=4.0)], peers, {}, {}, {}, lambda _n: "host-1")
    assert len(maps) == 1
    m = maps[0]
    assert [(h.node_id[0], h.start, h.end, h.whole, h.loading) for h in m.holders] == [
        ("b", 0, 3, False, False), ("c", 3, 5, False, True), ("a", 6, 8, False, False), ("d", 0, 8, True, False)]
    # d serves it whole: the slices' gap is no gap in the service (it read "gap: layers 3–5", and
    # the map painted those layers red although every request was served)
    assert m.gaps == [(3, 5)] and m.coverage_text() == "served whole; slices leave out layers 3–5"
    assert m.holders[2].this_node and m.holders[1].role == "loading" and m.holders[0].role == "serving"
    # with a chain drawn (b ran 0-2, this node 6-7): its hops numbered, the others standbys
    from node.trace import RequestTrace, SegmentTrace

    trace = RequestTrace(model="m-abababab", operation="chat.completions")
    trace.segments = [SegmentTrace("b" * 8, 0, 2, "direct", 12.5), SegmentTrace("a" * 8, 6, 8, "local", 3.0)]
    m = build_maps("a" * 64, [advert(6, 8)], peers[:1], {sha: "m-abababab"}, {"m-abababab": trace}, {},
                   lambda _n: "-")[0]
    assert [(h.node_id[0], h.hop, h.role) for h in m.holders] == [
        ("b", 0, "hop 1 of the last request (ran 0–1)"), ("a", 1, "hop 2 of the last request")]
    m = build_maps("a" * 64, [advert(6, 8)], peers[:2], {sha: "m-abababab"}, {"m-abababab": trace}, {},
                   lambda _n: "-")[0]
    assert [h.role for h in m.holders if h.node_id[0] == "c"] == ["loading"]
    model = LayerMapModel()
    model.set_maps(maps)
    qtmodeltester.check(model, force_py=True)
    assert model.rowCount() == 4
    assert all(model.headerData(c, Qt.Orientation.Horizontal, Qt.ItemDataRole.ToolTipRole)
               for c in range(model.columnCount()))  # every header has a tooltip


def test_rate_series_buckets_and_forgets():
    now = [1000.0]
    rates = RateSeries(window_s=60, bucket_s=10, clock=lambda: now[0])
    rates.add(995.0, 50)
    rates.add(1001.0, 20)
    tokens, requests = rates.series()
    assert len(tokens) == 6 and tokens[-1] == 2.0 and tokens[-2] == 5.0 and requests[-1] == 6.0
    now[0] = 2000.0
    rates.add(2000.0, 10)
    tokens, _ = rates.series()
    assert sum(tokens) == 1.0  # the old buckets are gone


def test_a_layer_fetch_is_cancelled_from_its_bar_and_resumes_from_where_it_stopped(qtbot, run, tmp_path):
    """The app's node helps serve a partial model from a slow origin: its layers' bar shows in the
    Models tab; Cancel stops the fetch (no slice, nothing helped, in the node's API) and keeps
    what arrived; helping again fetches only the rest (the origin's Range starts past zero)."""
    path = tmp_path / "four.gguf"
    write_gguf(path, FOUR)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()

    async def body():
        with ThreadedOrigin(path.read_bytes(), "four.gguf") as origin:
            b = Node(node_config(tmp_path / "b", layers="0-1", slice_dtype="f32", models=[origin.url]))
            await b.start()
            try:
                config = node_config(tmp_path / "a", slice_dtype="f32", bootstrap=[f"127.0.0.1:{b.peers.listen_port}"])
                async with running_app(config) as app:
                    app.window.show_tab("Swarm")  # (the model is sized once its panel is seen)
                    panel, layer_map = app.window.swarm_tab.contribute, app.feeds.layer_map
                    await wait_until(lambda: layer_map.current() is not None and panel.help_box.isEnabled()
                                     and " layers (" in panel.budget_label.text(), DEADLINE_S, what="the model here")
                    model_id = layer_map.current().model_id
                    cost = panel.cost[model_id]
                    origin.stall_after = origin.sent + 3 * 2**20  # this node's fetch stalls 3 MB in
                    sent_before = origin.sent
                    held_before = await _held_bytes(app.node, model_id)
                    panel.slider.setValue(int(cost["head_mb"] + 2.5 * cost["per_layer_mb"]))
                    panel.help_box.click()
                    bars = app.window.models_tab.downloads
                    await wait_until(lambda: any(k.startswith("slice:") and bars.rows[k].bar.value() > 0
                                                 for k in bars.rows), DEADLINE_S, what="the layers' bar")
                    key = next(k for k in bars.rows if k.startswith("slice:"))
                    assert bars.rows[key].title.text() == "four layers 2–3"
                    assert not bars.rows[key].cancel_button.isHidden()
                    bars.rows[key].cancel_button.click()
                    await wait_until(lambda: key not in bars.rows and not app.node.slice_host.slices, DEADLINE_S,
                                     what="the fetch cancelled")
                    assert (await _admin(app.node, "GET", "/api/admin/contribute"))["models"] == []
                    kept = origin.sent - sent_before
                    assert kept >= 3 * 2**20
                    # what reached this node's disk before the cancel (the rest of the 3 MB sent may
                    # still have been in socket buffers on a busy runner: lost, fetched again)
                    on_disk = await _held_bytes(app.node, model_id) - held_before
                    assert on_disk > 0
                    first_ranges = len(origin.ranges)
                    origin.stall_after = None
                    origin.release.set()
                    panel.help_box.click()  # again: the rest only
                    deadline = asyncio.get_running_loop().time() + DEADLINE_S
                    while _serving(await _admin(app.node, "GET", "/api/admin/contribute")) != [([2, 3], "loaded")]:
                        assert asyncio.get_running_loop().time() < deadline, "helping again loaded nothing"
                        await asyncio.sleep(0.2)
                    second = origin.sent - sent_before - kept
                    needed = _tensor_bytes(path, ("blk.2.", "blk.3.", "output"))  # layers 2-3 and the head
                    assert second <= needed - on_disk + 2**20, (second, needed, on_disk)  # not fetched again
                    # what was sent but not yet written at the cancel is lost (socket buffers: over 1 MB
                    # of the 3 on a busy runner), never more than was sent
                    assert on_disk <= kept, (on_disk, kept)
                    assert any(r and not r.startswith("bytes=0-") for r in origin.ranges[first_ranges:])
            finally:
                await b.stop()

    run(body(), timeout_s=400)


def test_coverage_counts_a_whole_holder_as_the_map_does():
    """One slice holder of every layer and one whole holder: two holders per layer, as the map
    paints them (the line said "at least 1 holder")."""
    from app.ui.swarm_model import Holder, ModelMap

    m = ModelMap("ab" * 32, "m", "m-abababab", 4, counts=[1, 1, 1, 1])
    m.holders = [Holder("b" * 64, 0, 4, 4), Holder("d" * 64, 0, 4, 4, whole=True)]
    assert m.coverage_text() == "every layer covered (at least 2 holders)"
