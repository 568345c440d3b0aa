"""A node a test starts in its own process (tests/support/processes.py) reads none of the developer's
Hugging Face settings. Until 2026-12-07 `hermetic_env` dropped SWARMLLM_* only: a developer's HF_TOKEN
reached NodeProcess children, whose downloads sent it to the tests' Hub stand-ins, and their
HF_ENDPOINT, HF_HOME or HF_HUB_OFFLINE moved or stopped those downloads, so a test passed or failed by
who ran it. A child that talks to a Hub gets `hub_env`: the test's endpoint, a home under tmp_path,
no token."""

from __future__ import annotations

import json
import subprocess
import sys

import aiohttp

from node.models.download.hub import hf_token
from tests.support.hubserver import HubServer
from tests.support.nodes import tiny_model
from tests.support.processes import NodeProcess, empty_hf_home, hermetic_env, hub_env
from tests.support.waiting import wait_until

DEVELOPERS = {"HF_TOKEN": "hf_developers_own", "HUGGING_FACE_HUB_TOKEN": "hf_developers_older",
              "HF_TOKEN_PATH": "/nonexistent/hf-token", "HF_HUB_OFFLINE": "1",
              "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": "/nonexistent/hf-home"}
SEEN = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('HF_', 'HUGGING_FACE_'))}))"


def test_a_child_sees_the_tests_hub_settings_only(tmp_path, monkeypatch):
    for name, value in DEVELOPERS.items():
        monkeypatch.setenv(name, value)
    env = hermetic_env(hub_env("http://127.0.0.1:13999", tmp_path / "hf-home"))
    out = subprocess.run([sys.executable, "-c", SEEN], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == {"HF_ENDPOINT": "http://127.0.0.1:13999", "HF_HOME": str(tmp_path / "hf-home")}
    out = subprocess.run([sys.executable, "-c", SEEN], env=hermetic_env(), capture_output=True, text=True, timeout=60,
                         check=True)
    assert json.loads(out.stdout) == {"HF_HOME": empty_hf_home()}  # (none: the developer's home's token file)


def test_no_token_file_of_the_developers_is_read_here_or_by_a_child(tmp_path, monkeypatch):
    """With no HF_HOME the node reads ~/.cache/huggingface/token: the tests' process and its children
    have an empty HF_HOME, so a developer logged in with huggingface-cli has no token sent."""
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "token").write_text("hf_developers_file\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_token() is None  # this process (nodes tests run in it)
    child = "from node.models.download.hub import hf_token; print(hf_token())"
    out = subprocess.run([sys.executable, "-c", child], env=hermetic_env({"HOME": str(tmp_path)}), capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "None", out.stdout


async def test_a_child_nodes_download_sends_no_token_of_the_developers(tmp_path, monkeypatch):
    hub = HubServer(tiny_model(tmp_path).read_bytes(), "/org/tiny/resolve/main/tiny.gguf")
    await hub.start()
    for name, value in DEVELOPERS.items():
        monkeypatch.setenv(name, value)
    node = NodeProcess(tmp_path / "data", args=["--no-default-model", "--no-mdns"],
                       env=hub_env(hub.hub, tmp_path / "hf-home"))
    try:
        await node.async_wait_ready(path="/health")
        async with aiohttp.ClientSession(headers=node.auth) as s:
            base = f"{node.base}/api/admin"
            async with s.post(f"{base}/models/download", json={"url": "hf://org/tiny/tiny.gguf"}) as r:
                assert r.status == 202, await r.text()
                job = (await r.json())["download"]

            async def ended() -> bool:
                async with s.get(f"{base}/downloads/{job['id']}") as r:
                    job.update((await r.json())["download"])
                return job["state"] not in ("starting", "downloading", "verifying")
            await wait_until(ended, timeout_s=60, what="the download to end")
        assert job["state"] == "done", (job, node.output()[-3000:])
        assert hub.hub_requests, "the download never asked the test's Hub"
        sent = [r.get("authorization") or r.get("Authorization") for r in hub.hub_requests]
        assert sent == [None] * len(sent), sent  # the developer's HF_TOKEN went to the stand-in
    finally:
        node.terminate()
        await hub.stop()
