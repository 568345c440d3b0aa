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

Slow callbacks. Every loop step in this process is timed (Handle._run, which asyncio's `_run_once`
-- pytest-asyncio loops, asyncio.run -- and qasync's timer -- the app tests' QEventLoop, which runs
every callback, socket ones included, as a timer handle -- both call): wall clock and the loop
thread's CPU time. A step that burnt FAIL_CPU_S of CPU or lasted FAIL_WALL_S fails the test; every
step over REPORT_S is listed in the terminal summary. Every loop also runs in asyncio debug mode. Debug mode also makes asyncio raise on a loop method called from another thread.
Nodes in subprocesses are not covered here (their own LoopWatchdog logs stalls to node.log).
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread
import dataclasses
import gc
import linecache
import os
import threading
import time
import weakref

THREAD_JOIN_DEADLINE_S = 5.0
REPORT_S = 0.1  # asyncio's own default threshold for debug-mode reports
# A step fails the test when the loop thread spent FAIL_CPU_S of CPU in it (CPU-bound work on the
# loop: a model load, a file hash, torch; those take seconds), or when it lasted FAIL_WALL_S (a
# blocking call). Wall time alone is not the measure: with six node processes starting on this
# 2-vCPU machine a trivial step of the test's own client took 0.8-1.1 s of wall clock while
# its process waited for a core (measured in tests/pipeline, 2026-12-01); the largest CPU time of
# a step not blocking on purpose over the whole suite was ~0.1 s. Every step over REPORT_S is
# listed in the terminal summary, with its CPU time.
FAIL_CPU_S = 0.25
FAIL_WALL_S = 2.0

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
    """One loop step that took longer than REPORT_S (wall clock), and the loop thread's CPU time in it."""

    seconds: float
    cpu_seconds: float
    handle: str
    phase: str
    runnable_seconds: float = 0.0  # of `seconds`, how long the thread was ready to run, waiting for a core

    @property
    def fails(self) -> bool:
        """Blocking the loop: CPU-bound work on it (a model load, a hash, torch), or a wait so long
        that only a blocking call explains it. A step that merely waited for a core on a loaded
        2-vCPU machine burns little CPU: reported, not failed. Its time waiting for a core (the
        kernel's run-queue wait, /proc/thread-self/schedstat) is no blocking call either: a fresh
        clone's CI run (2026-12-07) failed a step of 2.5 s with 2 ms of CPU while three node processes
        started beside the test on 2 vCPUs. A blocking call (sleep, I/O, a lock, the GIL held by
        another thread) waits off the run queue, so it still counts."""
        return self.cpu_seconds >= FAIL_CPU_S or self.seconds - self.runnable_seconds >= FAIL_WALL_S


# CPU time of cyclic garbage collections per thread (a loop step subtracts what its own thread
# spent collecting): a collection over the test process's heap (torch, llama.cpp, every earlier test's
# objects) costs 0.3-0.4 s and lands in whichever step allocates; that is the test process's
# heap, not code blocking the loop (the node itself gc.freeze()s its start-up heap).
_gc_cpu: dict[int, float] = {}  # thread id -> CPU seconds spent collecting on it
_gc_started: dict[int, float] = {}


def _on_gc(phase: str, _info: dict) -> None:
    tid = threading.get_ident()
    if phase == "start":
        _gc_started[tid] = time.thread_time()
    elif tid in _gc_started:
        _gc_cpu[tid] = _gc_cpu.get(tid, 0.0) + time.thread_time() - _gc_started.pop(tid)


class _Schedstat:
    """This thread's /proc/thread-self/schedstat, kept open (a pread: ~2 µs); closed with the thread."""

    def __init__(self) -> None:
        try:
            self.fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:  # not Linux, or no scheduler statistics: no step is excused
            self.fd = None

    def runnable_s(self) -> float:
        """Seconds this thread has spent runnable, waiting for a core (0.0 where unknown)."""
        if self.fd is None:
            return 0.0
        try:
            return int(os.pread(self.fd, 64, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def __del__(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


_schedstat = threading.local()


def _runnable_s() -> float:
    """The calling thread's run-queue wait so far (see SlowStep.fails)."""
    stat = getattr(_schedstat, "stat", None)
    if stat is None:
        stat = _schedstat.stat = _Schedstat()
    return stat.runnable_s()


class SlowCallbackLog:
    """Times every loop step in this process (asyncio's _run_once and qasync's timer both run
    Handle._run): wall clock and the loop thread's CPU time."""

    def __init__(self) -> None:
        self.steps: list[SlowStep] = []
        self.phase = "outside a test"

    def take(self) -> list[SlowStep]:
        """The steps since the last take."""
        steps, self.steps = self.steps, []
        return steps

    def install(self) -> None:
        """Wrap asyncio.events.Handle._run (once)."""
        original = asyncio.events.Handle._run
        if getattr(original, "_policed", False):
            return
        log_ = self

        def _run(handle):
            tid = threading.get_ident()
            wall0, cpu0, gc0 = time.perf_counter(), time.thread_time(), _gc_cpu.get(tid, 0.0)
            queued0 = _runnable_s()
            try:
                return original(handle)
            finally:
                wall = time.perf_counter() - wall0
                if wall >= REPORT_S:
                    cpu = time.thread_time() - cpu0 - (_gc_cpu.get(tid, 0.0) - gc0)
                    queued = _runnable_s() - queued0
                    log_.steps.append(SlowStep(wall, max(0.0, cpu), repr(handle), log_.phase,
                                               min(wall, max(0.0, queued))))

        _run._policed = True
        asyncio.events.Handle._run = _run
        gc.callbacks.append(_on_gc)


_original_init = asyncio.BaseEventLoop.__init__


def enable_loop_debug() -> None:
    """Every event loop created from now on in this process runs in debug mode with
    slow_callback_duration = REPORT_S. (An environment variable would reach the node subprocesses
    too; this reaches only loops in the test process.)"""
    if getattr(asyncio.BaseEventLoop.__init__, "_policed", False):
        return

    def __init__(self, *args, **kwargs):  # noqa: N807
        _original_init(self, *args, **kwargs)
        self.set_debug(True)  # also raises on loop methods called from another thread
        self.slow_callback_duration = 3600.0  # SlowCallbackLog times the steps (with CPU time)

    __init__._policed = True
    asyncio.BaseEventLoop.__init__ = __init__
    linecache.checkcache = _checkcache_once


_checked: set[str] = set()
_original_checkcache = linecache.checkcache


def _checkcache_once(filename: str | None = None) -> None:
    """linecache.checkcache, which os.stat()s the file, once per file name in this test process.
    Debug mode records a source traceback for every Handle and Future (traceback.extract_stack,
    which checks each frame's file), and every stat hands the GIL away and waits to take it back, up
    to the 5 ms switch interval while an executor thread runs Python (a slice loading, a hash): a
    loop step making a few futures lasted 0.13-0.17 s with ~1 ms of CPU in
    tests/pipeline/test_autoserve*.py, and 2-3.6 s on a loaded machine, where the police failed
    tests for the harness's own stats (a fresh clone's CI run, 2026-12-07; a node's loop is not in
    debug mode). The sources do not change during a run."""
    if filename is None or filename not in _checked:
        _original_checkcache(filename)
        if filename is not None:
            _checked.add(filename)
