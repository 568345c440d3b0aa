"""Automatic layer choice (node/inference/pipeline/layerchoice.py): pure functions over snapshots."""

from __future__ import annotations

import pytest

from node.inference.pipeline.layerchoice import (
    LayerBudget,
    Span,
    best_window,
    choose_range,
    first_mover,
    gains_clearly,
    gaps,
    layer_counts,
    layers_for_budget,
    quality,
    redundancy_target,
    should_move,
    thinned_by_drop,
    uncovered_without,
)

L = 8
HALF = LayerBudget(4, 4)


def test_budget_arithmetic_counts_weights_kv_headroom_and_head():
    # 100 bytes of weights + 20 of KV per layer; 1000 bytes less 100 of headroom = 900 → 7 layers;
    # a range with the last layer also holds a 250-byte head: (900 - 250) // 120 = 5.
    b = layers_for_budget(1000, 100, 20, 250, headroom_bytes=100)
    assert (b.layers, b.with_head) == (7, 5)
    assert b.fits(0, 7, 8) and not b.fits(1, 8, 8) and b.fits(3, 8, 8)
    # capped at the model, never negative
    assert layers_for_budget(10**9, 100, 20, 250, n_layers=8) == LayerBudget(8, 8)
    assert layers_for_budget(50, 100, 20, 250) == LayerBudget(0, 0)
    assert layers_for_budget(100, 100, 20, 250, headroom_bytes=500) == LayerBudget(0, 0)
    with pytest.raises(ValueError):
        layers_for_budget(100, 0, 0, 0)


def test_first_choice_takes_the_weakest_window():
    others = [Span("a", 0, 4), Span("b", 0, 4), Span("c", 4, 8)]
    d = choose_range(L, others, HALF, "me")
    assert (d.start, d.end) == (4, 8)  # layers 4-7 have one holder, 0-3 two
    assert d.before.min_count == 1 and d.after.min_count == 2
    assert d.reason == "weakest coverage"


def test_a_gap_beats_a_thin_stretch_and_throughput_decides_at_equal_count():
    # layers 6-7 uncovered: any window over them is weakest
    d = choose_range(L, [Span("a", 0, 6), Span("b", 0, 6)], LayerBudget(2, 2), "me")
    assert (d.start, d.end) == (6, 8)
    # equal counts: the slow stretch (10 ms/layer) is weaker than the fast one (1 ms/layer)
    others = [Span("a", 0, 4, 1.0), Span("b", 0, 4, 1.0), Span("c", 4, 8, 10.0), Span("d", 4, 8, 10.0)]
    d = choose_range(L, others, HALF, "me")
    assert (d.start, d.end) == (4, 8)


def test_head_budget_limits_the_last_window():
    # 5 layers fit mid-model, only 3 with the head: the last window is 3 wide
    assert best_window(L, [Span("a", 0, 5)], LayerBudget(5, 3), "me") == (5, 8)
    assert best_window(L, [Span("a", 3, 8)], LayerBudget(5, 3), "me") == (0, 5)
    assert best_window(L, [], LayerBudget(0, 0), "me") is None
    whole = choose_range(L, [], LayerBudget(8, 8), "me")
    assert (whole.start, whole.end, whole.reason) == (0, 8, "whole model fits")


def test_choice_is_deterministic_and_ties_spread_by_node_id():
    picks = {best_window(L, [], HALF, f"node{i}", seed=7) for i in range(16)}
    assert picks == {(0, 4), (4, 8)}  # only aligned tiles, and both of them
    assert best_window(L, [], HALF, "node3", seed=7) == best_window(L, [], HALF, "node3", seed=7)


def test_simultaneous_starts_spread_out_and_reach_two_holders():
    # four nodes choosing one after another (each sees the ones before): 2 per layer
    spans: list[Span] = []
    for i in range(4):
        d = choose_range(L, spans, HALF, f"n{i}")
        spans.append(Span(f"n{i}", d.start, d.end))
    assert list(layer_counts(L, spans)) == [2] * L
    # three that chose at once on an empty swarm, by hash, then the fourth: whatever they picked,
    # the move rule (one mover per snapshot) reaches 2 per layer within a few rounds
    for seed in range(20):
        spans = [Span(f"s{i}", *best_window(L, [], HALF, f"s{i}", seed)) for i in range(3)]
        d = choose_range(L, spans, HALF, "s3", seed)
        spans.append(Span("s3", d.start, d.end))
        budgets = {s.node_id: HALF for s in spans}
        for _ in range(4):
            mover = first_mover(L, spans, budgets, seed)
            if mover is None:
                break
            node_id, move = mover
            spans = [s.moved_to(move.start, move.end) if s.node_id == node_id else s for s in spans]
        assert min(layer_counts(L, spans)) == 2, (seed, spans)


def test_hysteresis_no_move_for_a_small_gain():
    # everyone at 2 holders; a slightly slower stretch is not worth a move (gain < 1/0.75)
    spans = [Span("a", 0, 4, 1.0), Span("b", 0, 4, 1.0), Span("c", 4, 8, 1.1), Span("d", 4, 8, 1.1),
             Span("e", 0, 4, 1.0)]
    assert should_move(L, spans, "e", HALF) is None
    # a stretch three times weaker is: e moves there (and a, b keep 0-3 covered)
    spans = [Span("a", 0, 4, 1.0), Span("b", 0, 4, 1.0), Span("c", 4, 8, 3.0), Span("d", 4, 8, 3.0),
             Span("e", 0, 4, 1.0)]
    move = should_move(L, spans, "e", HALF)
    assert (move.start, move.end, move.reason) == (4, 8, "clear gain")
    assert gains_clearly(move.before, move.after)


def test_a_move_never_uncovers_a_layer():
    # b alone holds 4-7; 0-3 has one holder (a) so moving b there would gain count, but uncover 4-7
    spans = [Span("a", 0, 4), Span("b", 4, 8)]
    assert should_move(L, spans, "b", HALF) is None
    assert uncovered_without(L, spans, "b", 4, 8) == [4, 5, 6, 7]
    # with two more holders of 4-7, b may go (and 0-3 gains its second holder)
    spans += [Span("c", 4, 8), Span("d", 4, 8)]
    move = should_move(L, spans, "b", HALF)
    assert (move.start, move.end) == (0, 4)
    assert uncovered_without(L, spans, "b", 4, 8) == []


def test_count_gain_moves_and_losses_never_do():
    a = quality(L, [Span("a", 0, 8)])
    b = quality(L, [Span("a", 0, 8), Span("b", 0, 8)])
    assert gains_clearly(a, b) and not gains_clearly(b, a)
    assert not gains_clearly(b, b)


def test_mid_move_or_absent_node_does_not_decide():
    spans = [Span("a", 0, 4), Span("a", 4, 8), Span("b", 0, 4)]
    assert should_move(L, spans, "a", HALF) is None  # holds two ranges: mid-move
    assert should_move(L, spans, "z", HALF) is None


def test_first_mover_is_one_node_and_agreed():
    spans = [Span(f"n{i}", 0, 4) for i in range(4)]  # 4-7 uncovered... so nobody may leave 0-3? they may:
    budgets = {s.node_id: HALF for s in spans}
    node_id, move = first_mover(L, spans, budgets, seed=3)
    assert (move.start, move.end) == (4, 8)
    assert first_mover(L, list(reversed(spans)), budgets, seed=3)[0] == node_id
    # nodes without a known budget (manual --layers) never move
    assert first_mover(L, spans, {}, seed=3) is None


def test_gaps_are_named():
    assert gaps(L, [Span("a", 0, 4), Span("b", 6, 8)]) == [(4, 6)]
    assert gaps(L, []) == [(0, 8)]
    assert gaps(L, [Span("a", 0, 8)]) == []


def test_redundancy_target_rises_to_three_only_with_a_spare_copy():
    assert redundancy_target(8, 0) == 2 and redundancy_target(8, 3 * 8 + 7) == 2  # under 4 copies
    assert redundancy_target(8, 4 * 8) == 3 and redundancy_target(8, 40 * 8) == 3  # capped at 3
    assert redundancy_target(0, 10) == 2
    # with four copies held, a layer with two holders is weak although two is the floor
    spans = [Span(f"a{i}", 0, 4) for i in range(5)] + [Span(f"b{i}", 4, 8) for i in range(3)]
    d = choose_range(L, spans, HALF, "me")
    assert (d.start, d.end) == (4, 8) and d.before.min_count == 3 and d.before.target == 3
    spans = [Span(f"a{i}", 0, 4) for i in range(6)] + [Span("b0", 4, 8), Span("b1", 4, 8)]
    d = choose_range(L, spans, HALF, "me")
    assert (d.start, d.end) == (4, 8) and (d.before.min_count, d.after.min_count) == (2, 3)


def test_between_the_floor_and_the_target_only_a_move_that_lifts_every_weak_layer():
    # 0-3 has six holders, 4-5 two, 6-7 three (target 3): a 4-wide mover from 0-3 covering 4-7
    # lifts both weak layers at once and goes
    spans = [Span(f"a{i}", 0, 4) for i in range(6)] + [Span("b0", 4, 6), Span("b1", 4, 6)] + \
        [Span(f"c{i}", 6, 8) for i in range(3)]
    move = should_move(L, spans, "a0", HALF)
    assert (move.start, move.end) == (4, 8) and (move.before.min_count, move.after.min_count) == (2, 3)
    # a 1-wide mover lifts only one of the two weak layers (fewer weakest layers: a gain below the
    # floor, not here): on a peer event it waits, for a joiner or the periodic round
    narrow = [s for s in spans if s.node_id != "a5"] + [Span("a5", 0, 1), Span("a6", 0, 4), Span("a7", 0, 4)]
    assert redundancy_target(L, sum(s.length for s in narrow)) == 3
    assert should_move(L, narrow, "a5", LayerBudget(1, 1), balance=False) is None
    assert best_window(L, [s for s in narrow if s.node_id != "a5"], LayerBudget(1, 1), "a5") in [(4, 5), (5, 6)]
    # below the floor (a layer with one holder) any count gain still moves, as before
    spans = [Span(f"a{i}", 0, 4) for i in range(6)] + [Span("b0", 4, 6)] + [Span(f"c{i}", 6, 8) for i in range(3)]
    assert should_move(L, [*[s for s in spans if s.node_id != "a5"], Span("a5", 0, 1)], "a5",
                       LayerBudget(1, 1), balance=False) is not None


def test_a_peer_event_moves_for_counts_only_and_the_periodic_round_balances_throughput():
    spans = [Span("a", 0, 4, 1.0), Span("b", 0, 4, 1.0), Span("c", 4, 8, 3.0), Span("d", 4, 8, 3.0),
             Span("e", 0, 4, 1.0)]
    assert should_move(L, spans, "e", HALF, balance=False) is None
    assert should_move(L, spans, "e", HALF) is not None
    budgets = {s.node_id: HALF for s in spans}
    assert first_mover(L, spans, budgets, balance=False) is None
    assert first_mover(L, spans, budgets) is not None
    # a count below the target moves on a peer event too
    spans = [Span(f"n{i}", 0, 4) for i in range(4)]
    assert first_mover(L, spans, {s.node_id: HALF for s in spans}, seed=3, balance=False) is not None


def test_a_commit_never_takes_a_layer_below_the_floor():
    # two holders of 4-7 besides b: b may drop it (4-7 keeps two)
    spans = [Span("a", 0, 4), Span("b", 4, 8), Span("b", 0, 4), Span("c", 4, 8), Span("d", 4, 8)]
    assert thinned_by_drop(L, spans, "b", 4, 8) == []
    # another move took d away meanwhile: dropping would leave 4-7 one holder, below the floor of 2
    spans = [Span("a", 0, 4), Span("b", 4, 8), Span("b", 0, 4), Span("c", 4, 8), Span("d", 0, 4)]
    assert thinned_by_drop(L, spans, "b", 4, 8) == [4, 5, 6, 7]
    # a repair below the floor (some layer already has one holder) may thin down to one, not to none
    spans = [Span("a", 0, 2), Span("b", 2, 6), Span("b", 0, 2), Span("c", 2, 6), Span("d", 6, 8)]
    assert thinned_by_drop(L, spans, "b", 2, 6) == []
    assert thinned_by_drop(L, spans, "d", 6, 8) == [6, 7]


def test_the_periodic_round_lifts_some_weak_layers_from_surplus_holders_only():
    # target 3 (over four copies): 4-5 have two holders. a5 (1 layer of 0-3, which keeps 7
    # holders) lifts one of them on the periodic round, not on a peer event
    spans = [Span(f"a{i}", 0, 4) for i in range(8)] + [Span("a8", 0, 1)] + \
        [Span("b0", 4, 6), Span("b1", 4, 6)] + [Span(f"c{i}", 6, 8) for i in range(3)]
    assert should_move(L, spans, "a8", LayerBudget(1, 1), balance=False) is None
    move = should_move(L, spans, "a8", LayerBudget(1, 1))
    assert (move.start, move.end) in [(4, 5), (5, 6)] and move.after.n_weakest == 1
    # m (5-7) to 2-4 would lift all three weak layers but leave 7 at two (not surplus): the
    # swarm would count fewer weakest layers, yet m stays, even on the periodic round
    spans = [Span(f"a{i}", 0, 2) for i in range(7)] + [Span("b0", 2, 5), Span("b1", 2, 5)] + \
        [Span(f"c{i}", 5, 7) for i in range(4)] + [Span("d0", 7, 8), Span("d1", 7, 8), Span("m", 5, 8)]
    assert redundancy_target(L, sum(s.length for s in spans)) == 3
    assert best_window(L, [s for s in spans if s.node_id != "m"], LayerBudget(3, 3), "m") == (2, 5)
    assert should_move(L, spans, "m", LayerBudget(3, 3)) is None
    # with a third holder of 7 besides m, it goes
    move = should_move(L, [*spans, Span("d2", 7, 8)], "m", LayerBudget(3, 3))
    assert (move.start, move.end) == (2, 5)


def test_a_repair_below_the_floor_goes_to_the_narrowest_node_that_lifts_it_all():
    # layers 4-5 have one holder; w2 (2 wide), w4 (4 wide) and n1 (1 wide: too narrow to lift
    # both) sit on well-covered 0-3 (and 6-7 keeps two holders)
    spans = [Span(f"a{i}", 0, 4) for i in range(3)] + [Span("x", 4, 6)] + [Span("y", 6, 8), Span("z", 6, 8)] + \
        [Span("w2", 0, 2), Span("w4", 0, 4), Span("n1", 0, 1)]
    budgets = {"w2": LayerBudget(2, 2), "w4": HALF, "n1": LayerBudget(1, 1)}
    for seed in range(10):  # whatever the hash says
        node_id, move = first_mover(L, spans, budgets, seed=seed, balance=False)
        assert node_id == "w2" and (move.start, move.end) == (4, 6), seed


def test_of_equally_weak_windows_the_one_on_disk_wins():
    # layers 3-4 have no holder; windows 2-4 and 3-5 lift them alike: a partial model holding 3-5
    # takes 3-5 (nothing to fetch), whatever its hash would have said
    others = [Span("a", 0, 3, 9.0), Span("b", 5, 8, 1.0)]  # b is faster: 2-4 would be the weakest window
    budget = LayerBudget(3, 3)
    assert {best_window(8, others, budget, f"node{i}") for i in range(20)} == {(2, 5)}
    picks = {best_window(8, others, budget, f"node{i}", held=frozenset({3, 4, 5})) for i in range(20)}
    assert picks == {(3, 6)}
    assert {best_window(8, others, budget, f"node{i}", held=frozenset({2, 3, 4})) for i in range(20)} == {(2, 5)}
