"""A served model's file cut or rewritten in place while the node runs (a `cp` of a new download
over it, a `truncate`): llama.cpp maps the file, and reading a page past the new end killed the
whole `swarmllm run` process with SIGBUS on the next request (found by hand, 2026-12-06: "Bus
error", exit 135, nothing in the log). Now the request is refused with a 503 naming the file and
what to do, and the node keeps running; a file deleted (its inode stays mapped) goes on serving."""

from __future__ import annotations

import os
import shutil

import openai
import pytest

from tests.support.nodes import tiny_model
from tests.support.processes import NodeProcess


def _ask(node: NodeProcess, model: str):
    client = openai.OpenAI(base_url=f"{node.base}/v1", api_key=node.api_key, max_retries=0, timeout=60)
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3)


@pytest.fixture
def served(tmp_path):
    model = tmp_path / "m.gguf"
    shutil.copy(tiny_model(tmp_path), model)
    node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns", "--n-threads", "1",
                                                "--model", str(model)])
    try:
        node.wait_ready()
        yield node, model
    finally:
        node.terminate()


def test_a_model_file_cut_while_loaded_is_refused_not_a_crash(served):
    node, model = served
    model_id = _ask(node, "m").model
    os.truncate(model, model.stat().st_size // 3)
    with pytest.raises(openai.APIStatusError) as refused:
        _ask(node, model_id)
    assert refused.value.status_code == 503, refused.value
    message = str(refused.value)
    assert str(model) in message and "changed on disk" in message and "load the model again" in message, message
    assert node.alive() and node.healthy(), node.output()[-3000:]
    assert node.node_log().count("DIAG: model file changed while loaded") == 1, node.node_log()[-3000:]


def test_a_model_file_deleted_while_loaded_still_serves(served):
    node, model = served
    _ask(node, "m")
    model.unlink()
    assert _ask(node, "m").choices[0].message is not None
    assert node.alive(), node.output()[-3000:]
