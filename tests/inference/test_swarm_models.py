"""SwarmModels: a model peers advertise is registered for its tokenizer once its header is here; a
request naming it while the header is on the way waits; the cache serves the next start; a model
no holder gives a valid header of stays unknown. The holder side is the real HeaderServer (see
test_headers.py); the peer table is a stand-in with the PeerManager methods SwarmModels uses."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from node.config import NodeConfig
from node.errors import ModelNotFound
from node.inference.headers import HeaderFetcher
from node.inference.manager import ModelManager
from node.inference.swarm_models import SwarmModels
from node.inference.synth import SynthSpec, write_gguf
from node.models.catalog import ModelCatalog
from node.models.header import HeaderCache
from node.observe import Observers
from tests.inference.test_headers import HOLDER, LIAR, Holders

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

    def connect(self, node_id, models):
        self.snaps[node_id] = SimpleNamespace(node_id=node_id, state="connected", models=tuple(models))
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
