"""Diagnostics' `-- swarm coverage --` and the advert parsing behind it (coverage.swarm_coverage)."""

from __future__ import annotations

from types import SimpleNamespace

from node.diagnostics import _coverage
from node.inference.pipeline.coverage import coverage_text, swarm_coverage
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.layerchoice import LayerBudget, Span

SHA = "ab" * 32


def snap(node_id: str, *models, state: str = "connected"):
    return SimpleNamespace(node_id=node_id, state=state, models=tuple(models))


def advert(start, end, ms=None, **extra):
    return {"sha256": SHA, "name": "m8", "n_layers": 8, "start": start, "end": end, "ms_per_layer": ms, **extra}


class FakePeers:
    def __init__(self, snaps):
        self.snaps = snaps

    def peers(self):
        return self.snaps


def test_coverage_names_holders_speeds_and_gaps():
    peers = FakePeers([
        snap("a" * 64, advert(0, 4, 0.25, auto_budget=[4, 4])),
        snap("b" * 64, advert(0, 4)),
        snap("c" * 64, advert(6, 8, 1.5)),
        snap("d" * 64, {"sha256": SHA, "name": "m8", "n_layers": 8, "whole": True}),
        snap("e" * 64, advert(4, 8), state="disconnected"),  # gone: not a holder
    ])
    parts = SimpleNamespace(short_id="f" * 8, slice_host=SliceHost(), peers=peers)
    rows = _coverage(parts)
    # the whole holder d holds every layer: no layer is without a holder
    assert rows[0] == f"m8 (8 layers, sha {SHA[:8]}): min holders per layer 1 (auto: aaaaaaaa)"
    assert rows[1] == "  layers 0-3: aaaaaaaa (0.250 ms/layer), bbbbbbbb (not measured)"
    assert rows[2] == "  layers 4-5: no slice (held by the whole holders below)"
    assert rows[3] == "  layers 6-7: cccccccc (1.500 ms/layer)"
    assert rows[4] == "  whole (llama.cpp): dddddddd"
    without_whole = _coverage(SimpleNamespace(short_id="f" * 8, slice_host=SliceHost(), peers=FakePeers(
        [s for s in peers.snaps if s.node_id != "d" * 64])))
    assert without_whole[0] == f"m8 (8 layers, sha {SHA[:8]}): min holders per layer 0 (auto: aaaaaaaa)"
    assert without_whole[2] == "  layers 4-5: NO HOLDER"
    assert _coverage(SimpleNamespace(short_id="f" * 8, slice_host=SliceHost(), peers=None)) == [
        "(no model is served in layers here or by peers)"]


def test_malformed_adverts_are_dropped():
    bad = [
        advert(4, 2), advert(-1, 3), advert(0, 9), advert(True, 3), advert("0", 3),
        {"sha256": SHA, "n_layers": "8", "start": 0, "end": 2},
        {"sha256": "", "n_layers": 8, "start": 0, "end": 2}, "not a dict",
        {"sha256": SHA, "name": "m8", "n_layers": 9, "start": 0, "end": 2},  # disagrees with the first n_layers
    ]
    good = advert(0, 2, float("nan"), auto_budget=[99, 1])  # a bad speed/budget is ignored, the range kept
    cov = swarm_coverage("me", [advert(2, 8, 0.5)], [snap("p", good, *bad)])[SHA]
    assert cov.spans == [Span("me", 2, 8, 0.5), Span("p", 0, 2, None)]
    assert cov.budgets == {}
    cov = swarm_coverage("me", [], [snap("p", advert(0, 8, auto_budget=[4, 3]))])[SHA]
    assert cov.budgets == {"p": LayerBudget(4, 3)}


def test_coverage_text_is_run_length():
    assert coverage_text(8, [Span("a", 0, 4), Span("b", 0, 4), Span("c", 4, 8)]) == "2x4,1x4"
    assert coverage_text(4, []) == "0x4"


def test_one_peers_wrong_layer_count_does_not_hide_the_honest_holders():
    liar = snap("l" * 64, {"sha256": SHA, "name": "m8", "n_layers": 80, "start": 0, "end": 80})
    honest = [snap("a" * 64, advert(0, 4)), snap("b" * 64, advert(4, 8))]
    cov = swarm_coverage("me", [], [liar, *honest])[SHA]  # the liar is the first advert seen
    assert cov.n_layers == 8
    assert cov.spans == [Span("a" * 64, 0, 4, None), Span("b" * 64, 4, 8, None)]
    # a node holding the model believes its own count whatever the majority says
    mine = swarm_coverage("me", [advert(0, 8)], [liar, snap("l2", {"sha256": SHA, "name": "m8", "n_layers": 80,
                                                                    "start": 0, "end": 40})])[SHA]
    assert mine.n_layers == 8 and mine.spans == [Span("me", 0, 8, None)]
