"""A machine's sleep (a laptop's lid closed: system suspend, not SIGSTOP) is a pause of this node
too. time.monotonic does not count suspend on Linux or macOS, so the heartbeat came on time after
the wake and nothing was recorded: the peer's link drop on wake was blamed on the peer (review r21,
finding 2). The watchdog now also reads a clock that counts suspend (CLOCK_BOOTTIME on Linux);
here one is injected that jumps as a machine's sleep would, while monotonic does not."""

from __future__ import annotations

import logging
import sys
import time

import pytest

from node import const
from node.watchdog import LoopWatchdog, suspend_clock
from tests.support.waiting import wait_until

ASLEEP_S = 30.0


class SleepingMachine:
    """time.monotonic plus the time the machine 'slept': what CLOCK_BOOTTIME reads across a suspend."""

    def __init__(self):
        self.slept = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.slept


async def test_a_machines_sleep_is_recorded_as_this_nodes_pause(caplog):
    caplog.set_level(logging.INFO)
    machine = SleepingMachine()
    dog = LoopWatchdog(suspend=(machine, "test"))
    dog.start()
    try:
        before = time.monotonic()
        machine.slept = ASLEEP_S  # the lid closes and opens: monotonic did not move meanwhile
        await wait_until(lambda: dog.pauses, 5, 0.01, what="the watchdog to record the machine's sleep")
        start, end, took = dog.last_pause(const.SELF_PAUSE_GRACE_S)
        assert took >= ASLEEP_S and end - start < ASLEEP_S  # its monotonic span is near zero
        assert dog.paused_since(before) >= ASLEEP_S
        assert "the machine was asleep" in caplog.text
        assert caplog.text.count("DIAG: this node was paused") == 1
    finally:
        dog.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's clock")
def test_the_default_clock_counts_suspend_on_linux():
    clock, name = suspend_clock()
    assert name == "CLOCK_BOOTTIME"
    assert abs(clock() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1.0
