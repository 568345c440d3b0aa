"""`swarmllm run` as a real process: node.log summary lines, cancellation, CLI commands, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys

import aiohttp
import pytest

from node.inference.synth import SynthSpec
from tests.support.nodes import tiny_model
from tests.support.ports import free_port, port_is_free
from tests.support.processes import REPO, NodeProcess
from tests.support.sse import SseJson, delta_text
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

# Big enough that a long generation takes seconds on a busy 2-core machine.
SLOW = SynthSpec(n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab=512, n_ctx=4096, name="slow")
SUMMARY_FIELDS = ("request_id=", "route=local", "segments=1", "model=", "nodes=", "queue_ms=", "sched_ms=",
                  "ttft_ms=", "decode_ms=", "total_ms=", "prompt_tokens=", "tokens=", "tok_per_sec=",
                  "tpot_ms=", "outcome=ok")


@pytest.fixture(scope="module")
def node_proc(tmp_path_factory):
    base = tmp_path_factory.mktemp("proc")
    tiny = tiny_model(base)
    slow = tiny_model(base, SLOW, "slow.gguf")
    proc = NodeProcess(base / "data", args=["--model", str(tiny), "--model", str(slow), "--no-default-model",
                                            "--n-threads", "1"])
    proc.wait_ready()
    yield proc
    proc.terminate()


async def _post(proc, path, body, key=True):
    async with aiohttp.ClientSession() as s, s.post(proc.base + path, json=body, headers=proc.auth if key else {}) as r:
        return r.status, await r.text()


def test_one_summary_line_per_request(node_proc):
    async def go():
        before = node_proc.node_log().count("DIAG: request complete")
        ids = []
        for i in range(3):
            status, text = await _post(node_proc, "/v1/chat/completions", {
                "model": "tiny", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4, "temperature": 0})
            assert status == 200, text
            ids.append(json.loads(text)["id"])
        status, _ = await _post(node_proc, "/v1/chat/completions", {
            "model": "missing-model", "messages": [{"role": "user", "content": "x"}]})
        assert status == 404
        await wait_until(lambda: node_proc.node_log().count("DIAG: request complete") >= before + 4, 10, what="log lines")
        lines = [ln for ln in node_proc.node_log().splitlines() if "DIAG: request complete" in ln][before:]
        assert len(lines) == 4
        for line, cid in zip(lines[:3], ids, strict=True):
            for field in SUMMARY_FIELDS:
                assert field in line, (field, line)
            rid = re.search(r"request_id=([0-9a-f-]+)", line).group(1)
            assert rid.replace("-", "") in cid
            assert "tokens=4" in line and "assemblies=" not in line
        assert "outcome=error error_type=ModelNotFound" in lines[3]
        assert "ttft_ms=" not in lines[3]  # never measured: absent, not zero
    asyncio.run(go())


def test_disconnect_mid_stream_cancels_and_frees_model(node_proc):
    async def go():
        body = {"model": "slow", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 3000,
                "stream": True, "temperature": 0}
        received = 0
        async with aiohttp.ClientSession() as s:
            resp = await s.post(node_proc.base + "/v1/chat/completions", json=body, headers=node_proc.auth)
            assert resp.status == 200
            async for event in SseJson(resp):
                received += bool(delta_text(event))  # a chunk carrying text (the role chunk's is empty)
                if received >= 5:
                    break
            resp.close()  # the client walks away mid-stream
        assert received >= 5

        async def freed():
            stats = await node_proc.async_get_json("/api/admin/stats")
            models = (await node_proc.async_get_json("/api/admin/models"))["models"]
            slow = next(m for m in models if m["name"] == "slow")
            return stats["in_flight"]["traces"] == 0 and not slow["busy"]
        await wait_until(freed, 15, 0.1, "the model to be freed after the disconnect")
        await wait_until(lambda: "outcome=cancelled" in node_proc.node_log(), 5, what="cancelled summary line")
        line = [ln for ln in node_proc.node_log().splitlines() if "outcome=cancelled" in ln][-1]
        tokens = int(re.search(r" tokens=(\d+)", line).group(1))
        assert received <= tokens < 3000  # generation stopped long before max_tokens
        status, _ = await _post(node_proc, "/v1/chat/completions", {
            "model": "slow", "messages": [{"role": "user", "content": "again"}], "max_tokens": 2})
        assert status == 200  # and the model serves the next request
    asyncio.run(go())


def _cli(proc, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", *args, "-p", str(proc.port),
                           "--data-dir", str(proc.data_dir)], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_cli_diagnostics_models_chat(node_proc):
    out = _cli(node_proc, "diagnostics")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for section in ("-- this machine --", "-- reachable at --", "-- peers --", "-- recent inference failures --",
                    "-- recent requests --", "-- served for others --", "-- peer serving performance --",
                    "-- models --", "-- recent activity --"):
        assert section in text
    assert node_proc.api_key not in text and str(node_proc.data_dir) not in text
    assert re.search(r"memory bandwidth: (\d+\.\d GB/s \(measured\)|could not be measured)", text)
    assert re.search(r"in_flight: \d+ traces, \d+ pipelines", text)
    # the node tokenizes with llama.cpp, so its extra-buffer policy is decided and reported
    assert re.search(r"llama.cpp extra weight buffers \(repack/AMX\): (on|off \(.+\))", text)
    out = _cli(node_proc, "models")
    assert out.returncode == 0 and "slow-" in out.stdout and "no_gpu" in out.stdout
    out = _cli(node_proc, "chat", "hello", "--model", "tiny", "--max-tokens", "3")
    assert out.returncode == 0, out.stderr


def test_sigterm_frees_port(tmp_path):
    model = tiny_model(tmp_path)
    proc = NodeProcess(tmp_path / "data", args=["--model", str(model), "--no-default-model"])
    proc.wait_ready()
    assert (proc.data_dir / "api_key").stat().st_mode & 0o777 == 0o600
    assert proc.terminate(signal.SIGTERM) == 0
    assert port_is_free(proc.port)  # the API port is free again
    assert "DIAG: node stopped" in proc.node_log()


def test_bad_layers_flag_exits_cleanly(tmp_path):
    model = tiny_model(tmp_path)
    out = subprocess.run([sys.executable, "-m", "node.cli", "run", "-p", str(free_port()), "--data-dir",
                          str(tmp_path / "d"), "--model", str(model), "--no-default-model", "--layers", "0-99",
                          "--no-mdns"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "cannot start the node: --layers 0-99 is outside the model's layers 0-1" in out.stderr
    assert "Traceback" not in out.stderr
