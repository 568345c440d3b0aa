"""A peer's claim on layers (`"loading": true`) that has not turned into served layers after
AUTO_SERVE_CLAIM_STALE_S no longer counts as a holder of them: the nodes that could cover them
do. On real nodes (a churn test, 2026-12-06): of three `--serve auto` nodes with room for half of
auto8 each, the one whose origin trickled claimed layers 0-3; the third node, seeing 0-3 "held",
doubled 4-7, and for the 150 s watched (the claim would last as long as the fetch) no node held
0-3: the model could not be served although two nodes with a working origin could hold it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from node import const
from tests.pipeline.test_autoserve_moves import setup
from tests.support.helpserve import quick_choice
from tests.support.waiting import wait_until


def advert(node_id, start, end, sha, **extra):
    return SimpleNamespace(node_id=node_id, state="connected", models=(
        {"sha256": sha, "name": "mv8", "n_layers": 8, "start": start, "end": end, "ms_per_layer": None, **extra},))


async def test_a_claim_that_never_loads_stops_counting_and_its_layers_are_covered(tmp_path, monkeypatch):
    quick_choice(monkeypatch, drain_poll_s=0.05)
    monkeypatch.setattr(const, "AUTO_SERVE_CLAIM_STALE_S", 1.0, raising=False)
    entry, host, peers, auto, model, old, announced = await setup(tmp_path)  # this node serves 4-7
    sha = entry.sha256
    auto.reevaluate_s = 600.0  # no periodic round during the test: the claim's staleness must wake it
    # 4-7: this node and p1 (`--layers`: it never moves); 0-3: only p0's claim, whose layers never arrive
    peers.snaps = [advert("p0" * 32, 0, 4, sha, loading=True, auto_budget=[4, 4]), advert("p1" * 32, 4, 8, sha)]
    auto.start()
    try:
        await asyncio.sleep(0.5)  # a fresh claim counts: nobody races it for its layers
        assert host.find(sha, 0, 4) is None and host.find(sha, 4, 8) is old
        await wait_until(lambda: host.find(sha, 0, 4) is not None and host.find(sha, 0, 4).state == "loaded",
                         10.0, 0.05, f"this node to cover 0-3 once the claim went stale ({auto.decisions})")
        assert any("range=0-3" in d and "move_from_4-7" in d for d in auto.decisions), auto.decisions
    finally:
        await asyncio.wait_for(auto.async_stop(), 30)
        await host.async_close()


async def test_a_claim_whose_fetch_moves_keeps_its_layers_until_the_fetch_stalls(tmp_path, monkeypatch):
    """A real slice over Wi-Fi takes minutes: while the claimer's advert says its fetch moves, its
    claim holds (no second node fetches the same layers); once the fetch stops moving for
    AUTO_SERVE_CLAIM_STALE_S, it no longer does. (Until 2026-12-06 every claim went stale 60 s after
    it was first seen, whatever its fetch did.)"""
    quick_choice(monkeypatch, drain_poll_s=0.05)
    monkeypatch.setattr(const, "AUTO_SERVE_CLAIM_STALE_S", 1.0)
    entry, host, peers, auto, model, old, announced = await setup(tmp_path)  # this node serves 4-7
    sha = entry.sha256
    auto.reevaluate_s = 600.0
    total = 10_000_000

    def claim(done):
        peers.snaps = [advert("p0" * 32, 0, 4, sha, loading=True, auto_budget=[4, 4], fetch=[done, total]),
                       advert("p1" * 32, 4, 8, sha)]

    claim(0)
    auto.start()
    try:
        loop = asyncio.get_running_loop()
        moving_until = loop.time() + 3.0  # three stale periods of a fetch that moves
        done = 0
        while loop.time() < moving_until:
            await asyncio.sleep(0.25)
            done += 100_000
            claim(done)
            assert host.find(sha, 0, 4) is None, f"the moving claim lost its layers ({auto.decisions})"
        assert host.find(sha, 4, 8) is old
        # the fetch stalls: within a stale period or two, this node covers 0-3
        await wait_until(lambda: host.find(sha, 0, 4) is not None and host.find(sha, 0, 4).state == "loaded",
                         10.0, 0.05, f"this node to cover 0-3 once the fetch stalled ({auto.decisions})")
    finally:
        await asyncio.wait_for(auto.async_stop(), 30)
        await host.async_close()


async def test_a_claim_that_only_trickles_is_stale_at_the_cap(tmp_path, monkeypatch):
    """A fetch that creeps on (or a member that makes its numbers up) holds a claim at most
    AUTO_SERVE_CLAIM_MAX_S from its first sight."""
    quick_choice(monkeypatch, drain_poll_s=0.05)
    monkeypatch.setattr(const, "AUTO_SERVE_CLAIM_STALE_S", 1.0)
    monkeypatch.setattr(const, "AUTO_SERVE_CLAIM_MAX_S", 2.0)
    entry, host, peers, auto, model, old, announced = await setup(tmp_path)
    sha = entry.sha256
    auto.reevaluate_s = 600.0
    state = {"done": 0}

    async def creep():
        while True:
            state["done"] += 1
            peers.snaps = [advert("p0" * 32, 0, 4, sha, loading=True, auto_budget=[4, 4],
                                  fetch=[state["done"], 10**9]), advert("p1" * 32, 4, 8, sha)]
            await asyncio.sleep(0.2)

    creeper = asyncio.create_task(creep())
    await asyncio.sleep(0)
    started = asyncio.get_running_loop().time()
    auto.start()
    try:
        await wait_until(lambda: host.find(sha, 0, 4) is not None and host.find(sha, 0, 4).state == "loaded",
                         10.0, 0.05, f"this node to cover 0-3 at the claim's cap ({auto.decisions})")
        assert asyncio.get_running_loop().time() - started >= 2.0 - 0.2  # not before the cap
    finally:
        creeper.cancel()
        await asyncio.wait_for(auto.async_stop(), 30)
        await host.async_close()
