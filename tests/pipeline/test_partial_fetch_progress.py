"""The progress of fetching a slice's layers counts the whole range, whatever source each part
comes from. It was reported per source: layers taken from a peer first went 0 → 100 %, then the
rest from the origin started again at 0 % (a new total) and went to 100 % — the Swarm tab's
"Fetching layers 9–11 100%", its map bar and the Models tab's row showed 100 %, then 0 %, then
100 % again (seen in the desktop app helping serve a model two peers held in part)."""

from __future__ import annotations

from node import const
from node.inference.pipeline import partials as partials_module
from node.inference.pipeline.partials import PartialModels
from node.models.catalog import ModelCatalog
from node.models.gguf_meta import read_header
from node.models.partial import async_fetch_parts, async_open_partial, parts_for
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.models.test_partial_peers import StoreSource
from tests.support.rangeserver import ThreadedOrigin


async def test_progress_runs_once_from_0_to_100_over_peer_and_origin_parts(tmp_path, model, monkeypatch):  # noqa: F811
    monkeypatch.setattr(const, "DOWNLOAD_PROGRESS_S", 0.0)
    with ThreadedOrigin(model.read_bytes()) as origin:
        # a peer holds layers 2-3; this node fetches layers 2-5: two layers from it, two from the origin
        peer_store, peer_manifest = await async_open_partial(origin.url, tmp_path / "peer.partial")
        await async_fetch_parts(peer_store, peer_manifest, parts_for(read_header(peer_store.header_path), 2, 4))
        monkeypatch.setattr(partials_module, "PeerPartSource", lambda _peers, _node: StoreSource(peer_store))
        partials = PartialModels(tmp_path / "models")
        partials.attach(object(), lambda _sha: [("peer-a", 2, 4)])
        directory = await partials.async_open(origin.url)
        assert len(partials._open_locks) == 0, "the directory's open lock outlived the open"
        [entry] = await ModelCatalog(None).async_scan([(directory, "cli")])

        moves: list[tuple[int, int]] = []
        await partials.async_fetch(entry, 2, 6, progress=lambda done, total: moves.append((done, total)))

        assert moves, "no progress at all"
        totals = {total for _done, total in moves}
        assert len(totals) == 1, f"the total changed mid-fetch: {sorted(totals)} ({moves})"
        dones = [done for done, _total in moves]
        assert dones == sorted(dones), f"the progress went backwards: {moves}"
        assert moves[-1][0] == moves[-1][1], f"it did not end at 100 %: {moves[-1]}"
        # 100 % only at the end (it read 100 % for the peer's share, then 0 % for the origin's)
        first_full = next(i for i, (done, total) in enumerate(moves) if done == total)
        assert all(done == total for done, total in moves[first_full:]), moves
