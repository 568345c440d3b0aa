"""watchdog.PausePushback, the one rule by which a deadline that ran out during this node's own pause
is pushed back (a pipeline step's, deadlines.py; a remote generation's silence, remote_stream.py):
by the part of the pause since the deadline's clock started or since the last push, at most
SELF_PAUSE_REARMS times, then the peer is charged. Driven on a real LoopWatchdog's pause record with
an injected clock: every time below is a monotonic time the test chooses, none is waited for."""

from __future__ import annotations

import pytest

from node import const
from node.watchdog import LoopWatchdog, PausePushback


def _dog(*spans: tuple[float, float]) -> LoopWatchdog:
    """A watchdog (not started: no stall going on) that recorded these pauses, (start, end) each."""
    dog = LoopWatchdog(suspend=(lambda: 0.0, "test"))
    for start, end in spans:
        dog.pauses.append((start, end, end - start))
    return dog


def test_a_deadline_is_pushed_back_by_the_pause_since_its_clock_started_not_a_fresh_budget():
    # a 0.5 s budget from t=100; this node paused 100.2..101.7 (1.5 s); the timer ran at 101.7
    pushback = PausePushback()
    assert pushback.push(_dog((100.2, 101.7)), since=100.0, now=101.7) == pytest.approx(1.5)
    assert pushback.paused == pytest.approx(1.5)
    assert (pushback.pushed, pushback.rearms) == (pytest.approx(1.5), 1)
    # the deadline, 100.5 + 1.5 = 102.0: the 0.3 s the peer had left when the pause began, not 0.5 s more


def test_only_the_part_of_a_pause_after_the_clock_started_counts():
    # paused 99.0..101.0 (as the watchdog's span says); a deadline whose clock started at 100.4: 0.6 s is its
    pushback = PausePushback()
    assert pushback.push(_dog((99.0, 101.0)), since=100.4, now=101.0) == pytest.approx(0.6)


def test_a_pause_before_the_clock_started_or_none_at_all_charges_the_peer():
    assert PausePushback().push(_dog((90.0, 95.0)), since=100.0, now=100.5) == 0.0
    assert PausePushback().push(_dog(), since=100.0, now=100.5) == 0.0
    assert PausePushback().push(None, since=100.0, now=100.5) == 0.0  # pauses not known


def test_the_push_back_is_bounded_and_counts_each_pause_once():
    dog = _dog((100.1, 101.4))
    pushback = PausePushback()
    assert pushback.push(dog, 100.0, 101.4) == pytest.approx(1.3)
    # the re-armed deadline runs out again: the pause already counted gives nothing more
    assert pushback.push(dog, 100.0, 101.9) == 0.0
    assert pushback.rearms == 1
    for n in range(1, const.SELF_PAUSE_REARMS):  # more pauses, each pushing once, up to the bound
        start = 102.0 + 3 * n
        dog.pauses.append((start, start + 1.2, 1.2))
        assert pushback.push(dog, 100.0, start + 1.2) == pytest.approx(1.2), n
    assert pushback.rearms == const.SELF_PAUSE_REARMS
    assert pushback.pushed == pytest.approx(1.3 + 1.2 * (const.SELF_PAUSE_REARMS - 1))
    dog.pauses.append((120.0, 122.0, 2.0))  # one pause more than the bound: the peer is charged
    assert pushback.push(dog, 100.0, 122.0) == 0.0
    assert pushback.pushed == pytest.approx(1.3 + 1.2 * (const.SELF_PAUSE_REARMS - 1))
    # a new wait (a holder's frame) gets its whole bound again, its pauses counted from its own start
    pushback.reset()
    assert (pushback.pushed, pushback.rearms) == (0.0, 0)
    assert pushback.push(dog, 119.5, 122.0) == pytest.approx(2.0)


def test_a_machine_asleep_pushes_by_the_time_it_slept_at_most_the_time_waited():
    # a span's length is the suspend clock's (a closed lid): longer than its monotonic start..end;
    # the push is never more than the time since the clock started
    dog = LoopWatchdog(suspend=(lambda: 0.0, "test"))
    dog.pauses.append((100.1, 100.3, 60.0))
    pushback = PausePushback()
    assert pushback.push(dog, 100.0, 100.4) == pytest.approx(0.4)
    assert pushback.paused == pytest.approx(60.0)
