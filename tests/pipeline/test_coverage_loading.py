"""A peer still fetching its layers (its advert `"loading": true`: a first choice claimed, a move,
a fetch failing and retried) holds none of them yet: no planner routes to it. Diagnostics'
`-- swarm coverage --` counted it as a holder — a lone node fetching every layer of a model from
an origin that failed its ranges read "min holders per layer 1 / layers 0-7: <it> (not measured)"
on its peer, while that peer's /v1/models was empty and a chat was a 404 (a churn test,
2026-12-06) — and `swarmllm peers` showed the range as served. The layer choice still counts it
(two nodes must not fetch the same layers)."""

from __future__ import annotations

from types import SimpleNamespace

from node.commands.client import _advert_text
from node.diagnostics import _coverage
from node.inference.pipeline.coverage import swarm_coverage
from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.layerchoice import Span

SHA = "ab" * 32


def snap(node_id: str, *models):
    return SimpleNamespace(node_id=node_id, state="connected", models=tuple(models))


def advert(start, end, ms=None, **extra):
    return {"sha256": SHA, "name": "m8", "n_layers": 8, "start": start, "end": end, "ms_per_layer": ms, **extra}


class FakePeers:
    def __init__(self, snaps):
        self.snaps = snaps

    def peers(self):
        return self.snaps


def test_a_loading_range_is_not_reported_as_held():
    peers = FakePeers([
        snap("a" * 64, advert(0, 4, loading=True, auto_budget=[4, 4])),
        snap("b" * 64, advert(4, 8, 0.5)),
        snap("c" * 64, advert(6, 8, loading=True)),
    ])
    rows = _coverage(SimpleNamespace(short_id="f" * 8, slice_host=SliceHost(), peers=peers))
    assert rows[0] == f"m8 (8 layers, sha {SHA[:8]}): min holders per layer 0 (auto: aaaaaaaa)"
    assert rows[1] == "  layers 0-3: NO HOLDER (loading: aaaaaaaa)"
    assert rows[2] == "  layers 4-5: bbbbbbbb (0.500 ms/layer)"
    assert rows[3] == "  layers 6-7: bbbbbbbb (0.500 ms/layer), cccccccc (loading)"
    # the layer choice counts the claim
    cov = swarm_coverage("f" * 64, [], peers.peers())[SHA]
    assert Span("a" * 64, 0, 4) in cov.spans


def test_the_peer_table_marks_a_loading_range():
    assert _advert_text(advert(0, 4, loading=True)) == "m8[0-3 loading]"
    assert _advert_text(advert(0, 4)) == "m8[0-3]"
