"""Loop-lag watchdog: names the function that kept the event loop busy (DESIGN.md §3).

A heartbeat callback on the loop records when it last ran; a daemon thread checks it and, while
the loop is late, samples the loop thread's current Python frame. When the beat finally runs
late by more than the threshold, one line is logged:
`DIAG: network event loop stalled took_ms=… arm=<module:function>`.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import sys
import threading
import time
from collections.abc import Callable

from node import const
from node.logs import kv

log = logging.getLogger(__name__)

_SKIP_MODULES = ("asyncio", "selectors", "threading", "concurrent", "qasync")


# the loop thread found waiting in select while its beat is late: it was not busy, the process
# did not run (SIGSTOP, a debugger, a VM paused, CPU starvation)
IDLE_ARM = "idle_in_select(process suspended or starved of CPU)"
# the GUI's qasync loop found in Qt's own event loop (no Python frame above it): idle, or Qt's own
# C++ work (drawing), which cannot be told apart from here
QT_ARM = "in_qt_event_loop(idle or Qt's own work; process suspended or starved of CPU)"
# where an idle loop waits: selector loops (selectors' select), Windows' ProactorEventLoop
# (asyncio.windows_events IocpProactor._poll, in GetQueuedCompletionStatus)
_IDLE_WAITS = (("selectors", None), ("asyncio.windows_events", "_poll"))


def suspend_clock() -> tuple[Callable[[], float], str]:
    """(a clock in seconds that keeps counting while the machine is suspended, its name): time.monotonic
    does not on Linux (CLOCK_MONOTONIC) nor macOS (mach_absolute_time), so a closed lid left the
    heartbeat on time and the sleep unseen. Linux: CLOCK_BOOTTIME; macOS: clock_gettime's
    CLOCK_MONOTONIC (Apple's counts sleep; CLOCK_UPTIME_RAW, like mach_absolute_time, does not);
    Windows: GetTickCount64 (documented to include sleep and hibernation; time.monotonic is
    QueryPerformanceCounter from Python 3.13, GetTickCount64 before). Elsewhere time.monotonic:
    a suspend of the whole machine is not told from a running one there."""
    if sys.platform.startswith("linux") and hasattr(time, "CLOCK_BOOTTIME"):
        return (lambda: time.clock_gettime(time.CLOCK_BOOTTIME)), "CLOCK_BOOTTIME"
    if sys.platform == "darwin" and hasattr(time, "CLOCK_MONOTONIC"):
        return (lambda: time.clock_gettime(time.CLOCK_MONOTONIC)), "CLOCK_MONOTONIC"
    if sys.platform == "win32":
        try:
            ticks = ctypes.windll.kernel32.GetTickCount64  # type: ignore[attr-defined]
            ticks.restype = ctypes.c_ulonglong
            return (lambda: ticks() / 1000.0), "GetTickCount64"
        except (AttributeError, OSError):
            pass
    return time.monotonic, "monotonic(suspend not counted)"


class PausePushback:
    """One deadline's push-backs for this node's own pauses, the one rule for a pipeline step's
    ACK/RESULT deadline (deadlines.py) and a remote generation's TOKENS silence (remote_stream.py):
    a deadline that ran out while this node was paused (SIGSTOP, a lid closed, a loop kept busy: the
    watchdog's `paused_since`) is not the peer's silence, so it moves back by the part of the pause
    since its clock started or since the last push (which counted the pauses before it), at most
    `limit` (SELF_PAUSE_REARMS) times; then the peer is charged. The peer gets the budget it had,
    not a fresh one (until 2026-12-07 each pause gave a whole fresh budget, any number of times, and
    a coordinator stalling now and then kept a silent peer for ever). Loop thread only."""

    def __init__(self, limit: int = const.SELF_PAUSE_REARMS):
        self.limit = limit
        self.pushed = 0.0  # seconds the deadline was pushed back in all
        self.rearms = 0  # how often (limit at most)
        self.rearmed_at = float("-inf")  # when last: pauses before it are counted already
        self.paused = 0.0  # the pause the last `push` found (for its caller's log line)

    def reset(self) -> None:
        """A new wait starts (a remote holder's frame): the peer's whole budget and bound again."""
        self.pushed, self.rearms, self.rearmed_at = 0.0, 0, float("-inf")

    def push(self, pauses: LoopWatchdog | None, since: float, now: float) -> float:
        """The deadline whose clock started at `since` (monotonic) ran out at `now`: seconds to push
        it back by (this node's pauses since `since` or the last push, at most `now - since`), 0.0
        when there were none or the bound is reached: then the peer is charged. `pauses`: the loop
        watchdog, or anything with its `paused_since`; None: this node's pauses are not known."""
        since = max(since, self.rearmed_at)
        self.paused = pauses.paused_since(since, now) if pauses is not None else 0.0
        amount = min(self.paused, now - since)
        if amount <= 0 or self.rearms >= self.limit:
            return 0.0
        self.pushed += amount
        self.rearms += 1
        self.rearmed_at = now
        return amount


def _describe_frame(frame) -> str:
    """The innermost frame that is not event-loop machinery, as module:function:line; IDLE_ARM
    when the innermost frame is the loop's wait (a selector's, the Proactor's _poll), QT_ARM when it
    is qasync's run_forever (2026-12-06: a node SIGSTOPped 70 s logged
    `arm=node.commands.run:run:249`, the outermost frame above the idle loop, as the culprit)."""
    if frame is not None:
        module, function = frame.f_globals.get("__name__"), frame.f_code.co_name
        if (module, None) in _IDLE_WAITS or (module, function) in _IDLE_WAITS:
            return IDLE_ARM
        if module == "qasync" and function == "run_forever":  # (the app's exec() runs below it, in C++)
            return QT_ARM
    best = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "?")
        if not module.startswith(_SKIP_MODULES):
            best = f"{module}:{frame.f_code.co_name}:{frame.f_lineno}"
            break
        frame = frame.f_back
    return best or "event_loop_internal"


class LoopWatchdog:
    """Watch one asyncio loop from a daemon thread."""

    def __init__(self, threshold_ms: float = const.LOOP_STALL_THRESHOLD_MS,
                 interval_s: float = const.LOOP_WATCHDOG_INTERVAL_S,
                 suspend: tuple[Callable[[], float], str] | None = None):
        self.threshold_s = threshold_ms / 1000.0
        # a clock counting the machine's suspend too (suspend_clock; tests inject one)
        self._suspend_clock, self.suspend_clock_name = suspend or suspend_clock()
        self.interval_s = interval_s
        self.stalls = 0
        self.max_stall_ms = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None
        self._last_beat = time.monotonic()
        self._arm: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._expected = self._last_beat + interval_s
        self._expected_suspend = self._suspend_clock() + interval_s  # the same, on the suspend clock
        # the last stalls of SELF_PAUSE_MIN_S or more: (monotonic start, end, seconds it lasted: the
        # suspend clock's, which a machine's sleep leaves monotonic's span near zero); pipeline
        # deadlines and link drops that fell in one are this node's doing, not the peer's (paused_since)
        self.pauses: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=8)
        self.pause_count = 0  # such stalls since start (admin stats `self_pauses`)

    def _late(self, now: float) -> float:
        """How late the beat is now: the process stopped (monotonic) or the machine asleep too."""
        return max(now - self._expected, self._suspend_clock() - self._expected_suspend)

    def _spans(self, now: float) -> list[tuple[float, float, float]]:
        spans = list(self.pauses)
        late = self._late(now) if self._loop is not None else 0.0
        if late >= const.SELF_PAUSE_MIN_S:
            spans.append((self._expected, now, late))  # the beat is that late: the loop has not run since
        return spans

    def paused_since(self, since: float, now: float | None = None) -> float:
        """Seconds of stalls of SELF_PAUSE_MIN_S or more (SIGSTOP, a VM or laptop asleep, a loop
        kept busy) after the monotonic time `since`, the one still going on included: a timer run
        late by one fires in the same loop pass as the frames that came meanwhile, before the
        heartbeat that records it, so the heartbeat's lateness is read here too."""
        now = time.monotonic() if now is None else now
        return sum(max(0.0, took - max(0.0, since - start)) for start, end, took in self._spans(now) if end > since)

    def last_pause(self, within_s: float) -> tuple[float, float, float] | None:
        """(monotonic start, end, seconds it lasted) of the last such stall when it ended within `within_s`, else None.
        The one still going on ends `now`: a caller on the loop itself (it runs, so that stall is
        over) counts it only from a time the loop last ran, e.g. when it opened what failed
        (failover.py `_own_pause`; counting it whole excused a request's every failure for ever, 2026-12-07)."""
        now = time.monotonic()
        recent = [span for span in self._spans(now) if now - span[1] <= within_s]
        return recent[-1] if recent else None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start watching the running loop (call from the loop thread)."""
        self._loop = loop or asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._last_beat = time.monotonic()
        self._stop.clear()
        self._schedule()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and the heartbeat."""
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _schedule(self) -> None:
        if self._loop is not None and not self._stop.is_set():
            self._expected = time.monotonic() + self.interval_s
            self._expected_suspend = self._suspend_clock() + self.interval_s
            self._handle = self._loop.call_later(self.interval_s, self._beat)

    def _beat(self) -> None:
        now = time.monotonic()
        stopped_s = now - self._expected  # the process did not run (SIGSTOP, a paused VM, starved)
        late_s = self._late(now)  # ... or the machine slept (not seen by monotonic: the beat on time)
        if late_s > self.threshold_s:
            took_ms = late_s * 1000.0
            self.stalls += 1
            self.max_stall_ms = max(self.max_stall_ms, took_ms)
            log.warning("DIAG: network event loop stalled took_ms=%d arm=%s", took_ms,
                        self._arm or "unsampled(process or GIL starved)")
            if late_s >= const.SELF_PAUSE_MIN_S:
                self.pauses.append((self._expected, now, late_s))
                self.pause_count += 1
                asleep_s = max(0.0, late_s - stopped_s)
                log.warning("DIAG: this node was paused %.1f s (%s); deadlines and link drops of that time "
                            "are not charged to peers %s", late_s,
                            "the machine was asleep" if asleep_s >= const.SELF_PAUSE_MIN_S else
                            "its event loop did not run: the process suspended or starved of CPU",
                            kv(paused_ms=round(took_ms), asleep_ms=round(asleep_s * 1000),
                               clock=self.suspend_clock_name))
        self._arm = None
        self._last_beat = now
        self._schedule()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s / 2):
            if time.monotonic() - self._last_beat > self.interval_s + self.threshold_s / 2:
                if self._arm is None and self._loop_thread_id is not None:
                    self._arm = _sample(self._loop_thread_id)


def _sample(thread_id: int) -> str | None:
    """Where a thread is now. Holds its Python frames only while reading them: a frame object kept
    after its function returns keeps that function's locals alive (a kept view into a receive
    buffer killed links under load, issue 12), so nothing here outlives the call."""
    frames = sys._current_frames()
    try:
        frame = frames.get(thread_id)
        return None if frame is None else _describe_frame(frame)
    finally:
        frame = None
        frames.clear()
