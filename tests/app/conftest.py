"""Fixtures for the desktop app: a qasync loop over pytest-qt's QApplication, tiny GGUF models,
and a running TrayApp hosting a real node on 127.0.0.1 (own data dir, free port).

Tests are plain functions that drive one coroutine on the qasync loop with `run(...)`; inside it
they wait for conditions with deadlines (`tests.support.waiting.wait_until`), never by sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest

pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")

from node.inference.synth import SynthSpec, write_gguf  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A 2-layer random-weight llama GGUF (fast to load and run)."""
    path = tmp_path_factory.mktemp("models") / "tiny.gguf"
    write_gguf(path, SynthSpec(n_ctx=2048, name="tiny"))
    return path


@pytest.fixture(scope="session")
def long_model(tmp_path_factory):
    """A larger random-weight GGUF (≈ 26 MB Q8_0) whose greedy completion runs to max_tokens."""
    path = tmp_path_factory.mktemp("models") / "longgen.gguf"
    write_gguf(path, SynthSpec(n_layers=8, hidden=512, n_heads=8, n_kv_heads=4, ffn=1408, n_ctx=2048,
                               qtype="Q8_0", name="longgen"))
    return path


@pytest.fixture(autouse=True)
def _qt_garbage_freed_on_the_gui_thread():
    """After each app test (and its qloop) is torn down, collect its garbage here, on the GUI
    thread. Left to the cyclic GC, a test's Qt objects with timers still registered (a closed
    qasync loop's timer object, a window's QTimer) are destroyed in whichever thread next triggers
    a collection: seen as a generation-0 GC in a QThread of qasync's default executor ("Dummy-2",
    running the next test's PeerManager start-up), Qt's "QObject::killTimer: Timers cannot be
    stopped from another thread", a failed test_peers_model_follows_a_real_peer_manager and a
    segfault in pytest-qt's next processEvents (`pytest -q tests/app tests/inference`, 3 of 3 runs
    with asyncio debug mode on, which allocates more and so moves when GC runs; 0 of 2 with this)."""
    yield
    gc.collect()


@pytest.fixture
def qloop(qapp):
    """qasync's QEventLoop over the test QApplication, set as the current loop."""
    qapp.setQuitOnLastWindowClosed(False)  # closing a window must not end the loop under test
    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


@pytest.fixture
def run(qloop) -> Callable:
    """run(coro): drive a coroutine to completion on the qasync loop (with an overall deadline)."""

    def _run(coro, timeout_s: float = 240.0):
        return qloop.run_until_complete(asyncio.wait_for(coro, timeout_s))

    return _run
