"""The embedded default model split over two nodes answers like the single-node (llama.cpp) path."""

from __future__ import annotations

import pytest

from node.models.gguf_meta import read_header
from node.resources import default_model_path
from tests.pipeline.swarm import chat, run, wait_for_route, wait_peers
from tests.support.processes import NodeProcess

pytestmark = [pytest.mark.llama, pytest.mark.slow]

QUESTIONS = ["What does os.path.join do?", "How do I use json.dumps?", "What does time.sleep do?"]


@pytest.mark.skipif(not default_model_path().exists(), reason="the embedded default model is not in this checkout")
def test_two_node_split_matches_single_node(tmp_path):
    model = default_model_path()
    n_layers = read_header(model).n_layers
    half = n_layers // 2
    single = NodeProcess(tmp_path / "single", args=["--no-mdns", "--n-threads", "1"])
    common = ["--model", str(model), "--no-default-model", "--no-mdns", "--n-threads", "1", "--slice-dtype", "f32",
              "--activation-bits", "32"]
    a = NodeProcess(tmp_path / "a", args=[*common, "--layers", f"0-{half - 1}"])
    b = NodeProcess(tmp_path / "b", args=[*common, "--layers", f"{half}-{n_layers - 1}",
                                          "--bootstrap", f"127.0.0.1:{a.peer_port}"])
    procs = [single, a, b]
    try:
        async def go():
            for p in procs:
                await p.async_wait_ready()
            await wait_peers(a, 1)
            split_id = await wait_for_route(a, model.stem)
            single_id = await wait_for_route(single, model.stem)
            assert split_id == single_id  # the same file: the same content-hash id on every node
            for q in QUESTIONS:
                s_status, s_headers, s_text = await chat(single, single_id, q, max_tokens=80)
                d_status, d_headers, d_text = await chat(a, split_id, q, max_tokens=80)
                assert s_status == d_status == 200
                assert s_headers["x-swarm-route"] == "local"
                assert d_headers["x-swarm-route"] == "distributed" and d_headers["x-swarm-segments"] == "2"
                assert d_text == s_text, q
                assert s_text.strip()
        run(go())
    finally:
        for p in procs:
            p.terminate()
