"""A `--serve auto` node restarted with its layers on disk while its model's origin accepts
connections and never answers (a hung server, a proxy holding the request) serves what it holds
within seconds. Its start probed the origin first and waited the download read timeout (60 s):
no API, no peer link, none of its layers for the swarm for a minute (a churn test, 2026-12-06:
/health answered 62 s after the restart)."""

from __future__ import annotations

import socket
import time

import pytest

from tests.pipeline.swarm import run
from tests.pipeline.test_autoserve import auto_model, held
from tests.support.processes import NodeProcess
from tests.support.rangeserver import ThreadedOrigin

pytestmark = [pytest.mark.slow]


def test_a_restart_with_layers_held_is_not_held_up_by_an_origin_that_hangs(tmp_path):
    model = auto_model(tmp_path)
    origin = ThreadedOrigin(model.read_bytes(), "auto8.gguf").__enter__()
    port = origin.server.server_address[1]
    args = ["--model", origin.url, "--no-default-model", "--serve", "auto", "--slice-budget-mb", "20",
            "--slice-dtype", "f32", "--slice-kv-dtype", "f32", "--no-mdns", "--n-threads", "1"]
    node = NodeProcess(tmp_path / "n", args=args)
    hung = None
    try:
        node.wait_ready(60)
        assert run(held([node]))["n"] == [(0, 8)]
        node.terminate()
        origin.close()
        hung = socket.socket()  # the origin's port accepts (the kernel's backlog) and never answers
        hung.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hung.bind(("127.0.0.1", port))
        hung.listen(16)
        began = time.monotonic()
        node.start()
        node.wait_ready(45)
        assert time.monotonic() - began < 30, f"ready only after {time.monotonic() - began:.0f} s"
        assert "model origin unreachable, serving the layers held" in node.node_log()
        assert run(held([node]))["n"] == [(0, 8)]
    finally:
        node.terminate()
        origin.close()
        if hung is not None:
            hung.close()
