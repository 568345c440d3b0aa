"""A node always stops: a stop step that hangs is logged with what it waits on and left behind,
a task that ignores its cancellation ends the process after a bound, a second SIGTERM exits now."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import subprocess
import sys
import textwrap
import time

import openai
import pytest

from node import const
from node.inference.llama_engine import LlamaEngine
from node.stopping import async_bounded, await_chain
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.ports import free_port, port_is_free
from tests.support.processes import REPO, hermetic_env
from tests.support.swarm import join_test_swarm
from tests.support.waiting import wait_until, wait_until_sync


async def _stubborn(entered: asyncio.Event | None = None, ignore: int = 1) -> None:
    """Ignores its first `ignore` cancellations (the bug class a stop must survive)."""
    if entered is not None:
        entered.set()
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if ignore <= 0:
                raise
            ignore -= 1


async def _outer(fut: asyncio.Future) -> None:
    await _inner(fut)


async def _inner(fut: asyncio.Future) -> None:
    await fut


async def test_await_chain_names_each_coroutine_and_the_future_it_waits_on():
    fut = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(_outer(fut), name="chained")
    await asyncio.sleep(0)
    chain = await_chain(task)
    assert chain.index(":_outer:") < chain.index(":_inner:"), chain
    assert re.search(r" → <Future pending cb=\[Task\.task_wakeup\(\)\][^→]*>$", chain), chain
    fut.set_result(None)
    await task
    assert await_chain(task) == "done"


async def test_a_step_that_ends_or_fails_counts_as_ended(caplog):
    async def fails() -> None:
        raise RuntimeError("broken close")

    assert await async_bounded("quick", asyncio.sleep(0), 1.0)
    with caplog.at_level(logging.ERROR, logger="node.stopping"):
        assert await async_bounded("failing", fails(), 1.0)
    assert "DIAG: stop step failed step=failing" in caplog.text
    assert "broken close" in caplog.text


async def test_a_step_that_ignores_its_cancellation_is_logged_and_left_behind(caplog):
    entered = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.WARNING, logger="node.stopping"):
        step = asyncio.ensure_future(_stubborn(entered, ignore=1))
        assert not await async_bounded("stuck", step, 0.3)
    assert loop.time() - started < 5.0  # bounded: not held by the step
    assert entered.is_set()
    assert "DIAG: stop step did not end step=stuck waited_s=0.3" in caplog.text
    line = next(r.getMessage() for r in caplog.records if "did not end" in r.getMessage())
    assert ":_stubborn:" in line, line  # names where it waits
    assert "DIAG: pending task" in caplog.text
    await asyncio.sleep(0)  # the step took its (ignored) cancellation
    assert not step.done()
    step.cancel()  # the second one it obeys
    with caplog.at_level(logging.WARNING, logger="node.stopping"):
        with pytest.raises(asyncio.CancelledError):
            await step
        await wait_until(lambda: "DIAG: stop step ended late step=stuck outcome=cancelled" in caplog.text, 5,
                         what="the late end logged")


async def test_a_node_stops_when_one_of_its_steps_hangs(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(const, "NODE_STOP_STEP_S", 0.5)
    stuck: list[asyncio.Task] = []

    async def stubborn_stop() -> None:
        stuck.append(asyncio.current_task())
        await _stubborn(ignore=1)

    with caplog.at_level(logging.INFO):
        async with running_node(node_config(tmp_path / "data")) as node:
            port, peer_port = node.api.port, node.peers.listen_port
            monkeypatch.setattr(node.autoserve, "async_stop", stubborn_stop)
        # running_node's exit ran node.stop(): it came back, and the steps after the stuck one ran
    assert "DIAG: stop step did not end step=autoserve" in caplog.text
    assert "DIAG: node stop left steps behind" in caplog.text and "stuck=autoserve" in caplog.text
    assert "DIAG: node stopped" in caplog.text
    assert "DIAG: peer network stopped" in caplog.text
    assert port_is_free(port) and port_is_free(peer_port)
    assert stuck and not stuck[0].done()
    stuck[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck[0]


async def test_stopping_lets_requests_finish_then_ends_the_rest_with_an_error_event(tmp_path, monkeypatch, caplog):
    """SIGTERM cut a stream mid-reply with no error event and no [DONE] (the client could not tell
    it from a lost network; the log blamed the client: "client went away"). Now stop() first gives
    requests under way NODE_DRAIN_S, then ends the rest with a 503 error event; a request that
    comes meanwhile gets a 503."""
    monkeypatch.setattr(const, "NODE_DRAIN_S", 1.0)
    real_submit = LlamaEngine.submit

    def paced_submit(self, job, channel, is_eog, vocab=None):  # 30 ms a token: 190 tokens outlast the drain
        return real_submit(self, job, channel, lambda token: time.sleep(0.03) or is_eog(token), vocab)

    monkeypatch.setattr(LlamaEngine, "submit", paced_submit)
    model = tiny_model(tmp_path)
    with caplog.at_level(logging.INFO):
        async with running_node(node_config(tmp_path / "data", model)) as node:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key=node.api_key,
                                        max_retries=0)
            served = node.models.all()[0]
            model_id, tok = served.id, served.tokenizer
            never_end = {str(i): -100 for i in range(tok.n_vocab) if tok.is_eog(i)}  # the random model's EOG
            stream = await client.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "go"}], max_tokens=190, temperature=0,
                stream=True, logit_bias=never_end)
            await stream.__anext__()
            short = asyncio.ensure_future(client.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "go"}], max_tokens=3, temperature=0))
            await wait_until(lambda: node.traces.in_flight == 2, 10, 0.01, "both requests under way")
            stopping = asyncio.ensure_future(node.stop())
            await wait_until(lambda: node._stopping, 5, 0.01, "the stop to begin")
            with pytest.raises(openai.APIStatusError) as late:  # a request during the drain
                await client.chat.completions.create(model=model_id, max_tokens=2,
                                                     messages=[{"role": "user", "content": "x"}])
            assert late.value.status_code == 503 and late.value.body["code"] == "node_stopping"
            assert not node.is_ready()  # /health/ready: a balancer sends it nothing more
            with pytest.raises(openai.APIStatusError) as late:
                await client.embeddings.create(model=model_id, input="x")
            assert late.value.status_code == 503
            assert (await short).choices[0].finish_reason == "length"  # finished within the drain
            with pytest.raises(openai.APIError, match="shutting down"):
                async for _chunk in stream:
                    pass
            await stopping
    traces = list(node.traces.recent)
    cut = [t for t in traces if t.error_type == "ShuttingDown"]
    assert len(cut) == 3 and 0 < max(t.completion_tokens for t in cut) < 190  # the stream, the late two  # the long stream and the late request
    assert "DIAG: stopping with requests under way, ending them count=1" in caplog.text
    assert "client went away" not in caplog.text and node.traces.in_flight == 0
    # a planned stop is no failure: node.log had an ERROR line per stream the drain ended
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# --- the process (`swarmllm run`) ---

_PATCHED_RUN = """
import asyncio, sys
from node.node import Node

async def stubborn():
    print("STUBBORN ENTERED", flush=True)
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass

{patch}

from node.cli import main
sys.exit(main(["run", "-p", "{port}", "--data-dir", "{data}", "--no-default-model", "--no-mdns"]))
"""


def _run_patched(tmp_path, patch: str):
    data = tmp_path / "data"
    join_test_swarm(data)
    port = free_port()
    script = _PATCHED_RUN.format(patch=textwrap.dedent(patch), port=port, data=data)
    out_path = tmp_path / "out.log"
    out = open(out_path, "wb")  # noqa: SIM115 (the child holds its own copy)
    try:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=hermetic_env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()

    def output() -> str:
        return out_path.read_text(errors="replace")

    return proc, output


def _stop_proc(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.mark.slow
def test_a_second_sigterm_while_stopping_exits_now(tmp_path):
    proc, output = _run_patched(tmp_path, """
        async def stuck_stop(self):
            await stubborn()
        Node.stop = stuck_stop
    """)
    try:
        wait_until_sync(lambda: "serving at" in output() or proc.poll() is not None, 60, what="node up")
        assert proc.poll() is None, output()
        proc.send_signal(signal.SIGTERM)
        wait_until_sync(lambda: "STUBBORN ENTERED" in output() or proc.poll() is not None, 20,
                        what="the stop to begin")
        assert proc.poll() is None, output()  # held by the stop, as the patch means it to be
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 1, output()
        assert "DIAG: SIGTERM while stopping: exiting now" in output()
    finally:
        _stop_proc(proc)


@pytest.mark.slow
def test_a_task_that_ignores_its_cancellation_does_not_keep_the_process(tmp_path):
    proc, output = _run_patched(tmp_path, """
        _start = Node.start
        async def start_with_a_stubborn_task(self):
            await _start(self)
            self.stubborn_task = asyncio.get_running_loop().create_task(stubborn(), name="stubborn-task")
        Node.start = start_with_a_stubborn_task
    """)
    text = _sigterm_expecting_exit_1(proc, output)
    assert "DIAG: pending task" in text and "task=stubborn-task" in text and ":stubborn:" in text, text[-3000:]
    assert "DIAG: exiting with tasks that ignored their cancellation count=1" in text


@pytest.mark.slow
def test_an_executor_thread_still_busy_does_not_keep_the_process(tmp_path):
    proc, output = _run_patched(tmp_path, """
        import time
        def blocking_work():
            while True:
                time.sleep(0.05)
        _start = Node.start
        async def start_with_a_busy_thread(self):
            await _start(self)
            self.busy = asyncio.get_running_loop().create_task(asyncio.to_thread(blocking_work))
            print("STUBBORN ENTERED", flush=True)
        Node.start = start_with_a_busy_thread
    """)
    text = _sigterm_expecting_exit_1(proc, output)
    assert "DIAG: busy thread" in text and "__main__:blocking_work" in text, text[-3000:]
    assert "DIAG: exiting with executor threads still busy" in text


def _sigterm_expecting_exit_1(proc, output) -> str:
    """Once the patched node says STUBBORN ENTERED: SIGTERM; it must stop and exit 1. Its output."""
    try:
        wait_until_sync(lambda: "STUBBORN ENTERED" in output() or proc.poll() is not None, 60, what="node up")
        assert proc.poll() is None, output()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 1, output()
        text = output()
        assert "DIAG: node stopped" in text
        return text
    finally:
        _stop_proc(proc)


async def test_a_node_stops_cleanly_with_nothing_left_behind(tmp_path, caplog):
    """The bound changes nothing for a node whose steps all end: no step is reported stuck."""
    with caplog.at_level(logging.INFO):
        async with running_node(node_config(tmp_path / "data")):
            pass
    await wait_until(lambda: "DIAG: node stopped" in caplog.text, 5, what="stopped line")
    assert "did not end" not in caplog.text and "left steps behind" not in caplog.text
