"""`swarmllm chat ... > out.txt` on Windows: stdout redirected there is in the ANSI code page
(cp1252 in Western Europe and the Americas) with strict errors, simulated here with
PYTHONIOENCODING=cp1252 (what Python then uses for a redirected stdout). A reply with a character
outside that code page ended the command with a UnicodeEncodeError traceback and exit 1."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.nodes import tiny_model
from tests.support.processes import REPO, NodeProcess, hermetic_env

pytestmark = pytest.mark.llama


def _chat(node, encoding: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", "chat", "-p", str(node.port), "--data-dir",
                           str(node.data_dir), "--max-tokens", "30", "--temperature", "0", "hi"],
                          cwd=REPO, env=hermetic_env({"PYTHONIOENCODING": encoding}), capture_output=True, timeout=120)


def test_chat_output_redirected_in_a_windows_code_page_does_not_crash(tmp_path):
    node = NodeProcess(tmp_path / "data", args=["--model", str(tiny_model(tmp_path)), "--no-default-model",
                                                "--no-mdns", "--n-threads", "1"])
    try:
        node.wait_ready()
        reply = _chat(node, "utf-8").stdout.decode("utf-8")
        outside = [c for c in reply if not _in_cp1252(c)]
        assert outside, f"the reply must hold a character cp1252 lacks for this test: {reply!r}"
        out = _chat(node, "cp1252")
        assert out.returncode == 0 and b"Traceback" not in out.stderr, out.stderr.decode()[-2000:]
        assert out.stdout.strip(), out
    finally:
        node.terminate()


def _in_cp1252(c: str) -> bool:
    try:
        c.encode("cp1252")
        return True
    except UnicodeEncodeError:
        return False
