"""SwarmModels: a model peers advertise is registered for its tokenizer once its header is here; a
request naming it while the header is on the way waits; the cache serves the next start; a model
no holder gives a valid header of stays unknown. The holder side is the real HeaderServer (see
test_headers.py); the peer table is a stand-in with the PeerManager methods SwarmModels uses."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import threading
from types import SimpleNamespace

import pytest

from node import const
from node.config import NodeConfig
from node.errors import Conflict, ModelNotFound
from node.inference.headers import HeaderFetcher
from node.inference.manager import ModelManager
from node.inference.swarm_models import SwarmModels
from node.inference.synth import SynthSpec, write_gguf
from node.models.catalog import ModelCatalog
from node.models.header import HeaderCache, extract_header
from node.observe import Observers
from tests.inference.test_headers import HOLDER, LIAR, Holders, Origin
from tests.support.waiting import wait_until

pytestmark = pytest.mark.llama

SPEC = SynthSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=512, name="swm")


class Table:
    """The peer table: connected peers and their HELLO adverts; observers told of changes."""

    def __init__(self):
        self.snaps: dict[str, SimpleNamespace] = {}
        self.observers = Observers("peer")

    def peers(self):
        return list(self.snaps.values())

    def subscribe(self, callback):
        return self.observers.subscribe(callback)

    def connect(self, node_id, models, address="127.0.0.1:47301"):
        """`address`: the link's remote end, as a snapshot of a direct link has it."""
        self.snaps[node_id] = SimpleNamespace(node_id=node_id, state="connected", models=tuple(models),
                                              transport="direct", address=address)
        self.observers.emit("changed", self.snaps[node_id])


class GatedHolders(Holders):
    def __init__(self, catalog):
        super().__init__(catalog)
        self.gate = asyncio.Event()
        self.asked = asyncio.Event()

    async def async_request(self, node_id, frame, timeout_s=None):
        self.asked.set()
        await self.gate.wait()
        return await super().async_request(node_id, frame, timeout_s)


@pytest.fixture(scope="module")
def holder(tmp_path_factory):
    base = tmp_path_factory.mktemp("swm")
    catalog = ModelCatalog(base)
    (entry,) = catalog.scan([(write_gguf(base / "swm.gguf", SPEC), "cli")])
    advert = {"sha256": entry.sha256, "name": entry.name, "n_layers": entry.n_layers, "start": 0, "end": 3,
              "architecture": entry.architecture, "header_sha256": entry.header_sha256,
              "header_bytes": entry.header_bytes, "size_bytes": entry.size_bytes}
    return SimpleNamespace(catalog=catalog, entry=entry, advert=advert)


def _bare(tmp_path, holders):
    catalog = ModelCatalog(tmp_path)
    models = ModelManager(NodeConfig(data_dir=tmp_path), catalog)
    table = Table()
    swarm = SwarmModels(catalog, models, table, HeaderCache(tmp_path / "headers"), HeaderFetcher(holders))
    models.swarm_lookup = swarm.async_wait_for
    return catalog, models, table, swarm


def test_a_request_waits_for_the_header_then_resolves_by_id_name_and_hash(holder, tmp_path):
    async def go():
        holders = GatedHolders(holder.catalog)
        catalog, models, table, swarm = _bare(tmp_path, holders)
        swarm.start()
        table.connect(HOLDER, [holder.advert])
        waiting = asyncio.ensure_future(models.async_get(holder.entry.id))
        await asyncio.wait_for(holders.asked.wait(), 30)
        await asyncio.sleep(0)  # one more pass: the request is parked on the fetch, not done
        assert not waiting.done()  # the fetch is held at the gate: the request waits for it
        with pytest.raises(ModelNotFound):
            await models.async_get("some-other-model")  # nothing on its way: at once
        holders.gate.set()
        served = await asyncio.wait_for(waiting, 30)
        assert served.id == holder.entry.id and not served.whole and served.tokenizer is not None
        assert served.entry.source == "swarm" and served.entry.sha256 == holder.entry.sha256
        assert served.n_ctx == models._context_for(holder.entry)
        for name in (holder.entry.name, holder.entry.sha256[:10]):
            assert (await models.async_get(name)).id == holder.entry.id
        assert swarm.fetches == 1
        swarm.close()
        await models.async_close()
    asyncio.run(go())


def test_the_cache_serves_the_next_start_without_a_fetch(holder, tmp_path):
    async def start_once():
        holders = Holders(holder.catalog)
        catalog, models, table, swarm = _bare(tmp_path, holders)
        swarm.start()
        table.connect(HOLDER, [holder.advert])
        served = await models.async_get(holder.entry.id)
        assert served.tokenizer is not None
        swarm.close()
        await models.async_close()
        return swarm.fetches, len(holders.requests)
    assert asyncio.run(start_once())[0] == 1
    assert asyncio.run(start_once()) == (0, 0)


def test_only_lying_holders_leave_the_model_unknown(holder, tmp_path):
    async def go():
        catalog, models, table, swarm = _bare(tmp_path, Holders(holder.catalog))
        swarm.start()
        table.connect(LIAR, [holder.advert])
        with pytest.raises(ModelNotFound):
            await models.async_get(holder.entry.id)
        assert catalog.by_sha(holder.entry.sha256) is None
        assert not (tmp_path / "headers").exists() or not list((tmp_path / "headers").iterdir())
        swarm.close()
        await models.async_close()
    asyncio.run(go())


def test_a_fetch_failing_with_an_unexpected_error_is_waited_out_not_repeated_at_once(holder, tmp_path):
    """Review r74: an error of a kind nothing expected (a header nested past Python's recursion limit
    raised RecursionError) escaped `_async_obtain`'s NodeError handler: the model was never marked
    failed, and each end of the task started the fetch again at once (23 a second, forever)."""
    async def go():
        catalog, models, table, swarm = _bare(tmp_path, Holders(holder.catalog))
        calls = []

        async def broken(adverts):
            calls.append(len(adverts))
            raise RuntimeError("a bug")
        swarm.fetcher.async_fetch = broken
        swarm.start()
        table.connect(HOLDER, [holder.advert])
        await wait_until(lambda: holder.entry.sha256 in swarm._failed_at, 30, what="the fetch marked failed")
        assert calls == [1], calls
        assert catalog.by_sha(holder.entry.sha256) is None
        swarm.close()
        await models.async_close()
    asyncio.run(go())


def _advert_of(entry, **over):
    return {"sha256": entry.sha256, "name": entry.name, "n_layers": entry.n_layers, "start": 0, "end": 3,
            "architecture": entry.architecture, "header_sha256": entry.header_sha256,
            "header_bytes": entry.header_bytes, "size_bytes": entry.size_bytes, **over}


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """Three models one holder serves."""
    base = tmp_path_factory.mktemp("many")
    catalog = ModelCatalog(base)
    paths = [(write_gguf(base / f"m{i}.gguf", dataclasses.replace(SPEC, seed=10 + i, name=f"m{i}")), "cli")
             for i in range(3)]
    entries = catalog.scan(paths)
    assert len(entries) == 3
    return SimpleNamespace(catalog=catalog, entries=entries, adverts=[_advert_of(e) for e in entries])


def test_a_fake_sha_copying_a_local_models_id_never_replaces_it(holder, tmp_path):
    """A peer advertises a made-up sha256 whose first 8 hex digits and name are a local model's
    (so the same id), with a real header: the local model stays what this node serves."""
    async def go():
        catalog, models, table, swarm = _bare(tmp_path, Holders(holder.catalog))
        local_path = tmp_path / "mine" / "swm.gguf"
        local_path.parent.mkdir()
        local_path.write_bytes(write_gguf(tmp_path / "other.gguf", dataclasses.replace(SPEC, seed=5)).read_bytes())
        (local,) = await catalog.async_scan([(local_path, "cli")])
        await models.async_register(local)
        fake = local.sha256[:8] + ("0" if local.sha256[8] != "0" else "1") * 56
        data, header = extract_header(holder.catalog.entries[holder.entry.id].path)
        swarm.cache.store(fake, data, header)  # a valid header is at hand: nothing stops it but the id check
        swarm.start()
        table.connect(LIAR, [{**holder.advert, "sha256": fake, "name": local.name}])
        await wait_until(lambda: all(t.done() for t in swarm._tasks.values()), what="no fetch running")
        served = models.get(local.id)
        assert served.entry is local and served.whole and catalog.entries[local.id] is local
        assert catalog.by_sha(fake) is None and [s.entry for s in models.all()] == [local]
        swarm.close()
        await models.async_close()
    asyncio.run(go())


def test_a_download_finishing_during_the_fetch_wins(holder, tmp_path):
    async def go():
        holders = GatedHolders(holder.catalog)
        catalog, models, table, swarm = _bare(tmp_path, holders)
        swarm.start()
        table.connect(HOLDER, [holder.advert])
        await asyncio.wait_for(holders.asked.wait(), 30)
        (tmp_path / "dl").mkdir()
        copy = shutil.copy(holder.catalog.entries[holder.entry.id].path, tmp_path / "dl" / "swm.gguf")
        (mine,) = await catalog.async_scan([(copy, "data_dir")])  # the download lands: same content, same id
        await models.async_register(mine)
        holders.gate.set()
        await wait_until(lambda: all(t.done() for t in swarm._tasks.values()), what="the header fetch to finish")
        served = models.get(holder.entry.id)
        assert served.entry is mine and served.whole and catalog.entries[mine.id] is mine
        swarm.close()
        await models.async_close()
    asyncio.run(go())


def test_register_never_replaces_a_model_but_a_file_replaces_its_header(holder, tmp_path):
    async def go():
        catalog, models, table, swarm = _bare(tmp_path, Holders(holder.catalog))
        swarm.start()
        table.connect(HOLDER, [holder.advert])
        header_only = (await models.async_get(holder.entry.id)).entry
        assert not header_only.has_file
        with pytest.raises(Conflict):
            await models.async_register(header_only, whole=False)  # the same again: refused
        stranger = dataclasses.replace(header_only)
        with pytest.raises(Conflict):
            await models.async_register(stranger, whole=False)  # not the catalog's entry
        copy = shutil.copy(holder.catalog.entries[holder.entry.id].path, tmp_path / "swm.gguf")
        (mine,) = await catalog.async_scan([(copy, "data_dir")])
        assert (await models.async_register(mine)).entry is mine  # the file replaces the header
        with pytest.raises(Conflict):
            await models.async_register(mine)
        swarm.close()
        await models.async_close()
    asyncio.run(go())


def test_swarm_only_models_are_capped(many, tmp_path, monkeypatch):
    monkeypatch.setattr(const, "MODEL_SWARM_MAX", 2, raising=False)

    async def go():
        catalog, models, table, swarm = _bare(tmp_path, Holders(many.catalog))
        swarm.start()
        table.connect(HOLDER, many.adverts)
        await wait_until(lambda: all(t.done() for t in swarm._tasks.values()), what="the header fetches to finish")
        table.connect(HOLDER, many.adverts)  # a later HELLO: still capped
        await wait_until(lambda: all(t.done() for t in swarm._tasks.values()), what="the header fetches to finish")
        assert sum(1 for e in catalog.entries.values() if e.source == "swarm") == 2 == len(models.all())
        swarm.close()
        await models.async_close()
    asyncio.run(go())


def test_fetches_are_queued_at_most_the_cap_and_the_rest_follow(many, tmp_path, monkeypatch):
    monkeypatch.setattr(const, "MODEL_HEADER_QUEUE", 1, raising=False)

    async def go():
        holders = GatedHolders(many.catalog)
        catalog, models, table, swarm = _bare(tmp_path, holders)
        swarm.start()
        table.connect(HOLDER, many.adverts)
        assert len(swarm._tasks) == 1  # one fetch started; the other two wait for a place
        holders.gate.set()
        await wait_until(lambda: len(models.all()) == 3, what="all three registered in turn")
        assert {s.entry.sha256 for s in models.all()} == {e.sha256 for e in many.entries}
        swarm.close()
        await models.async_close()
    asyncio.run(go())


def test_only_a_servable_advert_makes_a_fetch(holder, tmp_path):
    async def go():
        holders = Holders(holder.catalog)
        catalog, models, table, swarm = _bare(tmp_path, holders)
        swarm.start()
        bare = {k: v for k, v in holder.advert.items() if k not in ("start", "end")}
        table.connect(HOLDER, [bare])
        table.connect(HOLDER, [{**bare, "whole": True, "paused": True}])
        assert not swarm._tasks and holders.requests == []
        table.connect(HOLDER, [{**bare, "whole": True}])
        assert (await models.async_get(holder.entry.id)).entry.sha256 == holder.entry.sha256
        swarm.close()
        await models.async_close()
    asyncio.run(go())


def test_a_file_registered_while_its_headers_vocabulary_is_read_stays(holder, tmp_path, monkeypatch):
    """A download of a model a peer serves lands while the header-only registration reads its
    vocabulary (off the loop): the file's registration, made meanwhile, stays (2026-12-07). The
    header-only one replaced it as it ended: the model was served from the swarm only, the file here
    never loaded whole until a restart."""
    from node.inference import manager as manager_module

    reading, release = threading.Event(), threading.Event()
    real = manager_module.ModelTokenizer

    def gated(path):
        if "headers" in str(path):  # the header-only entry's vocabulary (the headers cache)
            reading.set()
            assert release.wait(30)
        return real(path)

    monkeypatch.setattr(manager_module, "ModelTokenizer", gated)

    async def go():
        catalog, models, table, swarm = _bare(tmp_path, Holders(holder.catalog))
        try:
            swarm.start()
            table.connect(HOLDER, [holder.advert])
            assert await asyncio.get_running_loop().run_in_executor(None, reading.wait, 30)
            copy = shutil.copy(holder.catalog.entries[holder.entry.id].path, tmp_path / "swm.gguf")
            (mine,) = await catalog.async_scan([(copy, "data_dir")])  # the download lands
            assert (await models.async_register(mine)).entry is mine
            release.set()
            await wait_until(lambda: all(t.done() for t in swarm._tasks.values()), what="the header's registration")
            served = models.get(holder.entry.id)
            assert served.entry is mine and served.whole, "the header-only registration replaced the file's"
        finally:
            release.set()
            swarm.close()
            await models.async_close()
    asyncio.run(go())


@pytest.mark.parametrize(("address", "from_origin"), [("192.168.7.20:47300", False), ("127.0.0.1:47300", True)])
def test_a_loopback_origin_is_fetched_only_for_a_peer_on_this_machine(holder, tmp_path, address, from_origin):
    """A member on another machine advertising http://127.0.0.1:PORT/PATH as its model's origin had
    this node GET its own loopback service (every node of the swarm, each retry): its loopback is
    not ours. The header comes from the holder then; a peer on this machine keeps its local mirror."""
    async def go():
        holders = Holders(holder.catalog)
        catalog, models, table, swarm = _bare(tmp_path, holders)
        async with Origin(holder.entry.path.read_bytes()) as origin:
            swarm.start()
            table.connect(HOLDER, [{**holder.advert, "origin_url": origin.url}], address=address)
            served = await asyncio.wait_for(models.async_get(holder.entry.id), 30)
            assert served.tokenizer is not None
            assert bool(origin.ranges) == from_origin, origin.ranges
            assert bool(holders.requests) != from_origin
            assert (served.entry.origin_url == origin.url) == from_origin
            assert (swarm.origin_of(served.entry) == origin.url) == from_origin
            swarm.close()
            await models.async_close()
    asyncio.run(go())


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f000001", "0.0.0.0", "[::]", "[::ffff:127.0.0.1]",
                                  "[::1]", "LOCALHOST", "localhost.localdomain", "app.localhost", "127.0.0.1."])
def test_every_spelling_of_this_machine_is_refused_from_a_remote_peer(host):
    """Review r61: https://127.1, https://2130706433, https://[::ffff:127.0.0.1] and the like passed
    for a remote host, so a member on another machine still had this node connect to its own services."""
    from node.inference.headers import _fetchable_origin

    url = f"https://{host}:8443/m.gguf"
    assert not _fetchable_origin(url, local_peer=False), url
    assert _fetchable_origin(url, local_peer=True), url  # (a peer on this machine: its loopback is ours)
    assert _fetchable_origin("https://huggingface.co/m.gguf", local_peer=False)
