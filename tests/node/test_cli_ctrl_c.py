"""Ctrl-C in `swarmllm chat` while the reply streams (the README's "stream one reply"; the default
model rambles at temperature 1, so people stop it): the command ends with exit 130 and no
KeyboardInterrupt traceback, as `swarmllm run` and `swarmllm download` do."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from node.inference.synth import SynthSpec
from tests.support.nodes import tiny_model
from tests.support.processes import REPO, NodeProcess, hermetic_env
from tests.support.waiting import wait_until_sync

pytestmark = [pytest.mark.llama, pytest.mark.slow]

SLOW = SynthSpec(n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab=512, n_ctx=4096, name="slow")


def test_ctrl_c_while_chat_streams(tmp_path):
    model = tiny_model(tmp_path, SLOW, "slow.gguf")
    node = NodeProcess(tmp_path / "data", args=["--model", str(model), "--no-default-model", "--no-mdns",
                                                 "--n-threads", "1"])
    try:
        node.wait_ready()
        out_path, err_path = tmp_path / "chat.out", tmp_path / "chat.err"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            chat = subprocess.Popen(
                [sys.executable, "-m", "node.cli", "chat", "-p", str(node.port), "--data-dir", str(node.data_dir),
                 "--max-tokens", "3000", "--temperature", "1", "tell me"], cwd=REPO, env=hermetic_env(),
                stdout=out, stderr=err, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            wait_until_sync(lambda: out_path.stat().st_size > 0, 60, what="the first streamed text")
            chat.send_signal(signal.SIGINT)
            rc = chat.wait(30)
        finally:
            if chat.poll() is None:
                chat.kill()
        stderr = err_path.read_text()
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
        assert rc == 130, (rc, stderr)
    finally:
        node.terminate()
