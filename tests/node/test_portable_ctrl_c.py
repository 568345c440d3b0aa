"""Ctrl-C in `swarmllm run` where the event loop has no signal handlers: Windows' default loop
(ProactorEventLoop) raises NotImplementedError from `add_signal_handler`. The node is run with
that loop's behaviour (a sitecustomize makes `add_signal_handler` raise as the Proactor does;
Ctrl-C reaches Python as SIGINT there as here) and must stop as it does on Linux: while it
starts (its layers still fetching), and once serving, with exit 0 and `node stopped`."""

from __future__ import annotations

import signal
import time

from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.processes import REPO, NodeProcess
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until_sync

PROACTOR_LIKE = '''
import asyncio.unix_events

def _add_signal_handler(self, sig, callback, *args):
    raise NotImplementedError  # as asyncio.ProactorEventLoop (Windows' default loop)

asyncio.unix_events._UnixSelectorEventLoop.add_signal_handler = _add_signal_handler
'''


def _windows_like_env(tmp_path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PROACTOR_LIKE)
    return {"PYTHONPATH": f"{site}:{REPO}"}


def test_ctrl_c_while_layers_are_fetched_at_start_stops_the_node(tmp_path, model):  # noqa: F811
    with ThreadedOrigin(model.read_bytes()) as origin:
        origin.stall_after = 600_000  # past the header: the layer fetch hangs on a slow origin
        node = NodeProcess(tmp_path / "n", args=["--model", origin.url, "--no-default-model", "--layers", "2-5",
                                                "--slice-dtype", "f32", "--no-mdns", "--n-threads", "1"],
                           env=_windows_like_env(tmp_path))
        try:
            wait_until_sync(lambda: origin.sent >= origin.stall_after, 60.0, 0.05, "the layer fetch to stall")
            wait_until_sync(lambda: node.healthy(), 30.0, 0.1, "the API (it starts before the slices load)")
            began = time.monotonic()
            rc = node.terminate(signal.SIGINT, timeout_s=20.0)
            out = node.output()
            assert rc == 0 and time.monotonic() - began < 20.0, out[-3000:]
            assert "node stopped" in out, out[-3000:]
        finally:
            origin.release.set()
            node.kill()


def test_ctrl_c_while_serving_stops_the_node_as_on_linux(tmp_path):
    node = NodeProcess(tmp_path / "n", args=["--no-mdns", "--n-threads", "1"], env=_windows_like_env(tmp_path))
    try:
        node.wait_ready()
        rc = node.terminate(signal.SIGINT, timeout_s=30.0)
        out = node.output()
        assert rc == 0 and "node stopped" in out and "Traceback" not in out, out[-3000:]
    finally:
        node.kill()
