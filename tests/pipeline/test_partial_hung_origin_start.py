"""A node whose `--model URL` origin accepts the request and does not answer, with nothing of the
model held here, comes up at once: the API answers, /health/ready says 503 and what it waits on,
and the model is served once the origin answers. Its start probed the origin first and waited the
download read timeout (60 s): the API on its port refused for a minute, the GUI said "starting"
(2026-12-06)."""

from __future__ import annotations

import json

import pytest

from tests.pipeline.swarm import run
from tests.pipeline.test_autoserve import auto_model, held
from tests.support.processes import NodeProcess
from tests.support.rangeserver import ThreadedOrigin

pytestmark = [pytest.mark.slow]

COMMON = ["--no-default-model", "--slice-dtype", "f32", "--slice-kv-dtype", "f32", "--no-mdns", "--n-threads", "1"]


@pytest.mark.parametrize("serve", [["--serve", "auto", "--slice-budget-mb", "20"], ["--layers", "0-7"]],
                         ids=["auto", "layers"])
def test_a_start_is_not_held_up_by_an_origin_that_does_not_answer(tmp_path, serve):
    model = auto_model(tmp_path)
    with ThreadedOrigin(model.read_bytes(), "auto8.gguf") as origin:
        origin.hold_answers = True
        node = NodeProcess(tmp_path / "n", args=["--model", origin.url, *serve, *COMMON])
        try:
            node.wait_ready(25, path="/health")  # before the fix: 60 s and more
            status, body = node.get("/health/ready")
            assert status == 503
            assert any("auto8.gguf" in w for w in json.loads(body)["waiting_on"]), body
            assert "model origin slow to answer at start, opening it in the background" in node.node_log()
            status, report = node.get("/api/admin/diagnostics")
            assert status == 200 and b"waiting: model" in report, report[-2000:]

            origin.release.set()  # the origin answers: the model is opened and its layers served
            node.wait_ready(90)
            assert run(held([node]))["n"] == [(0, 8)]
            status, body = node.get("/health/ready")
            assert status == 200 and "waiting_on" not in json.loads(body), body
        finally:
            node.terminate()
