"""A swarm of partial models (issue 17's acceptance on loopback): three nodes started with `--model
http://…/auto8.gguf --serve auto` and room for about a third of the layers each, no local file,
fetch only the layers they choose from the origin; a fourth node holding nothing answers with
llama.cpp's greedy text for the whole file; the three together fetched about one copy of the file,
and none of them stores it whole."""

from __future__ import annotations

import pytest

from tests.pipeline.swarm import chat, llama_greedy, run, wait_for_route, wait_peers
from tests.pipeline.test_autoserve import AUTO8, REEVALUATE_S, auto_model, held, per_layer
from tests.pipeline.test_self_organising import empty_node
from tests.support.processes import NodeProcess
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

PROMPT = "which layers are here?"
THIRD_MB = 3  # f32 auto8: three layers with their KV (and the head) fit, four do not


def start_url_node(base, name: str, url: str, bootstrap: list[int]) -> NodeProcess:
    args = ["--model", url, "--no-default-model", "--serve", "auto", "--slice-budget-mb", str(THIRD_MB),
            "--slice-dtype", "f32", "--activation-bits", "32", "--no-mdns", "--n-threads", "1"]
    for port in bootstrap:
        args += ["--bootstrap", f"127.0.0.1:{port}"]
    return NodeProcess(base / name, args=args, env={"SWARMLLM_SERVE_REEVALUATE_S": str(REEVALUATE_S)})


def test_three_nodes_fetch_a_copy_between_them_and_serve_the_whole_model(tmp_path):
    model = auto_model(tmp_path)
    data = model.read_bytes()
    expected = llama_greedy(model, PROMPT, 24)
    with ThreadedOrigin(data, "auto8.gguf") as origin:
        first = start_url_node(tmp_path, "p0", origin.url, [])
        nodes = [first] + [start_url_node(tmp_path, f"p{i}", origin.url, [first.peer_port]) for i in (1, 2)]
        empty = empty_node(tmp_path, "empty", [first.peer_port])
        procs = [*nodes, empty]
        try:
            async def formed():
                for p in nodes:
                    await p.async_wait_ready()

                async def covered():
                    return min(per_layer(await held(nodes))) >= 1
                await wait_until(covered, 60.0, 0.5, "every layer of auto8 to have a holder")
                await wait_peers(empty, 3)
                model_id = await wait_for_route(empty, "auto8")
                return model_id, await chat(empty, model_id, PROMPT, max_tokens=24)
            model_id, (status, headers, text) = run(formed())
            assert status == 200, text
            assert text == expected
            assert headers["x-swarm-route"] == "distributed" and int(headers["x-swarm-segments"]) >= 3
            ranges = run(held(nodes))
            assert all(sum(e - s for s, e in spans) <= 3 for spans in ranges.values()), ranges

            # about one copy of the file crossed the wire to the three (headers and moves included)
            assert origin.sent <= 1.3 * len(data), (origin.sent, len(data), ranges)
            for p in nodes:  # nobody has the file: a partial model holding what it serves
                models_dir = tmp_path / p.name / "models"
                assert not list(models_dir.glob("*.gguf"))
                stored = sum(f.stat().st_size for f in models_dir.rglob("parts/*.bin"))
                assert 0 < stored < 0.6 * len(data), (p.name, stored)
                listed = run(p.async_get_json("/api/admin/models"))["models"]
                partial = [m for m in listed if m.get("partial")]
                assert partial and partial[0]["partial"].startswith("layers ") and f"of {AUTO8.n_layers}" \
                    in partial[0]["partial"], listed
                report = run(p.async_get_text("/api/admin/diagnostics"))
                assert 'partial="layers ' in report
                row = next(ln for ln in report.splitlines() if 'partial="layers ' in ln)
                assert "from=" in row and origin.url not in report  # the host only (redacted unless loopback)

            # with the origin gone, a restarted node serves the layers it holds
            origin.close()
            restarted = nodes[0]
            restarted.terminate()
            restarted.start()
            run(restarted.async_wait_ready())
            assert "model origin unreachable, serving the layers held" in restarted.node_log()
            assert run(held([restarted]))[restarted.name] == ranges[restarted.name]
        finally:
            for p in procs:
                p.terminate()
