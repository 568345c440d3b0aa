"""torch is imported only where the node needs it (a slice to host, the slice engine), never at
start (2026-12-07: every start imported it, 1.5 s and ~180 MB, for a node serving through
llama.cpp or only using the swarm). A slice-hosting node loading it: test_default_model_split."""

from __future__ import annotations

import json
import subprocess
import sys

import openai
import pytest

from node.resources import default_model_path
from tests.support.nodes import tiny_model
from tests.support.processes import REPO, NodeProcess, hermetic_env

IMPORTS = ("node.node", "node.cli", "node.api.server", "node.diagnostics", "node.inference.devices")


def test_importing_the_node_leaves_torch_out():
    code = (f"import json, sys\nimport {', '.join(IMPORTS)}\n"
            "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=hermetic_env(), capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_torch_imported_first_for_sizing_is_kept_out_of_the_collectors_full_passes(tmp_path):
    """Review r73: only a slice load froze torch's objects (`gc.freeze`, as the start freezes its own);
    a node that sized a model first (an auto-serve budget, the app's layer slider) or probed a GPU
    kept ~140,000 of them in reach of every full GC pass, 150 ms of the loop each."""
    path = tiny_model(tmp_path)
    code = ("import gc\nimport node.node\ngc.freeze()\nbefore = gc.get_freeze_count()\n"
            "from node.inference.pipeline.coverage import slice_sizes\n"
            f"slice_sizes({str(path)!r}, 'auto')\n"
            "print(gc.get_freeze_count() - before)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=hermetic_env(), capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert int(out.strip().splitlines()[-1]) > 50_000, out


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.skipif(not default_model_path().exists(), reason="the embedded default model is not in this checkout")
def test_node_serving_the_default_model_never_loads_torch(tmp_path):
    # (--cpu-only: where a GPU driver is present the start's GPU probe asks torch, review r73)
    node = NodeProcess(tmp_path / "data", args=["--no-mdns", "--n-threads", "1", "--cpu-only"])
    try:
        node.wait_ready()
        client = openai.OpenAI(base_url=f"{node.base}/v1", api_key=node.api_key, max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(model=model, max_tokens=8, temperature=0,
                                               messages=[{"role": "user", "content": "What does os.path.join do?"}])
        assert reply.choices[0].message.content.strip()
        assert not node.torch_mapped()  # started, answered /health and a chat: no libtorch mapped
        status, body = node.get("/api/admin/diagnostics", timeout_s=60)
        assert status == 200, body
        report = body.decode()
        assert "-- this machine --" in report
        assert "int8 kernels: not checked (torch not loaded: this node hosts no slice)" in report
        assert not node.torch_mapped()  # nor after the report
    finally:
        node.terminate()
