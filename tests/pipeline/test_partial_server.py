"""The MODEL_PART server (node/inference/pipeline/part_server.PartServer) and its client
(PeerPartSource) end to end in-process: the client's requests go to the server's handler as a peer
link would carry them. A partial model's checked parts are served; unchecked ones, other models
and malformed requests are errors that name the problem (the link would stay)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from node import const
from node.errors import InvalidRequest, ModelNotFound, PeerError
from node.inference.pipeline.part_server import PartServer
from node.inference.pipeline.partials import PeerPartSource
from node.models.catalog import ModelCatalog
from node.models.gguf_meta import read_header
from node.models.partial import (
    PartialStore,
    async_fetch_parts,
    async_fetch_parts_from,
    async_open_partial,
    parts_for,
)
from node.net import Frame, FrameType
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.nodes import node_config, running_node
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until


class Link:
    short_id = "client00"


class LoopbackPeers:
    """PeerManager.async_request, answered by a PartServer in this process (errors as the link raises them)."""

    def __init__(self, server: PartServer):
        self.server, self.requests = server, 0

    async def async_request(self, node_id: str, frame: Frame, timeout_s: float | None = None) -> Frame:
        self.requests += 1
        return await asyncio.wait_for(self.server.async_handle(Link(), frame), timeout_s)


@pytest.fixture
def origin(model):  # noqa: F811
    with ThreadedOrigin(model.read_bytes()) as srv:
        yield srv


async def _holder(tmp_path, origin):
    d = tmp_path / "m-0123abcd.partial"
    store, manifest = await async_open_partial(origin.url, d)
    parts = parts_for(read_header(store.header_path), 2, 5)
    await async_fetch_parts(store, manifest, parts)
    catalog = ModelCatalog(None)
    [entry] = await catalog.async_scan([(d, "cli")])
    return catalog, entry, parts


async def test_a_peer_is_served_its_checked_parts_over_model_part_frames(tmp_path, model, origin):  # noqa: F811
    catalog, entry, parts = await _holder(tmp_path, origin)
    peers = LoopbackPeers(PartServer(catalog))
    source = PeerPartSource(peers, "f" * 64)
    hashes = await source.async_hashes(entry.sha256, parts + ["layer-0007"])  # one it does not hold
    assert set(hashes) == {t.name for t in entry.partial.tensors.values() if t.part in parts}
    store, manifest = await async_open_partial(origin.url, tmp_path / "b.partial")
    stats = await async_fetch_parts_from(store, manifest, parts, source, origin_url=origin.url, rng=random.Random(1))
    assert stats.spot_checked and not stats.rejected and manifest.covers(parts)
    chunks = sum(-(-t.n_bytes // const.PARTIAL_PEER_CHUNK) for p in stats.parts for t in manifest.part_tensors(p))
    assert peers.requests == 1 + 1 + chunks  # the two hash lists and one request per chunk
    data = origin.data
    for p in parts:
        raw = store.part_path(p).read_bytes()
        assert all(raw[t.local:t.local + t.n_bytes] == data[t.offset:t.offset + t.n_bytes]
                   for t in manifest.part_tensors(p))


async def test_what_the_server_refuses(tmp_path, model, origin):  # noqa: F811
    catalog, entry, parts = await _holder(tmp_path, origin)
    server = PartServer(catalog)
    t = next(t for t in entry.partial.tensors.values() if t.part == "layer-0003")

    async def ask(header):
        return await server.async_handle(Link(), Frame(FrameType.MODEL_PART, header))

    reply = await ask({"sha256": entry.sha256, "op": "read", "tensor": t.name, "offset": 10, "n": 100})
    assert bytes(reply.payload) == origin.data[t.offset + 10:t.offset + 110]
    bad = [
        ({"sha256": "XYZ", "op": "hashes", "parts": []}, InvalidRequest, "64 lower-case hex"),
        ({"sha256": "0" * 64, "op": "hashes", "parts": []}, ModelNotFound, "no partial model"),
        ({"sha256": entry.sha256, "op": "delete"}, InvalidRequest, "'op' must be"),
        ({"sha256": entry.sha256, "op": "hashes", "parts": "layer-0003"}, InvalidRequest, "a list of part names"),
        ({"sha256": entry.sha256, "op": "hashes", "parts": ["../../etc"]}, InvalidRequest, "a list of part names"),
        ({"sha256": entry.sha256, "op": "read", "tensor": "blk.7.attn_q.weight", "offset": 0, "n": 1},
         ModelNotFound, "not held here"),
        ({"sha256": entry.sha256, "op": "read", "tensor": ["x"], "offset": 0, "n": 1}, ModelNotFound, "not held"),
        ({"sha256": entry.sha256, "op": "read", "tensor": t.name, "offset": 0, "n": const.PARTIAL_PEER_CHUNK + 1},
         InvalidRequest, "0 < n <="),
        ({"sha256": entry.sha256, "op": "read", "tensor": t.name, "offset": t.n_bytes - 1, "n": 2},
         InvalidRequest, "offset \\+ n <="),
        ({"sha256": entry.sha256, "op": "read", "tensor": t.name, "offset": -1, "n": 2}, InvalidRequest, "0 <= offset"),
        ({"sha256": entry.sha256, "op": "read", "tensor": t.name, "offset": True, "n": 2}, InvalidRequest, "offset"),
    ]
    for header, error, text in bad:
        with pytest.raises(error, match=text):
            await ask(header)
    # parts taken from a peer and not yet checked against the origin are not passed on
    entry.partial.mark_unchecked(["layer-0003"])
    with pytest.raises(ModelNotFound, match="not held here"):
        await ask({"sha256": entry.sha256, "op": "read", "tensor": t.name, "offset": 0, "n": 1})
    reply = await ask({"sha256": entry.sha256, "op": "hashes", "parts": parts})
    assert not any(name.startswith("blk.3.") for name in json.loads(reply.payload)["tensors"])


async def test_a_garbled_hash_list_is_a_peer_error(tmp_path):
    class Garbled:
        async def async_request(self, node_id, frame, timeout_s=None):
            return frame.reply(FrameType.MODEL_PART, {}, b"\xff not json")

    with pytest.raises(PeerError, match="unreadable tensor list"):
        await PeerPartSource(Garbled(), "a" * 64).async_hashes("b" * 64, ["layer-0000"])


async def test_the_slice_host_says_how_far_a_partial_models_layers_have_come(tmp_path, model, origin):  # noqa: F811
    from node.inference.pipeline.host import SliceHost
    from node.inference.pipeline.partials import PartialModels

    d = tmp_path / "models"
    partials = PartialModels(d)
    directory = await partials.async_open(origin.url)
    [entry] = await ModelCatalog(None).async_scan([(directory, "cli")])
    host = SliceHost(dtype="f32", partials=partials)
    seen = []
    unsubscribe = host.subscribe(lambda hosted: seen.append(hosted.summary()))
    try:
        hosted = await host.async_load(entry, 2, 5)
        assert hosted.state == "loaded", hosted.error
        fetching = [s for s in seen if s["fetch"]]
        assert fetching and all(s["state"] == "loading" for s in fetching)
        last = fetching[-1]["fetch"]
        assert last["done_bytes"] == last["total_bytes"] > 0  # the GUI's row reaches 100 %
        assert seen[0]["state"] == "loading" and seen[-1]["state"] == "loaded" and seen[-1]["fetch"] is None
        await host.async_unload(hosted)
        assert seen[-1]["state"] == "unloaded"
    finally:
        unsubscribe()
        await host.async_close()


async def test_slices_on_parts_that_later_fail_their_check_are_dropped(tmp_path, model, origin, monkeypatch):  # noqa: F811
    """A peer's parts taken while the origin was unreachable are used unchecked; when a later fetch
    reaches the origin and they prove altered, the slices on them go, their converted weights go,
    and the layers come again from the origin."""
    from node.inference.pipeline import partials as partials_module
    from node.inference.pipeline.host import SliceHost
    from node.inference.pipeline.partials import PartialModels
    from node.models.partial import SpotCheckFailed
    from tests.models.test_partial_peers import StoreSource

    holder = tmp_path / "a.partial"
    a_store, a_manifest = await async_open_partial(origin.url, holder)
    await async_fetch_parts(a_store, a_manifest, parts_for(read_header(a_store.header_path), 2, 5))
    partials = PartialModels(tmp_path / "models")
    directory = await partials.async_open(origin.url)
    [entry] = await ModelCatalog(None).async_scan([(directory, "cli")])
    store = PartialStore(directory)
    lying = StoreSource(a_store, flip={"layer-0002", "layer-0003", "layer-0004"}, lie=True)
    taken = await async_fetch_parts_from(store, entry.partial, parts_for(entry.header, 2, 5), lying,
                                         origin_url="http://127.0.0.1:1/m.gguf", rng=random.Random(1))
    assert taken.parts and entry.partial.unchecked == set(taken.parts)

    async def unreachable(*_a, **_k):
        raise SpotCheckFailed("origin unreachable (test)")
    monkeypatch.setattr(partials_module, "async_spot_check_held", unreachable)
    host = SliceHost(dtype="f32", partials=partials)
    try:
        first = await host.async_load(entry, 2, 5)
        assert first.state == "loaded"  # on unchecked (altered) bytes: the origin could not say
        monkeypatch.undo()  # the origin is back
        second = await host.async_load(entry, 3, 4)
        assert second.state == "loaded", second.error
        for _ in range(200):  # the drop's unload runs as its own task
            if first.state == "unloaded":
                break
            await asyncio.sleep(0.01)
        assert first.state == "unloaded" and host.find(entry.sha256, 2, 5) is None
        assert not entry.partial.unchecked
        raw = store.part_path("layer-0003").read_bytes()
        assert all(raw[t.local:t.local + t.n_bytes] == origin.data[t.offset:t.offset + t.n_bytes]
                   for t in entry.partial.part_tensors("layer-0003"))
    finally:
        await host.async_close()


async def test_a_peer_cannot_make_the_server_hold_more_than_a_window(tmp_path, model, origin, monkeypatch):  # noqa: F811
    from node.errors import Overloaded
    from node.inference.pipeline import part_server as part_server_module

    catalog, entry, parts = await _holder(tmp_path, origin)
    server = PartServer(catalog)
    t = next(t for t in entry.partial.tensors.values() if t.part == "layer-0003")
    ask = {"sha256": entry.sha256, "op": "read", "tensor": t.name, "offset": 0, "n": 16}

    class Unread(Link):
        unsent = part_server_module._SERVE_UNSENT_MAX + 1  # it asks and never reads its replies

    with pytest.raises(Overloaded, match="not read"):
        await server.async_handle(Unread(), Frame(FrameType.MODEL_PART, ask))
    # more requests at once than a client's window: the extra ones are refused, the rest answered
    gate = asyncio.Event()
    answer = server._async_answer

    async def slow(link, frame):
        await gate.wait()
        return await answer(link, frame)
    monkeypatch.setattr(server, "_async_answer", slow)
    link = Link()
    tasks = [asyncio.ensure_future(server.async_handle(link, Frame(FrameType.MODEL_PART, ask)))
             for _ in range(part_server_module._SERVE_PER_LINK + 3)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    refused = [r for r in results if isinstance(r, Overloaded)]
    assert len(refused) == 3 and all(isinstance(r, Frame) for r in results if r not in refused)
    assert server._serving == {}  # nothing counted once they are done


async def test_a_slice_given_up_while_claiming_fetches_nothing(tmp_path, model, origin):  # noqa: F811
    from node.inference.pipeline.host import SliceHost
    from node.inference.pipeline.partials import PartialModels

    partials = PartialModels(tmp_path / "models")
    directory = await partials.async_open(origin.url)
    [entry] = await ModelCatalog(None).async_scan([(directory, "cli")])
    host = SliceHost(dtype="f32", partials=partials)
    seen = []

    async def claim() -> bool:  # what peers see meanwhile: the slice, advertised as loading
        seen.extend(host.adverts(loading=True))
        assert host.adverts() == []  # never to a planner
        return False
    try:
        before = origin.sent
        hosted = await host.async_load(entry, 2, 5, claim=claim)
        assert hosted.state == "unloaded" and not host.slices and origin.sent == before
        assert seen and seen[0]["loading"] is True and (seen[0]["start"], seen[0]["end"]) == (2, 5)
    finally:
        await host.async_close()


async def test_a_loading_slice_tells_peers_how_far_its_fetch_is(tmp_path, model, origin, monkeypatch):  # noqa: F811
    """Peers' layer choices keep a claim while its fetch moves (autoserve.AutoServe.coverage): the
    loading advert carries `fetch: [done, total]`, and the progress is announced again every
    CLAIM_PROGRESS_ANNOUNCE_S, not on every chunk."""
    from node.inference.pipeline.host import SliceHost
    from node.inference.pipeline.partials import PartialModels

    monkeypatch.setattr(const, "DOWNLOAD_PROGRESS_S", 0.0)
    monkeypatch.setattr(const, "CLAIM_PROGRESS_ANNOUNCE_S", 0.3)
    partials = PartialModels(tmp_path / "models")
    directory = await partials.async_open(origin.url)
    [entry] = await ModelCatalog(None).async_scan([(directory, "cli")])
    host = SliceHost(dtype="f32", partials=partials)
    announced: list[list] = []
    host.on_advert = lambda: announced.append(host.adverts(loading=True))
    origin.stall_after = origin.sent + 64 * 1024  # one piece, then the origin waits
    try:
        load = asyncio.ensure_future(host.async_load(entry, 2, 5))

        def fetching():
            return [a for a in host.adverts(loading=True) if a.get("fetch", [0])[0] > 0]
        await wait_until(fetching, 10.0, 0.02, "a loading advert with fetched bytes")
        [advert] = fetching()
        done, total = advert["fetch"]
        assert advert["loading"] is True and 0 < done < total
        before = len(announced)  # (on a slow machine the first pieces may come 0.3 s apart: announced)
        await asyncio.sleep(0.5)
        assert len(announced) == before  # a stalled fetch has nothing new to say
        started = asyncio.get_running_loop().time()
        origin.release.set()  # the fetch moves again: the next piece's progress goes to peers
        hosted = await asyncio.wait_for(load, 60)
        assert hosted.state == "loaded", hosted.error
        moved = announced[before:]
        assert moved and all(a["fetch"][0] > done for [a] in moved), announced
        assert host.adverts(loading=True) == host.adverts() and "fetch" not in host.adverts()[0]
        # throttled: one announcement per 0.3 s at most, not one per 64 KiB piece
        assert len(moved) <= 1 + (asyncio.get_running_loop().time() - started) / 0.3, len(moved)
    finally:
        origin.release.set()
        await host.async_close()


def test_a_loading_advert_is_counted_by_layer_choices_but_never_routed_to():
    from types import SimpleNamespace

    from node.inference.headers import parse_advert
    from node.inference.pipeline.coverage import swarm_coverage
    from node.inference.pipeline.holders import _holder

    advert = {"sha256": "a" * 64, "name": "m", "n_layers": 8, "start": 2, "end": 5, "loading": True}
    snap = SimpleNamespace(node_id="b" * 64, transport="direct", rtt_ms=1.0, region=None, state="connected",
                           models=[advert])
    assert _holder(snap, advert, None) is None
    assert _holder(snap, {**advert, "loading": False}, None) is not None
    [span] = swarm_coverage("c" * 64, [], [snap])["a" * 64].spans
    assert (span.start, span.end) == (2, 5)
    # its fetch progress, read where it is well formed (a peer's advert is input)
    for fetch, read in (([300, 1000], 300), ([0, 1000], 0), ([1001, 1000], None), (["300", 1000], None),
                        ([True, 1000], None), ([300], None), (300, None)):
        snap.models = [{**advert, "fetch": fetch}]
        assert swarm_coverage("c" * 64, [], [snap])["a" * 64].fetched.get(("b" * 64, 2, 5)) == read, fetch
    snap.models = [{**advert, "loading": False, "fetch": [300, 1000]}]  # a loaded one has no fetch to read
    assert swarm_coverage("c" * 64, [], [snap])["a" * 64].fetched == {}
    snap.models = [advert]
    full = {**advert, "header_sha256": "d" * 64, "header_bytes": 1000}
    assert not parse_advert("b" * 64, full).servable  # nobody fetches a header for it from a loading slice
    assert parse_advert("b" * 64, {**full, "loading": False}).servable


async def test_of_two_nodes_claiming_the_same_layers_at_once_the_higher_id_yields(tmp_path, model, origin,  # noqa: F811
                                                                                 monkeypatch):
    from node.inference.pipeline.autoserve import AutoServe
    from node.inference.pipeline.host import SliceHost
    from node.inference.pipeline.partials import PartialModels
    from tests.pipeline.test_autoserve_moves import ScriptedPeers, peer

    monkeypatch.setattr(const, "AUTO_SERVE_REACT_S", 0.01)
    partials = PartialModels(tmp_path / "models")
    directory = await partials.async_open(origin.url)
    [entry] = await ModelCatalog(None).async_scan([(directory, "cli")])
    host = SliceHost(dtype="f32", partials=partials)
    peers = ScriptedPeers()
    announced = []

    async def announce():  # the first announcement is our claim; a peer claimed the same moment
        announced.append(host.adverts(loading=True))
        if len(announced) == 1:
            rival = peer("aa" * 32, 0, entry.n_layers, entry.sha256)
            rival.models = ({**rival.models[0], "loading": True},)
            peers.snaps = [rival]

    auto = AutoServe("mm" * 32, host, peers, [entry], announce=announce, budget_mb=64)
    m = auto.models[0]
    try:
        await auto._async_budget(m, asyncio.get_running_loop())
        before = origin.sent
        await auto._async_evaluate(m, "start")
        assert announced[0] and announced[0][0]["loading"] is True  # claimed, as loading
        assert not host.slices and origin.sent == before  # yielded: nothing fetched
        assert "yielded_to_aaaaaaaa" in auto.decisions[-1] and auto._wake.is_set()
        assert announced[-1] == []  # and said so
        # the lower id keeps its claim: the same race seen from its side loads
        peers2 = ScriptedPeers()

        async def announce2():
            higher = peer("ff" * 32, 0, entry.n_layers, entry.sha256)
            higher.models = ({**higher.models[0], "loading": True},)
            peers2.snaps = [higher]
        auto2 = AutoServe("00" * 32, host, peers2, [entry], announce=announce2, budget_mb=64)
        m2 = auto2.models[0]
        await auto2._async_budget(m2, asyncio.get_running_loop())
        await auto2._async_evaluate(m2, "start")
        assert [(s.start, s.end) for s in host.slices.values() if s.state == "loaded"]
    finally:
        await host.async_close()


async def test_parts_of_a_range_no_longer_chosen_go_once_the_new_choice_has_loaded(tmp_path, model, origin, monkeypatch):  # noqa: F811
    """A node restarted with layers 4-7 on disk while the swarm needed 0-3: it fetched 0-3 and
    kept 4-7's parts, the file on disk growing to the whole model (a swarm test, 2026-12-06)."""
    from types import SimpleNamespace

    from node.inference.pipeline.autoserve import AutoServe
    from node.inference.pipeline.host import SliceHost
    from node.inference.pipeline.partials import PartialModels

    for name, value in (("AUTO_SERVE_LOOK_S", 0.0), ("AUTO_SERVE_START_DELAY_S", 0.0), ("AUTO_SERVE_REACT_S", 0.01)):
        monkeypatch.setattr(const, name, value)
    partials = PartialModels(tmp_path / "models")
    directory = await partials.async_open(origin.url)
    store = PartialStore(directory)
    manifest = store.load()
    await async_fetch_parts(store, manifest, parts_for(read_header(store.header_path), 4, 8))  # the last run's range
    [entry] = await ModelCatalog(None).async_scan([(directory, "cli")])
    assert entry.partial.held_layers == [4, 5, 6, 7]
    sha = entry.sha256
    holders = [SimpleNamespace(node_id=f"p{i}" * 32, state="connected", models=(
        {"sha256": sha, "name": "part8", "n_layers": 8, "start": 4, "end": 8, "ms_per_layer": None},)) for i in range(2)]
    peers = SimpleNamespace(peers=lambda: holders, subscribe=lambda callback: (lambda: None))
    host = SliceHost(dtype="f32", kv_dtype="f32", partials=partials)

    async def nothing():
        return None

    auto = AutoServe("me" * 32, host, peers, [entry], announce=nothing, budget_mb=18)  # 4 layers (4.2 MB each)
    auto.start()
    try:
        await wait_until(lambda: host.find(sha, 0, 4) is not None and host.find(sha, 0, 4).state == "loaded",
                         30.0, 0.05, "layers 0-3, the ones the swarm lacks")
        await wait_until(lambda: entry.partial.held_layers == [0, 1, 2, 3], 10.0, 0.05, "4-7's parts to go")
        assert "head" not in entry.partial.complete and "embd" in entry.partial.complete
    finally:
        await auto.async_stop()
        await host.async_close()


async def test_a_model_url_unreachable_at_start_is_served_once_its_origin_answers(tmp_path, model, origin, monkeypatch, caplog):  # noqa: F811
    """A fresh `--model URL --serve auto` node whose origin was down exited at start-up (a swarm
    test, 2026-12-06), though its peers might serve every layer. It now starts, and opens the
    model in the background once the origin answers."""
    import logging

    for name, value in (("AUTO_SERVE_LOOK_S", 0.0), ("AUTO_SERVE_START_DELAY_S", 0.0), ("AUTO_SERVE_REACT_S", 0.01),
                        ("PARTIAL_OPEN_RETRY_MIN_S", 0.1), ("DOWNLOAD_RETRY_BASE_S", 0.01)):
        monkeypatch.setattr(const, name, value)
    origin.unavailable = True
    caplog.set_level(logging.INFO)
    config = node_config(tmp_path / "data", models=[origin.url], serve="auto", slice_budget_mb=64,
                         slice_dtype="f32", slice_kv_dtype="f32")
    async with running_node(config) as node:
        assert node.models.all() == [] and "DIAG: model URL unreachable at start" in caplog.text
        await wait_until(lambda: "DIAG: model URL still unreachable" in caplog.text, 10.0, 0.05, "a retry")
        origin.unavailable = False
        await wait_until(lambda: any(s.state == "loaded" for s in node.slice_host.slices.values()), 30.0, 0.05,
                         "the model's layers, once the origin answers")
        assert [m.entry.name for m in node.models.all()] == ["m"]


async def test_a_failed_slice_load_keeps_the_parts_it_fetched_for_the_retry(tmp_path, model, origin, monkeypatch):  # noqa: F811
    """A failed load unloaded its slice with its parts, so each retry (every few seconds now)
    fetched the range again from zero: on a flaky origin a big range never finished (a review,
    2026-12-06). The parts stay; the retry loads them without fetching again."""
    from types import SimpleNamespace

    from node.inference.pipeline.autoserve import AutoServe
    from node.inference.pipeline.host import SliceHost
    from node.inference.pipeline.partials import PartialModels
    from node.inference.slice import SliceModel

    for name, value in (("AUTO_SERVE_LOOK_S", 0.0), ("AUTO_SERVE_START_DELAY_S", 0.0), ("AUTO_SERVE_REACT_S", 0.01),
                        ("AUTO_SERVE_RETRY_MIN_S", 0.1)):
        monkeypatch.setattr(const, name, value)
    real_load, fails = SliceModel.load, [1]

    def flaky_load(*args, **kwargs):
        if fails[0]:
            fails[0] -= 1
            raise OSError("the disk hiccuped")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(SliceModel, "load", staticmethod(flaky_load))
    partials = PartialModels(tmp_path / "models")
    directory = await partials.async_open(origin.url)
    [entry] = await ModelCatalog(None).async_scan([(directory, "cli")])
    peers = SimpleNamespace(peers=lambda: [], subscribe=lambda callback: (lambda: None))
    host = SliceHost(dtype="f32", kv_dtype="f32", partials=partials)

    async def nothing():
        return None

    auto = AutoServe("me" * 32, host, peers, [entry], announce=nothing, budget_mb=18)  # 4 layers
    auto.start()
    try:
        await wait_until(lambda: auto.models[0].failures == 1, 30.0, 0.05, "the first load to fail")
        sent = origin.sent
        assert entry.partial.held_layers  # its parts stayed
        await wait_until(lambda: any(s.state == "loaded" for s in host.slices.values()), 30.0, 0.05, "the retry")
        assert origin.sent == sent  # nothing fetched again
    finally:
        await auto.async_stop()
        await host.async_close()
