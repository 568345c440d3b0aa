"""Shared fixtures and the loop police: every test is hermetic (own temp data dir, no env vars, no
internet), leaves no thread behind and never blocks an event loop (tests/support/policing.py)."""

from __future__ import annotations

import os

import pytest

from tests.support import policing
from tests.support.processes import NOT_INHERITED, empty_hf_home

pytest_plugins = ["pytester"]  # tests/test_policing.py runs the police on tests that misbehave

# Tests never read the developer's real data dir or config from the environment, nor their Hugging
# Face token, endpoint or cache (2026-12-07: the nodes a test runs in this process read them; with no
# HF_HOME at all, the token file in the developer's home).
for _key in list(os.environ):
    if _key.startswith(NOT_INHERITED):
        del os.environ[_key]
os.environ["HF_HOME"] = empty_hf_home()
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

policing.enable_loop_debug()
_slow_log = policing.SlowCallbackLog()
_slow_log.install()
_BEFORE = pytest.StashKey[set]()
_OWNED_WIDER = pytest.StashKey[set]()
_module_pending: list[policing.Pending] = []  # checked when the module's last test is torn down
_session_pending: list[policing.Pending] = []  # checked at the end of the session
_slow_seen: list[tuple[str, policing.SlowStep, str | None]] = []  # (test, step, blocks_loop reason): the summary
_session_leaks: list[str] = []
_current: list[pytest.Item] = []


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """The root logger's handlers and level as they were: a test that runs an entry point's set-up
    (`app.main.main`, `setup_logging`) installed a console handler on pytest's capture of stderr,
    which is closed after that test, and every later log line printed logging's traceback (the
    printing took a later test past the loop police's CPU limit)."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture
def fast_retries(monkeypatch):
    """Download retries back off 10 ms, not seconds (a module asks for it: `usefixtures("fast_retries")`)."""
    from node import const

    monkeypatch.setattr(const, "DOWNLOAD_RETRY_BASE_S", 0.01)


@pytest.fixture
def data_dir(tmp_path):
    """A fresh node data dir."""
    d = tmp_path / "data"
    d.mkdir()
    return d


def pytest_configure(config):
    # pytest-asyncio's runners call loop.set_debug(asyncio_debug) after creating a loop: keep it on
    config.option.asyncio_debug = True
    # the process's grammar-compile threads (node.inference.compile_threads.compile_pool) live as long as the
    # process, as in a node: started before any test, so no module is charged with them
    from node.inference import compile_threads

    compile_threads.compile_pool()
    # the openai and anthropic SDKs build their pydantic models on first use: on the first test's event
    # loop, shared with its nodes, that was a 0.2-0.4 s step of CPU (the loop police)
    from tests.support.nodes import build_sdk_models

    build_sdk_models()
    config.addinivalue_line(
        "markers", "blocks_loop(reason): this test blocks its event loop on purpose (slow steps are reported, "
                   "not failed)")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    _current[:] = [item]
    item.stash[_BEFORE] = policing.live_threads()
    item.stash[_OWNED_WIDER] = set()
    for step in _slow_log.take():  # between tests (collection, another module's fixtures)
        _slow_seen.append(("between tests", step, None))
    _slow_log.phase = "setup"
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope == "function" or not _current:
        return (yield)
    before = policing.live_threads()
    try:
        return (yield)
    finally:
        item = _current[0]
        started = policing.live_threads() - before
        owner = _module_pending if fixturedef.scope in ("module", "class") else _session_pending
        for thread in started:
            item.stash[_OWNED_WIDER].add(thread)
            owner.append(policing.Pending(thread, f"{item.nodeid}, setting up the {fixturedef.scope}-scoped "
                                                  f"fixture {fixturedef.argname!r}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _slow_log.phase = "call"
    return (yield)


def _module_of(item) -> object:
    return item.getparent(pytest.Module)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    _slow_log.phase = "teardown"
    result = yield
    problems: list[str] = []
    # threads: started during this test (not by a wider-scoped fixture) and still running
    new = policing.live_threads() - item.stash[_BEFORE] - item.stash[_OWNED_WIDER]
    parked = {t for t in new if policing.parked_in_live_pool(t)}
    _module_pending.extend(policing.Pending(t, item.nodeid) for t in parked)
    for thread in policing.still_alive_after(new - parked):
        if policing.known_leak(thread):
            continue  # a known offender: see KNOWN_THREAD_LEAKS for the bug it stands for
        problems.append(f"thread leak: {policing.describe(thread)} still runs after the test")
    if nextitem is None or _module_of(nextitem) is not _module_of(item):
        pending, _module_pending[:] = list(_module_pending), []
        by_thread = {p.thread: p for p in pending}
        for thread in policing.still_alive_after(set(by_thread)):
            if policing.known_leak(thread):
                continue
            problems.append(f"thread leak: {policing.describe(thread)}, started during {by_thread[thread].started_in}, "
                            "still runs after the module's last test and its fixtures")
    # slow loop steps
    allowed = item.get_closest_marker("blocks_loop")
    for step in _slow_log.take():
        _slow_seen.append((item.nodeid, step, None if allowed is None else str(allowed.args[0] if allowed.args
                                                                                else "no reason given")))
        if step.fails and allowed is None:
            problems.append(f"blocked the event loop for {step.seconds:.3f} s ({step.cpu_seconds:.3f} s of CPU, "
                            f"{step.runnable_seconds:.3f} s waiting for a core; limits {policing.FAIL_CPU_S} s "
                            f"CPU, {policing.FAIL_WALL_S} s not waiting for a core) during "
                            f"{step.phase}: {step.handle}")
    _slow_log.phase = "between tests"
    _current[:] = []
    if problems:
        raise AssertionError("the loop police:\n  " + "\n  ".join(problems))
    return result


def pytest_sessionfinish(session, exitstatus):
    by_thread = {p.thread: p for p in _session_pending}
    for thread in policing.still_alive_after(set(by_thread)):
        if not policing.known_leak(thread):
            _session_leaks.append(f"{policing.describe(thread)}, started during {by_thread[thread].started_in}")
    if _session_leaks and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _file_times(terminalreporter) -> list[tuple[float, str, int]]:
    """(seconds, test file, tests) of every file the session ran, setups and teardowns included."""
    seconds: dict[str, float] = {}
    tests: dict[str, set[str]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid = getattr(report, "nodeid", "")
            if "::" in nodeid and isinstance(getattr(report, "duration", None), float):
                where = nodeid.split("::", 1)[0]
                seconds[where] = seconds.get(where, 0.0) + report.duration
                tests.setdefault(where, set()).add(nodeid)
    return sorted(((t, where, len(tests[where])) for where, t in seconds.items()), reverse=True)


def pytest_terminal_summary(terminalreporter):
    if len(times := _file_times(terminalreporter)) > 1:  # where the suite's time goes, by file (the aim: under 20 min)
        terminalreporter.section(f"slowest {min(25, len(times))} test files (of {len(times)}; "
                                 f"{sum(t for t, _, _ in times) / 60:.1f} min in all)")
        for seconds, where, n in times[:25]:
            terminalreporter.write_line(f"{seconds:8.1f} s  {n:4d} tests  {where}")
    if _slow_seen:
        terminalreporter.section(f"event-loop steps over {policing.REPORT_S} s (wall clock, with the loop thread's CPU time)")
        for where, step, allowed in sorted(_slow_seen, key=lambda x: -x[1].seconds)[:25]:
            note = f" (blocks_loop: {allowed})" if allowed is not None else ""
            terminalreporter.write_line(f"{step.seconds:7.3f} s ({step.cpu_seconds:.3f} s CPU, "
                                        f"{step.runnable_seconds:.3f} s waiting for a core)  {where} "
                                        f"[{step.phase}]{note}  {step.handle[:160]}")
        if len(_slow_seen) > 25:
            terminalreporter.write_line(f"... and {len(_slow_seen) - 25} more")
    if _session_leaks:
        terminalreporter.section("threads of session-scoped fixtures still running at the end")
        for line in _session_leaks:
            terminalreporter.write_line(line)
