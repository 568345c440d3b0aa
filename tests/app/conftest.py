"""Fixtures for the desktop app: a qasync loop over pytest-qt's QApplication, tiny GGUF models,
and a running TrayApp hosting a real node on 127.0.0.1 (own data dir, free port).

Tests are plain functions that drive one coroutine on the qasync loop with `run(...)`; inside it
they wait for conditions with deadlines (`tests.support.waiting.wait_until`), never by sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
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
