"""Route planning over holders (pure)."""

import pytest

from node.errors import InsufficientCapacity
from node.inference.pipeline.planner import Holder, plan_route

A, B, C, D, E = ("a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64)


def test_three_thirds_chain_with_standby():
    holders = [Holder(A, 0, 4, "local", 0, 1.0), Holder(B, 4, 8, "direct", 1.0, 1.0),
               Holder(C, 8, 12, "direct", 1.0, 1.0), Holder(D, 4, 8, "direct", 5.0, 1.0)]
    plan = plan_route(12, holders)
    assert [h.node_id for h in plan.segments] == [A, B, C]
    assert plan.standbys[0] is None and plan.standbys[1].node_id == D and plan.standbys[2] is None
    assert plan.describe() == "aaaaaaaa[0-3],bbbbbbbb[4-7],cccccccc[8-11]"
    assert plan.est_ms == pytest.approx(12 * 1.0 + 0.5 + 0.5 + 0.5)


def test_minimises_estimated_time_not_hop_count():
    slow_whole = Holder(A, 0, 8, "direct", 2.0, 10.0)
    fast_halves = [Holder(B, 0, 4, "direct", 1.0, 1.0), Holder(C, 4, 8, "direct", 1.0, 1.0)]
    plan = plan_route(8, [slow_whole, *fast_halves])
    assert [h.node_id for h in plan.segments] == [B, C]


def test_local_first_on_equal_cost():
    plan = plan_route(4, [Holder(B, 0, 4, "direct", 0.0, 1.0), Holder(A, 0, 4, "local", 0.0, 1.0)])
    assert plan.segments[0].node_id == A
    assert plan.standbys[0].node_id == B


def test_exclude_failed_node_uses_the_other_holder():
    holders = [Holder(A, 0, 4, "local"), Holder(B, 4, 8, rtt_ms=1), Holder(D, 4, 8, rtt_ms=9), Holder(C, 8, 12, rtt_ms=1)]
    plan = plan_route(12, holders, exclude=frozenset({B}))
    assert [h.node_id for h in plan.segments] == [A, D, C]


def test_gap_or_overlap_without_abutting_ranges_is_insufficient_capacity():
    with pytest.raises(InsufficientCapacity, match="12 layers"):
        plan_route(12, [Holder(A, 0, 4), Holder(B, 5, 12)])
    with pytest.raises(InsufficientCapacity):
        plan_route(12, [])
    with pytest.raises(InsufficientCapacity):
        plan_route(8, [Holder(A, 0, 4)], exclude=frozenset())


def test_a_node_is_used_once_per_chain():
    # A advertises two ranges; a chain may not pass through the same node twice (one KV session
    # per node and request), so the whole-range holder B is chosen although A is local
    plan = plan_route(8, [Holder(A, 0, 4, "local"), Holder(A, 4, 8, "local"), Holder(B, 0, 8, rtt_ms=1)])
    assert [h.node_id for h in plan.segments] == [B]
    with pytest.raises(InsufficientCapacity):
        plan_route(8, [Holder(A, 0, 4, "local"), Holder(A, 4, 8, "local")])
