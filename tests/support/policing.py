"""Tests that police the loop (after python-zeroconf's and aiohttp's conftest.py): a thread-leak
check and a slow-callback detector, wired into every test by tests/conftest.py.

Threads. Every thread alive after a test's teardown that was not alive when its setup began is a
leak, unless it ends within THREAD_JOIN_DEADLINE_S (a pool told to shut down needs a moment).
Threads whose owner outlives the test are checked when that owner ends instead:
- started while a module- or class-scoped fixture was being set up: checked once the module's
  last test is torn down (its fixtures are gone by then); package/session scope: at session end;
- an idle worker parked in a ThreadPoolExecutor that is neither shut down nor garbage (a
  module-scoped loop's default executor, a module-scoped node's engine executor): at module end.
Threads Python did not start (Qt's QThreads, native threads that called into Python) show in
threading.enumerate() as _DummyThread and never leave it on Python 3.11; their liveness is read
from /proc/self/task instead. torch/OpenMP pools are native threads that never become Python
threads, so they are not seen at all.

Slow callbacks. Every event loop created in this process runs in asyncio debug mode with
slow_callback_duration = REPORT_S: asyncio's `_run_once` (pytest-asyncio loops, asyncio.run) and
qasync's timer (the app tests' QEventLoop, which runs every callback, socket ones included, as a
timer handle) log "Executing <handle> took N seconds" for a step that held the loop that long.
Steps over FAIL_S fail the test; those between REPORT_S and FAIL_S are listed in the terminal
summary. Debug mode also makes asyncio raise on a loop method called from another thread.
Nodes in subprocesses are not covered here (their own LoopWatchdog logs stalls to node.log).
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread
import dataclasses
import gc
import logging
import os
import threading
import time
import weakref

THREAD_JOIN_DEADLINE_S = 5.0
REPORT_S = 0.1  # asyncio's own default threshold for debug-mode reports
# Measured on this 2-vCPU machine over the whole suite: the largest step not blocking on purpose
# took 0.31 s (the test's own aiohttp client, swarm.chat, with 50 streams at once in
# tests/pipeline/test_distributed); 0.22 s once in tests/net/test_foreign (a create_connection
# step, most likely a GC pass); no task or callback of node or app code reached 0.1 s (every
# step over 0.1 s was a test coroutine's). The tests
# that stall on purpose take 0.3-0.4 s and are marked blocks_loop. 0.5 s leaves room for a loaded
# machine and still catches a blocking call (a model load or a file hash on the loop takes seconds).
FAIL_S = 0.5

# Known offenders, by thread name prefix: each cites the bug that makes it linger. Never a
# blanket entry; remove one when its bug is fixed.
KNOWN_THREAD_LEAKS: dict[str, str] = {}


# --- threads ------------------------------------------------------------------------------------


def alive(thread: threading.Thread) -> bool:
    """Whether the OS thread behind `thread` still runs (also for _DummyThread, which claims so forever)."""
    if isinstance(thread, threading._DummyThread):  # noqa: SLF001
        native = getattr(thread, "native_id", None)
        return native is not None and os.path.exists(f"/proc/self/task/{native}")
    return thread.is_alive()


def live_threads() -> set[threading.Thread]:
    """Threads alive now, this one excepted."""
    me = threading.current_thread()
    return {t for t in threading.enumerate() if t is not me and alive(t)}


def parked_in_live_pool(thread: threading.Thread) -> bool:
    """An idle-or-busy worker of a ThreadPoolExecutor that is not shut down and still referenced."""
    if getattr(thread, "_target", None) is not concurrent.futures.thread._worker:  # noqa: SLF001
        return False
    ref = thread._args[0] if getattr(thread, "_args", None) else None  # noqa: SLF001
    executor = ref() if isinstance(ref, weakref.ref) else None
    return executor is not None and not executor._shutdown  # noqa: SLF001


def describe(thread: threading.Thread) -> str:
    """Name, what it runs and how, for a failure message."""
    target = getattr(thread, "_target", None)
    what = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}" \
        if target is not None else type(thread).__name__
    if target is concurrent.futures.thread._worker:  # noqa: SLF001
        what = "a ThreadPoolExecutor worker"
    return f"{thread.name!r} ({what}, daemon={thread.daemon}, native_id={getattr(thread, 'native_id', None)})"


def known_leak(thread: threading.Thread) -> str | None:
    """The cited bug when this thread is a known offender."""
    return next((why for prefix, why in KNOWN_THREAD_LEAKS.items() if thread.name.startswith(prefix)), None)


def still_alive_after(threads: set[threading.Thread], deadline_s: float | None = None) -> list[threading.Thread]:
    """The threads that do not end within the deadline (THREAD_JOIN_DEADLINE_S; one for them all)."""
    end = time.monotonic() + (THREAD_JOIN_DEADLINE_S if deadline_s is None else deadline_s)
    left = [t for t in threads if alive(t)]
    if left and any(parked_in_live_pool(t) for t in left):
        gc.collect()  # an executor its owner dropped wakes its workers when collected
    for t in left:
        remaining = end - time.monotonic()
        if remaining <= 0:
            break
        if isinstance(t, threading._DummyThread):  # noqa: SLF001
            while alive(t) and time.monotonic() < end:
                time.sleep(0.01)
        else:
            t.join(remaining)
    return sorted((t for t in left if alive(t)), key=lambda t: t.name)


@dataclasses.dataclass
class Pending:
    """A thread whose check waits for its owner to end."""

    thread: threading.Thread
    started_in: str  # the test (and phase or fixture) during which it started


# --- slow callbacks -----------------------------------------------------------------------------


@dataclasses.dataclass
class SlowStep:
    """One loop step that took longer than REPORT_S."""

    seconds: float
    handle: str
    phase: str


class SlowCallbackLog(logging.Handler):
    """Collects asyncio's and qasync's debug-mode "Executing %s took %.3f seconds" records."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.steps: list[SlowStep] = []
        self.phase = "outside a test"

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "Executing %s took %.3f seconds" and isinstance(record.args, tuple) \
                and len(record.args) == 2:
            self.steps.append(SlowStep(float(record.args[1]), str(record.args[0]), self.phase))

    def take(self) -> list[SlowStep]:
        """The steps since the last take."""
        steps, self.steps = self.steps, []
        return steps

    def install(self) -> None:
        """Listen on asyncio's and qasync's loggers (qasync's timer logs under qasync._SimpleTimer)."""
        for name in ("asyncio", "qasync"):
            logging.getLogger(name).addHandler(self)


_original_init = asyncio.BaseEventLoop.__init__


def enable_loop_debug() -> None:
    """Every event loop created from now on in this process runs in debug mode with
    slow_callback_duration = REPORT_S. (An environment variable would reach the node subprocesses
    too; this reaches only loops in the test process.)"""
    if getattr(asyncio.BaseEventLoop.__init__, "_policed", False):
        return

    def __init__(self, *args, **kwargs):  # noqa: N807
        _original_init(self, *args, **kwargs)
        self.set_debug(True)
        self.slow_callback_duration = REPORT_S

    __init__._policed = True
    asyncio.BaseEventLoop.__init__ = __init__
