"""`swarmllm run --model X` where X is not a GGUF file: a directory (the folder the model came in), a
name (as other tools take: `--model llama-3.2-1b`), a typo. The node skips it with a warning; the
warning must say what X is and what --model takes. It said "model file not found: fake" for a
directory that exists, and named only the last part of the path (not where it looked)."""

from __future__ import annotations

from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until_sync


def _skip_line(node, name):
    def find():
        return next((line for line in node.output().splitlines() if f"skipping model {name}" in line), None)
    return wait_until_sync(find, 60, what=f"the skipping line for {name}")


def test_model_mistakes_are_named(tmp_path):
    folder = tmp_path / "llama-folder"
    folder.mkdir()
    node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns", "--model", str(folder),
                                                 "--model", "llama-3.2-1b"])
    try:
        node.wait_ready(path="/health")
        line = _skip_line(node, "llama-folder")
        assert "directory" in line and "not found" not in line, line
        line = _skip_line(node, "llama-3.2-1b")
        assert "not found" in line and "path" in line and ".gguf" in line, line
    finally:
        node.terminate()
