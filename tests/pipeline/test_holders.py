"""LayerHolders (pure over snapshots): holders from adverts, coverage by overlapping ranges."""

from __future__ import annotations

from node.inference.pipeline.holders import LayerHolders
from node.inference.pipeline.perf import PeerPerformance
from node.inference.pipeline.planner import plan_route
from node.net import PeerSnapshot

ME, P1, P2 = "a" * 64, "b" * 64, "c" * 64
SHA = "f" * 64


class Host:
    """Stands in for SliceHost: no slices of its own."""

    def for_model(self, sha256):
        return []

    def adverts(self):
        return []


class Peers:
    def __init__(self, snaps):
        self.snaps = snaps

    def peers(self):
        return self.snaps

    def link(self, node_id):  # every peer in the table has a live link
        return object()


def snap(node_id, *ranges, state="connected", n_layers=8):
    models = tuple({"sha256": SHA, "name": "m", "start": s, "end": e, "n_layers": n_layers, "ms_per_layer": 1.5}
                   for s, e in ranges)
    return PeerSnapshot(node_id, node_id[:8], state, "direct", "127.0.0.1:1", 2.0, 200.0, models, None)


def holders(*snaps):
    return LayerHolders(ME, Host(), Peers(list(snaps)), None, PeerPerformance(ME))


def test_overlapping_adverts_cover_the_model():
    lh = holders(snap(P1, (0, 5)), snap(P2, (3, 8)))
    assert [(h.node_id, h.start, h.end, h.ms_per_layer, h.rtt_ms) for h in lh.holders(SHA)] == [
        (P1, 0, 5, 1.5, 2.0), (P2, 3, 8, 1.5, 2.0)]
    assert lh.covers(SHA, 8)
    assert list(lh.swarm_models()) == [SHA]


def test_a_gap_or_a_disconnected_peer_is_not_covered():
    assert not holders(snap(P1, (0, 4)), snap(P2, (5, 8))).covers(SHA, 8)
    lh = holders(snap(P1, (0, 5)), snap(P2, (3, 8), state="disconnected"))
    assert not lh.covers(SHA, 8) and lh.swarm_models() == {}
    # one node's two slices would need a chain through it twice: not a route
    assert not holders(snap(P1, (0, 4), (4, 8))).covers(SHA, 8)


def _advert(**fields):
    return {"sha256": SHA, "name": "m", "n_layers": 8, **fields}


def test_a_peers_speed_figures_cannot_crash_or_hijack_planning():
    """JSON as Python reads it admits NaN and ±Infinity; a negative figure would attract every
    route. Such figures count as unmeasured; garbled ranges make no holder."""
    honest = PeerSnapshot(P1, P1[:8], "connected", "direct", "127.0.0.1:1", 2.0, 200.0,
                          (_advert(start=0, end=8, ms_per_layer=1.0),), None)
    for bad in (float("inf"), float("nan"), -5.0, 0, "3", True, 1e300):
        liar = PeerSnapshot(P2, P2[:8], "connected", "direct", "127.0.0.1:2", 2.0, 200.0,
                            (_advert(start=0, end=8, ms_per_layer=bad),), None)
        lh = holders(honest, liar)
        plan = plan_route(8, lh.holders(SHA))
        assert plan.segments[0].node_id == P1, bad  # the liar is at best unmeasured (2 ms) or clamped
        assert lh.covers(SHA, 8) and list(lh.swarm_models()) == [SHA]
        whole = PeerSnapshot(P2, P2[:8], "connected", "direct", "127.0.0.1:2", 2.0, 200.0,
                             (_advert(whole=True, ms_per_token=bad),), None)
        assert holders(honest, whole).covers(SHA, 8)
    for garbled in (dict(start=0.5, end=8), dict(start=True, end=8), dict(start=4, end=2), dict(start="0", end=8),
                    dict(start=-1, end=8)):
        snap_ = PeerSnapshot(P2, P2[:8], "connected", "direct", "127.0.0.1:2", 2.0, 200.0, (_advert(**garbled),), None)
        assert holders(snap_).holders(SHA) == [], garbled


def test_assembly_keeps_a_conversations_route_unless_it_is_gone_or_far_slower(caplog):
    """Turn 2 of a conversation runs where its KV is (a changed route would reuse nothing)."""
    import logging
    from types import SimpleNamespace

    from node import const
    from node.trace import RequestTrace

    lh = holders(snap(P1, (0, 8)), snap(P2, (0, 8)))
    lh.transport = SimpleNamespace(kind=lambda node_id: "direct")
    entry = SimpleNamespace(sha256=SHA, n_layers=8)

    def assemble(prefer):
        plan, _ = lh.assemble(entry, RequestTrace(model="m", operation="chat.completions"), 1, frozenset(),
                              prefer=prefer)
        return [(h.node_id, h.start, h.end) for h in plan.segments]

    cheapest = assemble(None)
    other = P2 if cheapest[0][0] == P1 else P1
    caplog.set_level(logging.INFO, logger="node.inference.pipeline.holders")
    assert assemble(((other, 0, 8),)) == [(other, 0, 8)]  # kept: it holds the KV, and costs the same
    assert "DIAG: pipeline route kept for its cached prefix" in caplog.text
    assert assemble(((other, 0, 4), (cheapest[0][0], 4, 8))) == [(other, 0, 4), (cheapest[0][0], 4, 8)]
    assert assemble(((ME, 0, 8),)) == cheapest  # that node holds nothing: the cheapest chain
    assert "DIAG: pipeline route changed, cache lost" in caplog.text and "kept_est_ms_per_token=unusable" in caplog.text
    # far slower than the cheapest: the cheaper chain, prefilling in full
    lh.peers.snaps = [snap(P1, (0, 8)), PeerSnapshot(P2, P2[:8], "connected", "direct", "127.0.0.1:1", 2.0 * 40,
                                                     200.0, snap(P2, (0, 8)).models, None)]
    assert assemble(((P2, 0, 8),)) == [(P1, 0, 8)]
    assert const.KEPT_ROUTE_MAX_SLOWDOWN > 1


def test_holders_no_slower_share_concurrent_requests_and_a_far_faster_one_keeps_them():
    """Every request took the same chain while as good holders sat idle (a swarm test,
    2026-12-06): this coordinator's requests under way make a holder CHAIN_LOAD_WEIGHT dearer per
    request, so equal holders take turns; a much faster holder still wins a second request."""
    from types import SimpleNamespace

    from node.trace import RequestTrace

    lh = holders(snap(P1, (0, 8)), snap(P2, (0, 8)))
    lh.transport = SimpleNamespace(kind=lambda node_id: "direct")
    entry = SimpleNamespace(sha256=SHA, n_layers=8)

    def assemble(load):
        plan, _ = lh.assemble(entry, RequestTrace(model="m", operation="chat.completions"), 1, frozenset(), load=load)
        return [h.node_id for h in plan.segments]

    first = assemble({})
    other = P2 if first == [P1] else P1
    assert assemble({first[0]: 1}) == [other]  # the second request goes to the idle holder
    assert assemble({first[0]: 1, other: 1}) == first  # one each: either again
    assert assemble({first[0]: 2, other: 1}) == [other]
    lh.peers.snaps = [snap(P1, (0, 8)), PeerSnapshot(P2, P2[:8], "connected", "direct", "127.0.0.1:1", 2.0 * 40,
                                                     200.0, snap(P2, (0, 8)).models, None)]  # P2 40x slower
    assert assemble({P1: 3}) == [P1]


async def test_the_coordinator_routes_a_second_request_round_its_first():
    """The coordinator counts its attempts under way per node for the assembly: two requests at
    once through two holders of the same layers take one each; a failed attempt counts no more."""
    import asyncio

    from node.errors import SegmentFailed
    from node.inference.handoff import GenerationJob
    from node.inference.pipeline.coordinator import PipelineCoordinator
    from node.inference.pipeline.transport import PipelineTransport
    from node.inference.sampling import SamplingParams
    from node.trace import RequestTrace

    class LinkedPeers(Peers):
        def peer(self, node_id):
            return next((s for s in self.snaps if s.node_id == node_id), None)

    peers = LinkedPeers([snap(P1, (0, 8)), snap(P2, (0, 8))])
    coordinator = PipelineCoordinator(ME, PipelineTransport(ME, None), peers, Host())
    entry = type("Entry", (), {"sha256": SHA, "n_layers": 8, "id": "m"})()

    def attempt(rid):
        job = GenerationJob(rid, [1, 2, 3], SamplingParams(), 4)
        return coordinator.open_attempt(job, entry, RequestTrace(model="m", operation="chat.completions"), 1,
                                        frozenset())

    first, second = attempt("r1"), attempt("r2")
    assert {first.route[0].node_id, second.route[0].node_id} == {P1, P2}
    first.fail(SegmentFailed("gone", node_id=first.route[0].node_id, cause="link_drop"))
    second.fail(SegmentFailed("gone", node_id=second.route[0].node_id, cause="link_drop"))
    third, fourth = attempt("r3"), attempt("r4")
    assert {third.route[0].node_id, fourth.route[0].node_id} == {P1, P2}
    await asyncio.sleep(0)


def test_a_holder_with_no_speed_figure_is_taken_as_the_median_of_those_with_one():
    """At the flat default (2 ms/layer) an unmeasured holder lost every request to measured ones,
    so it was never used and never measured (a swarm test, 2026-12-06)."""
    unmeasured = PeerSnapshot(P2, P2[:8], "connected", "direct", "127.0.0.1:1", 2.0, 200.0,
                              ({**snap(P2, (0, 8)).models[0], "ms_per_layer": None},), None)
    lh = holders(snap(P1, (0, 8)), unmeasured)
    assert sorted(h.ms_per_layer for h in lh.holders(SHA)) == [1.5, 1.5]
    alone = holders(unmeasured)  # nobody measured: the planner's default
    assert [h.ms_per_layer for h in alone.holders(SHA)] == [None]


class _Clocks:
    """Stands in for the `time` module in holders.py: a wall clock that can step, a monotonic one."""

    def __init__(self):
        self.wall, self.mono = 1_800_000_000.0, 5_000.0

    def time(self):
        return self.wall

    def monotonic(self):
        return self.mono

    def advance(self, seconds, *, wall_step=0.0):
        self.mono += seconds
        self.wall += seconds + wall_step


def test_a_wall_clock_step_neither_extends_nor_cuts_the_wait_for_a_lost_holder(monkeypatch):
    """A holder whose link dropped is waited for ROUTE_REGAIN_S of real time, whatever the wall
    clock does meanwhile (NTP stepping it, a laptop's clock set on wake)."""
    import dataclasses

    from node import const
    from node.inference.pipeline import holders as holders_module

    clocks = _Clocks()
    monkeypatch.setattr(holders_module, "time", clocks)
    for wall_step, after_s, waited in ((-3600.0, const.ROUTE_REGAIN_S + 1, False),  # back: not waited for an hour
                                       (+3600.0, 1.0, True)):  # forward: still waited for, a second later
        gone = dataclasses.replace(snap(P1, (0, 8), state="gone"), last_seen=clocks.wall)
        h = holders(gone)
        h.note_peer("changed", gone)
        assert h.regain(SHA, {})[1] == [P1]
        clocks.advance(after_s, wall_step=wall_step)
        assert (h.regain(SHA, {})[1] == [P1]) is waited, (wall_step, after_s)


def test_a_coordinator_that_slept_waits_for_the_holder_whose_link_it_finds_dropped_on_wake(monkeypatch):
    """A laptop coordinator wakes after 60 s: its link to a holder last heard 60 s ago drops only
    now. A request arriving then waits for the holder (it relinks in milliseconds) instead of a 503
    at once; later snapshots of that same drop do not start the wait afresh."""
    import dataclasses

    from node import const
    from node.inference.pipeline import holders as holders_module

    clocks = _Clocks()
    monkeypatch.setattr(holders_module, "time", clocks)
    gone = dataclasses.replace(snap(P1, (0, 8), state="gone"), last_seen=clocks.wall - 60)
    h = holders(gone)
    h.note_peer("changed", gone)
    assert h.regain(SHA, {})[1] == [P1]
    clocks.advance(const.ROUTE_REGAIN_S + 1)
    h.note_peer("changed", dataclasses.replace(gone, last_error="dial failed"))  # the same drop
    assert h.regain(SHA, {})[1] == []
