"""`swarmllm run --model X` where X cannot be served: a directory (the folder the model came in), a
name (as other tools take: `--model llama-3.2-1b`), a typo, a truncated copy. The node said "model
file not found: fake" for a directory that exists and named only the last part of the path; then it
only warned among its start-up lines and served the default model (or nothing). Now `run` stops
before starting, exit 2, with one line saying what X is and what --model takes."""

from __future__ import annotations

import subprocess
import sys

from node.inference.synth import write_gguf
from tests.pipeline.swarm import SPLIT
from tests.support.processes import REPO, hermetic_env


def _run(tmp_path, model: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", "run", "-p", "0", "--data-dir", str(tmp_path / "data"),
                           "--no-mdns", "--model", model], cwd=REPO, env=hermetic_env(), capture_output=True,
                          text=True, timeout=120)


def test_model_mistakes_stop_run_saying_what_is_wrong(tmp_path):
    folder = tmp_path / "llama-folder"
    folder.mkdir()
    out = _run(tmp_path, str(folder))
    assert out.returncode == 2, out.stderr[-2000:]
    assert "cannot serve --model" in out.stderr and "is a directory" in out.stderr and "not found" not in out.stderr
    assert "node started" not in out.stderr

    out = _run(tmp_path, "llama-3.2-1b")
    assert out.returncode == 2
    assert "not found" in out.stderr and str(REPO / "llama-3.2-1b") in out.stderr and ".gguf" in out.stderr

    whole = write_gguf(tmp_path / "split6.gguf", SPLIT)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-1000])
    out = _run(tmp_path, str(cut))
    assert out.returncode == 2 and "cut.gguf is truncated" in out.stderr
