"""Route planning over holders (pure): sub-ranges, overlaps, standby chains, whole holders."""

import random

import pytest

from node.errors import InsufficientCapacity
from node.inference.pipeline import planner
from node.inference.pipeline.planner import Holder, layer_coverage, plan_route

A, B, C, D, E, F = ("a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64, "f" * 64)


def cut(plan):
    """The chain as (node letter, start, end) per segment."""
    return [(h.node_id[0], h.start, h.end) for h in plan.segments]


def test_three_thirds_chain_with_standby():
    holders = [Holder(A, 0, 4, "local", 0, 1.0), Holder(B, 4, 8, "direct", 1.0, 1.0),
               Holder(C, 8, 12, "direct", 1.0, 1.0), Holder(D, 4, 8, "direct", 5.0, 1.0)]
    plan = plan_route(12, holders)
    assert [h.node_id for h in plan.segments] == [A, B, C]
    assert plan.standbys[0] is None and [h.node_id for h in plan.standbys[1]] == [D] and plan.standbys[2] is None
    assert plan.describe() == "aaaaaaaa[0-3],bbbbbbbb[4-7],cccccccc[8-11]"
    assert plan.describe_standbys() == "-,dddddddd[4-7],-"
    assert plan.est_ms == pytest.approx(12 * 1.0 + 0.5 + 0.5 + 0.5)


def test_minimises_estimated_time_not_hop_count():
    slow_whole = Holder(A, 0, 8, "direct", 2.0, 10.0)
    fast_halves = [Holder(B, 0, 4, "direct", 1.0, 1.0), Holder(C, 4, 8, "direct", 1.0, 1.0)]
    plan = plan_route(8, [slow_whole, *fast_halves])
    assert [h.node_id for h in plan.segments] == [B, C]


def test_local_first_on_equal_cost():
    plan = plan_route(4, [Holder(B, 0, 4, "direct", 0.0, 1.0), Holder(A, 0, 4, "local", 0.0, 1.0)])
    assert plan.segments[0].node_id == A
    assert [h.node_id for h in plan.standbys[0]] == [B]


def test_fewer_hops_on_equal_cost_and_locality():
    # one remote holder of everything or two abutting ones at zero latency: the same cost, one hop fewer
    plan = plan_route(8, [Holder(B, 0, 4, rtt_ms=0, ms_per_layer=1), Holder(C, 4, 8, rtt_ms=0, ms_per_layer=1),
                          Holder(D, 0, 8, rtt_ms=0, ms_per_layer=1)])
    assert cut(plan) == [("d", 0, 8)]


def test_overlapping_ranges_are_cut_into_sub_ranges():
    # A holds 0-3, B holds 2-5 of six layers: no exact abutment, yet a chain exists
    plan = plan_route(6, [Holder(A, 0, 4, "local", 0, 1.0), Holder(B, 2, 6, "direct", 1.0, 1.0)])
    assert cut(plan) == [("a", 0, 4), ("b", 4, 6)]  # local first: A runs all it can
    # B faster: the switch moves to B's start (an end point of the overlap is never worse)
    plan = plan_route(6, [Holder(A, 0, 4, "direct", 1.0, 5.0), Holder(B, 2, 6, "direct", 1.0, 1.0)])
    assert cut(plan) == [("a", 0, 2), ("b", 2, 6)]
    assert plan.est_ms == pytest.approx(2 * 5.0 + 0.5 + 4 * 1.0 + 0.5 + 0.5)


def test_middle_entry_into_a_holders_range():
    # C holds everything slowly; B is fast in the middle: the chain enters C at layer 6, after B
    holders = [Holder(A, 0, 3, "local", 0, 1.0), Holder(B, 2, 6, rtt_ms=1, ms_per_layer=0.5),
               Holder(C, 0, 10, rtt_ms=1, ms_per_layer=3.0)]
    plan = plan_route(10, holders)
    assert cut(plan) == [("a", 0, 2), ("b", 2, 6), ("c", 6, 10)]  # B is faster than A where they overlap


def test_a_node_is_used_once_per_chain():
    # A is local and slow over everything, B fast in the middle: A-B-A would be cheapest, but a
    # chain passes a node at most once (one KV session per request and node)
    holders = [Holder(A, 0, 12, "local", 0, 5.0), Holder(B, 2, 10, rtt_ms=1, ms_per_layer=1.0)]
    plan = plan_route(12, holders)
    assert len({h.node_id for h in plan.segments}) == len(plan.segments)
    assert cut(plan) == [("a", 0, 12)]  # A-B then no way back to A: A alone (60 ms) beats nothing
    # a node advertising two slices may not be used for both
    two = [Holder(A, 0, 4, "local"), Holder(A, 4, 8, "local"), Holder(B, 0, 8, rtt_ms=1)]
    plan = plan_route(8, two)
    assert len({h.node_id for h in plan.segments}) == len(plan.segments)
    assert cut(plan) == [("b", 0, 4), ("a", 4, 8)]  # 8.5 + 8: no way back from a remote last segment
    with pytest.raises(InsufficientCapacity, match="pass a node twice"):
        plan_route(8, [Holder(A, 0, 4, "local"), Holder(A, 4, 8, "local")])


def test_node_once_finds_the_chain_around_a_used_node():
    # the best way to layer 4 uses E; E is also the only holder of 8-11: the planner must pick the
    # other way to layer 4
    holders = [Holder(E, 0, 4, rtt_ms=1, ms_per_layer=0.5), Holder(B, 0, 4, rtt_ms=1, ms_per_layer=1.0),
               Holder(C, 4, 8, rtt_ms=1, ms_per_layer=1.0), Holder(E, 8, 12, rtt_ms=1, ms_per_layer=0.5)]
    plan = plan_route(12, holders)
    assert cut(plan) == [("b", 0, 4), ("c", 4, 8), ("e", 8, 12)]


def test_whole_holder_is_never_cut():
    # W (llama.cpp, whole) is fast per layer but cannot run a part; the sliced chain is slower
    w = Holder(D, 0, 8, rtt_ms=1, ms_per_layer=0.1, whole=True)
    slices = [Holder(A, 0, 4, "local", 0, 1.0), Holder(B, 4, 8, rtt_ms=1, ms_per_layer=1.0)]
    plan = plan_route(8, [w, *slices])
    assert cut(plan) == [("d", 0, 8)] and plan.segments[0].whole
    assert plan.standbys[0] is not None and cut_of(plan.standbys[0]) == [("a", 0, 4), ("b", 4, 8)]
    # a slower whole holder is not used as part of a chain either, even where that would be cheapest
    w_slow = Holder(D, 0, 8, rtt_ms=1, ms_per_layer=3.0, whole=True)
    plan = plan_route(8, [w_slow, Holder(A, 0, 4, "local", 0, 1.0), Holder(B, 4, 8, rtt_ms=1, ms_per_layer=9.0)])
    assert cut(plan) == [("d", 0, 8)]  # 24 + 1 < 4 + 36 + 1; never A[0-3] + D[4-7]
    plan = plan_route(8, [w_slow, Holder(A, 0, 4, "local", 0, 1.0), Holder(B, 4, 8, rtt_ms=1, ms_per_layer=1.0)])
    assert cut(plan) == [("a", 0, 4), ("b", 4, 8)]
    assert plan.standbys == [None, None]  # the whole holder cannot stand in for one segment
    with pytest.raises(InsufficientCapacity, match="layers 0-3"):
        plan_route(8, [w_slow, Holder(B, 4, 8)], exclude=frozenset({D}))
    # a "whole" record that does not span the model is ignored
    with pytest.raises(InsufficientCapacity):
        plan_route(8, [Holder(D, 0, 6, whole=True), Holder(B, 6, 8)])


def cut_of(chain):
    return [(h.node_id[0], h.start, h.end) for h in chain]


def test_standby_is_a_chain_covering_the_segment():
    # chain A[0-5] C[6-11]; no single spare holds 0-5, but D[0-2] + E[3-5] together do
    holders = [Holder(A, 0, 6, "local", 0, 1.0), Holder(C, 6, 12, rtt_ms=1, ms_per_layer=1.0),
               Holder(D, 0, 3, rtt_ms=1, ms_per_layer=1.0), Holder(E, 2, 6, rtt_ms=1, ms_per_layer=1.0),
               Holder(F, 5, 12, rtt_ms=9, ms_per_layer=1.0)]
    plan = plan_route(12, holders)
    assert cut(plan) == [("a", 0, 6), ("c", 6, 12)]
    assert [h.node_id for h in plan.standbys[0]] == [D, E] and plan.standbys[0][-1].end == 6
    assert cut_of(plan.standbys[1]) == [("f", 6, 12)]  # a sub-range of F's 5-11
    assert plan.describe_standbys().startswith("dddddddd[0-") and plan.describe_standbys().endswith(",ffffffff[6-11]")
    # the failover re-plan without A finds a chain that covers the gap
    again = plan_route(12, holders, exclude=frozenset({A}))
    assert {h.node_id for h in again.segments} <= {C, D, E, F} and again.segments[0].start == 0


def test_exclude_failed_node_uses_the_other_holder():
    holders = [Holder(A, 0, 4, "local"), Holder(B, 4, 8, rtt_ms=1), Holder(D, 4, 8, rtt_ms=9), Holder(C, 8, 12, rtt_ms=1)]
    plan = plan_route(12, holders, exclude=frozenset({B}))
    assert [h.node_id for h in plan.segments] == [A, D, C]


def test_insufficient_capacity_names_the_gap():
    with pytest.raises(InsufficientCapacity, match=r"12 layers .*no holder has layers 4-4; held: 0-3, 5-11\)"):
        plan_route(12, [Holder(A, 0, 4), Holder(B, 5, 12)])  # inclusive ranges, as the gap's (a user reads it)
    with pytest.raises(InsufficientCapacity, match="no holder has layers 0-11"):
        plan_route(12, [])
    with pytest.raises(InsufficientCapacity, match="layers 4-7"):
        plan_route(8, [Holder(A, 0, 4)], exclude=frozenset())
    with pytest.raises(InsufficientCapacity, match="layers 0-1, 6-7"):
        plan_route(8, [Holder(A, 2, 5), Holder(B, 3, 6), Holder(C, 0, 8)], exclude=frozenset({C}))


def test_layer_coverage_runs_and_gaps():
    a, b, c = Holder(A, 0, 4), Holder(B, 2, 6), Holder(C, 8, 10)
    runs = layer_coverage(12, [a, b, c])
    assert [(s, e, [h.node_id[0] for h in held]) for s, e, held in runs] == [
        (0, 2, ["a"]), (2, 4, ["a", "b"]), (4, 6, ["b"]), (6, 8, []), (8, 10, ["c"]), (10, 12, [])]
    assert layer_coverage(4, []) == [(0, 4, [])]
    # an interior boundary with the same holders on both sides is not a run boundary
    assert [(s, e) for s, e, _ in layer_coverage(8, [Holder(A, 0, 8), Holder(B, 0, 4), Holder(C, 0, 4)])] == [(0, 4), (4, 8)]


def _brute(n_layers, holders):
    """Exhaustive: every chain of sub-ranges cut at any layer boundary, a node at most once."""
    cuts = range(n_layers + 1)
    best = None

    def walk(pos, used, cost, local, hops):
        nonlocal best
        if pos == n_layers:
            key = (round(cost, 9), -local, hops)
            if best is None or key < best:
                best = key
            return
        for h in holders:
            if h.node_id in used or not h.start <= pos < h.end:
                continue
            for q in cuts:
                if pos < q <= h.end:
                    c = cost + h.layer_ms() * (q - pos) + h.hop_ms() + (h.hop_ms() if q == n_layers else 0)
                    walk(q, used | {h.node_id}, c, local + ((q - pos) if h.transport == "local" else 0), hops + 1)
    walk(0, frozenset(), 0.0, 0, 0)
    return best


@pytest.mark.parametrize("vectorised", [False, True], ids=["python", "numpy"])
def test_random_swarms_match_an_exhaustive_search(monkeypatch, vectorised):
    # both sweeps (plain Python for few holders, numpy from NUMPY_MIN_HOLDERS on) on every case
    monkeypatch.setattr(planner, "NUMPY_MIN_HOLDERS", 0 if vectorised else 10**9)
    rng = random.Random(7)
    nodes = [c * 64 for c in "abcdefg"]
    for _ in range(300):
        n_layers = rng.randint(4, 10)
        holders = []
        for node in rng.sample(nodes, rng.randint(2, 5)):
            for _ in range(rng.choice((1, 1, 2))):
                s = rng.randrange(n_layers)
                e = rng.randint(s + 1, n_layers)
                holders.append(Holder(node, s, e, rng.choice(("local", "direct", "direct")),
                                      rng.choice((0.0, 1.0, 4.0)), rng.choice((0.5, 1.0, 2.0))))
        want = _brute(n_layers, holders)
        if want is None:
            with pytest.raises(InsufficientCapacity):
                plan_route(n_layers, holders)
            continue
        plan = plan_route(n_layers, holders)
        segs = plan.segments
        assert segs[0].start == 0 and segs[-1].end == n_layers
        assert all(x.end == y.start for x, y in zip(segs, segs[1:], strict=False))
        assert len({h.node_id for h in segs}) == len(segs)
        assert all(any(h.node_id == s.node_id and h.contains(s.start, s.end) for h in holders) for s in segs)
        local = sum(s.layers for s in segs if s.transport == "local")
        assert (round(plan.est_ms, 9), -local, len(segs)) == want, (n_layers, holders, cut(plan))


def test_large_swarm_both_sweeps_agree(monkeypatch):
    """300 holders over 80 layers: the numpy sweep's chain costs exactly what the Python one's does."""
    rng = random.Random(3)
    holders = []
    for i in range(300):
        size = rng.randint(4, 40)
        start = rng.randint(0, 80 - size)
        holders.append(Holder(f"{i:064x}", start, start + size, "local" if i == 0 else "direct",
                              rng.uniform(1, 80), rng.uniform(0.3, 5.0)))
    plans = []
    for threshold in (0, 10**9):
        monkeypatch.setattr(planner, "NUMPY_MIN_HOLDERS", threshold)
        plans.append(plan_route(80, holders))
    vec, py = plans
    assert vec.est_ms == pytest.approx(py.est_ms, abs=1e-3)
    for plan in plans:
        assert plan.segments[0].start == 0 and plan.segments[-1].end == 80
        assert len({h.node_id for h in plan.segments}) == len(plan.segments)


def test_without_standbys_the_chain_is_the_same():
    holders = [Holder(A, 0, 4, "local", 0, 1.0), Holder(B, 4, 8, rtt_ms=1.0, ms_per_layer=1.0),
               Holder(D, 4, 8, rtt_ms=5.0, ms_per_layer=1.0)]
    full, bare = plan_route(8, holders), plan_route(8, holders, standbys=False)
    assert cut(full) == cut(bare) and full.est_ms == bare.est_ms
    assert bare.standbys == [] and full.standbys[1] is not None


def test_layer_coverage_matches_a_per_layer_definition():
    rng = random.Random(11)
    for _ in range(200):
        n_layers = rng.randint(1, 12)
        holders = []
        for i in range(rng.randint(0, 6)):
            s = rng.randrange(n_layers)
            holders.append(Holder(f"{i:064x}", s, rng.randint(s + 1, n_layers)))
        runs = layer_coverage(n_layers, holders)
        assert runs[0][0] == 0 and runs[-1][1] == n_layers
        assert all(x[1] == y[0] and x[2] != y[2] for x, y in zip(runs, runs[1:], strict=False))  # maximal
        for start, end, held in runs:
            for layer in range(start, end):
                assert held == [h for h in holders if h.start <= layer < h.end]


@pytest.mark.parametrize("n_holders", [5, 250])  # the plain sweep and the numpy one
def test_absurd_figures_are_unmeasured_or_clamped_in_both_sweeps(n_holders):
    rng = random.Random(7)
    bad = [float("inf"), float("nan"), -3.0, 1e300, 0.0]
    hs = [Holder(f"{i:064x}", rng.randrange(0, 4) * 20, 80, rtt_ms=rng.choice([5.0, float("inf"), -9.0, 1e300]),
                 ms_per_layer=rng.choice(bad)) for i in range(n_holders)]
    hs.append(Holder("f" * 64, 0, 80, rtt_ms=4.0, ms_per_layer=0.5))  # the one honest, fast holder
    plan = plan_route(80, hs)
    assert [h.node_id for h in plan.segments] == ["f" * 64]
    assert plan.est_ms == pytest.approx(0.5 * 80 + 4.0)


def test_a_kept_route_is_planned_while_its_holders_hold_its_layers():
    """A conversation's next turn runs on the chain holding its KV, even when another is cheaper."""
    holders = [Holder(A, 0, 4, "local", 0, 1.0), Holder(B, 4, 8, "direct", 1.0, 1.0),
               Holder(C, 2, 8, "direct", 2.0, 1.2), Holder(D, 0, 8, "direct", 5.0, 1.0)]
    assert cut(plan_route(8, holders)) == [("a", 0, 4), ("b", 4, 8)]
    kept = planner.plan_kept_route(8, holders, ((A, 0, 3), (C, 3, 8)))
    assert cut(kept) == [("a", 0, 3), ("c", 3, 8)]
    assert [(h.node_id, h.start, h.end) for h in kept.standbys[1]] == [(D, 3, 4), (B, 4, 8)]  # as plan_route does
    assert kept.est_ms == pytest.approx(planner.estimate_ms(kept.segments, 8))
    # unusable: a hop's node gone or excluded, its layers no longer held, a gap, not the whole model
    assert planner.plan_kept_route(8, [h for h in holders if h.node_id != C], ((A, 0, 3), (C, 3, 8))) is None
    assert planner.plan_kept_route(8, holders, ((A, 0, 3), (C, 3, 8)), exclude=frozenset({C})) is None
    assert planner.plan_kept_route(8, holders, ((A, 0, 1), (C, 1, 8))) is None  # C holds 2-7 only
    assert planner.plan_kept_route(8, holders, ((A, 0, 3), (C, 4, 8))) is None
    assert planner.plan_kept_route(8, holders, ((A, 0, 4),)) is None
    assert planner.plan_kept_route(8, holders, ()) is None


def test_a_kept_route_is_found_among_holders_the_planner_would_prune():
    """Several as-fast holders of the same range make the planner drop a slightly slower one: the
    kept chain's node is looked up before that pruning."""
    holders = [Holder(n, 0, 8, "direct", 1.0, 1.0) for n in (A, B, C, D)] + [Holder(E, 0, 8, "direct", 1.2, 1.0)]
    kept = planner.plan_kept_route(8, holders, ((E, 0, 8),))
    assert kept is not None and cut(kept) == [("e", 0, 8)]
