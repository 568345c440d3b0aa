"""SIGTERM or Ctrl-C while `swarmllm run --model URL --layers A-B` still fetches its layers: the
signal was only noted (the node was "starting"), the fetch went on, and the process stopped once
every layer had arrived — hours on a slow origin; a second Ctrl-C killed it at once (found by
driving a real node against a 1 KB/s origin, 2026-12-06). The first signal now stops the start,
and what arrived is kept for the next run."""

from __future__ import annotations

import json
import signal
import time

from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.processes import NodeProcess
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until_sync


def test_a_stop_signal_while_layers_are_fetched_at_start_stops_the_node(tmp_path, model):  # noqa: F811
    with ThreadedOrigin(model.read_bytes()) as origin:
        origin.stall_after = 600_000  # past the header: the layer fetch hangs on a slow origin
        node = NodeProcess(tmp_path / "n", args=["--model", origin.url, "--no-default-model", "--layers", "2-5",
                                                "--slice-dtype", "f32", "--no-mdns", "--n-threads", "1"])
        try:
            wait_until_sync(lambda: origin.sent >= origin.stall_after, 60.0, 0.05, "the layer fetch to stall")
            wait_until_sync(lambda: node.healthy(), 30.0, 0.1, "the API (it starts before the slices load)")
            # meanwhile the report says how far the layers have come, not only "loading"
            status, report = node.get("/api/admin/diagnostics")
            assert status == 200
            line = next(x for x in report.decode().splitlines() if "engine=torch-slice" in x)
            assert "state=loading" in line and " fetched_mb=" in line, line
            began = time.monotonic()
            rc = node.terminate(signal.SIGTERM, timeout_s=20.0)
            assert rc == 0 and time.monotonic() - began < 20.0, node.output()[-3000:]
            [partial] = (tmp_path / "n" / "models").glob("*.partial")
            state = json.loads((partial / "fetch.json").read_text())
            assert sum(state["have"].values()) > 0  # what arrived is the next run's resume point
        finally:
            origin.release.set()
            node.kill()
