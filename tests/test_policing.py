"""The loop police itself (tests/conftest.py, tests/support/policing.py): run on a small suite of
tests that misbehave, in a separate pytest process, it fails exactly the ones that do."""

from __future__ import annotations

import re

import pytest

from tests.support.processes import REPO

MISBEHAVING = '''
import asyncio
import threading
import time

import pytest


def burn(cpu_s):  # CPU-bound work on the loop thread, as a model load or a hash would be
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_leaks_a_thread():
    threading.Thread(target=time.sleep, args=(30,), name="leaky-thread", daemon=True).start()


def test_a_thread_that_ends_soon_is_fine():
    threading.Thread(target=time.sleep, args=(0.3,), name="brief-thread", daemon=True).start()


async def test_blocks_a_pytest_asyncio_loop():
    await asyncio.sleep(0)
    burn(0.4)


def test_blocks_an_asyncio_run_loop():
    async def go():
        burn(0.4)
    asyncio.run(go())


async def test_a_blocking_call_on_the_loop():
    time.sleep(2.2)  # no CPU, but long enough that only a blocking call explains it


async def test_a_short_wait_without_cpu_is_only_reported():
    time.sleep(0.3)  # what a step that waited for a core on a loaded machine looks like


async def test_a_step_starved_of_a_core_is_only_reported():
    # 16 processes spinning on this process's one core: a step using little CPU lasts seconds, all of
    # them waiting for the core (a loaded CI machine starting node processes beside the test)
    import os, subprocess, sys
    allowed = os.sched_getaffinity(0)
    core = min(allowed)
    spin = f"import os\\nos.sched_setaffinity(0, {{{core}}})\\nwhile True: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(16)]
    os.sched_setaffinity(0, {core})
    try:
        await asyncio.sleep(1.0)  # (they start outside the step)
        start, cpu0 = time.perf_counter(), time.thread_time()
        while time.perf_counter() - start < 2.4 and time.thread_time() - cpu0 < 0.2:
            pass
    finally:
        os.sched_setaffinity(0, allowed)
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.blocks_loop("on purpose")
async def test_blocks_on_purpose():
    burn(0.4)


async def test_blocking_work_in_an_executor_is_fine():
    await asyncio.get_running_loop().run_in_executor(None, time.sleep, 0.8)


@pytest.fixture(scope="module")
def module_thread():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="module-owned", daemon=True)
    thread.start()
    yield thread
    # never stopped: a leak, but only once the module's fixtures are gone


def test_uses_a_module_thread(module_thread):
    assert module_thread.is_alive()


def test_uses_it_again(module_thread):
    assert module_thread.is_alive()
'''


@pytest.mark.slow
def test_the_police_fails_leaks_and_blocking_steps_and_nothing_else(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the inner pytest imports tests.conftest from this checkout
    pytester.makeconftest("from tests.conftest import *  # noqa: F403 (the suite's own hooks)\n"
                          "from tests.support import policing\n"
                          "policing.THREAD_JOIN_DEADLINE_S = 1.0  # the leaks here never end: fail them sooner\n")
    pytester.makepyfile(test_misbehaving=MISBEHAVING)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "asyncio_mode=auto", "-rE", timeout=240)
    errors = {line.split(" - ")[0].split("::")[-1] for line in result.outlines if line.startswith("ERROR ")}
    assert errors == {"test_leaks_a_thread", "test_blocks_a_pytest_asyncio_loop", "test_blocks_an_asyncio_run_loop",
                      "test_a_blocking_call_on_the_loop", "test_uses_it_again"}, result.stdout.str()
    out = result.stdout.str()
    assert "thread leak: 'leaky-thread' (time.sleep" in out
    assert "thread leak: 'module-owned'" in out and "setting up the module-scoped fixture 'module_thread'" in out
    # wall clock varies with the machine's load; the CPU burnt on the loop does not
    assert re.search(r"blocked the event loop for [\d.]+ s \(0\.4\d\d s of CPU", out), out
    assert "test_blocks_a_pytest_asyncio_loop" in out
    assert "test_a_short_wait_without_cpu_is_only_reported [call]" in out  # in the summary only
    # a step starved of a core for over FAIL_WALL_S: its wait is told apart from a blocking call's
    starved = re.search(r"([\d.]+) s \(([\d.]+) s CPU, ([\d.]+) s waiting for a core\)  "
                        r"test_misbehaving.py::test_a_step_starved_of_a_core_is_only_reported \[call\]", out)
    assert starved and float(starved[1]) >= 2.0 and float(starved[2]) < 0.25 and float(starved[3]) >= 1.5, out
    assert "brief-thread" not in out
    assert "test_blocks_on_purpose [call] (blocks_loop: on purpose)" in out  # reported, not failed
    result.assert_outcomes(passed=11, errors=5)
