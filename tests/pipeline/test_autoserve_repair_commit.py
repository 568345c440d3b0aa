"""A move decided below the floor must be able to commit: the commit's floor is the swarm's weakest
count before this node's new range, not with it. On real nodes (four `--serve auto` nodes of 7 of
8 layers, one holder of 0-6 SIGKILLed) a survivor holding 1-7 chose 0-6 every periodic round to
give layer 0's slow sole holder company (layer 7 kept one fast holder), fetched layer 0 and the
embeddings from a peer, loaded them, then aborted (`move_aborted:layers_7-7_would_fall_below_the_floor`:
its own new range had lifted the weakest count to two) and deleted the parts again: 11 loads and
aborts in 60 s at a 5 s re-check, one every `serve_reevaluate_s` (2 minutes) at the default, for
ever, each one a re-download of the layers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from node import const
from node.inference.pipeline.layerchoice import LayerBudget, Span, should_move, thinned_by_drop
from tests.pipeline.test_autoserve_moves import setup
from tests.support.waiting import wait_until


def peer(node_id, start, end, sha, ms):
    return SimpleNamespace(node_id=node_id, state="connected", models=(
        {"sha256": sha, "name": "mv8", "n_layers": 8, "start": start, "end": end, "ms_per_layer": ms},))


def test_the_commit_floor_does_not_count_the_movers_new_range():
    # 0-3: one slow holder; 4-7: b and a fast holder. b moving to 0-3 leaves 4-7 one fast holder:
    # the weakest layer's count stays one, its throughput rises (a clear gain below the floor)
    spans = [Span("a", 0, 4, 10.0), Span("b", 4, 8), Span("c", 4, 8, 0.5)]
    d = should_move(8, spans, "b", LayerBudget(4, 4))
    assert d is not None and (d.start, d.end) == (0, 4)
    # with the new range loaded, dropping the old one thins 4-7 to the floor as it was (one): allowed
    assert thinned_by_drop(8, [*spans, Span("b", 0, 4)], "b", 4, 8) == []


async def test_a_repair_that_swaps_the_thin_layer_commits_and_does_not_loop(tmp_path, monkeypatch):
    monkeypatch.setattr(const, "AUTO_SERVE_DRAIN_POLL_S", 0.05)
    entry, host, peers, auto, model, old, announced = await setup(tmp_path)  # this node: 4-7 loaded
    try:
        await _repair_commits(entry, host, peers, auto, model, old, announced)
    finally:
        await asyncio.wait_for(auto.async_stop(), 30)
        await host.async_close()


async def _repair_commits(entry, host, peers, auto, model, old, announced):
    sha = entry.sha256
    peers.snaps = [peer("p0" * 32, 0, 4, sha, 10.0), peer("p1" * 32, 4, 8, sha, 0.5)]
    await auto._async_evaluate(model, "periodic")
    assert not any("move_aborted" in line for line in auto.decisions), auto.decisions
    assert "reason=periodic:move_from_4-7:clear_gain" in auto.decisions[-1]
    assert host.find(sha, 0, 4) is not None and announced[-1] == [(0, 4)]
    assert [(s.start, s.end) for s in host.for_model(sha)] == [(0, 4)]
    await wait_until(lambda: old.state == "unloaded", 10.0, 0.05, "the old range freed (no session uses it)")
    # the next round, on adverts that show the move: nothing more to do
    decisions = len(auto.decisions)
    peers.snaps = [peer("p0" * 32, 0, 4, sha, 10.0), peer("p1" * 32, 4, 8, sha, 0.5)]
    await auto._async_evaluate(model, "periodic")
    assert len(auto.decisions) == decisions, auto.decisions[decisions:]
