"""Helpers for the peer-network tests: polling, in-process managers, peer processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def addr(manager) -> str:
    """A PeerManager's dialable loopback address."""
    return f"127.0.0.1:{manager.listen_port}"


async def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition"):
    """Poll predicate() (sync or async) until truthy; fail naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


def wait_until_sync(predicate, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition"):
    """Blocking variant of wait_until (for hypothesis tests and plain threads)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


class PeerProc:
    """`python -m tests.net.peer_proc` in a subprocess (optionally inside a network namespace)."""

    def __init__(self, workdir: Path, name: str, args: list[str], netns: str | None = None):
        self.workdir = workdir
        self.name = name
        self.data_dir = workdir / name
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.status_path = workdir / f"{name}.status.json"
        self.log_path = workdir / f"{name}.log"
        self.args = args
        self.netns = netns
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        """(Re)start the process with the same data dir and arguments."""
        if self.status_path.exists():
            self.status_path.unlink()
        cmd = [sys.executable, "-m", "tests.net.peer_proc", "--data-dir", str(self.data_dir),
               "--status", str(self.status_path), *self.args]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWARMLLM_")}
        env["PYTHONPATH"] = str(REPO)
        out = open(self.log_path, "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        out.close()

    def status(self) -> dict | None:
        """The last status the process wrote (None before the first)."""
        try:
            return json.loads(self.status_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def peer(self, node_id: str) -> dict | None:
        """The process's view of one peer."""
        status = self.status() or {}
        return next((p for p in status.get("peers", []) if p["node_id"] == node_id), None)

    async def async_ready(self, timeout_s: float = 60.0) -> dict:
        """Wait for the first status (listener up)."""
        def ready():
            if not self.alive():
                raise AssertionError(f"{self.name} exited early (rc={self.proc.returncode}):\n{self.output()}")
            return self.status()
        return await wait_until(ready, timeout_s, 0.1, f"{self.name} to start")

    def ready(self, timeout_s: float = 60.0) -> dict:
        """Blocking wait for the first status."""
        def ready():
            if not self.alive():
                raise AssertionError(f"{self.name} exited early (rc={self.proc.returncode}):\n{self.output()}")
            return self.status()
        return wait_until_sync(ready, timeout_s, 0.1, f"{self.name} to start")

    def output(self) -> str:
        """Everything the process logged."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def signal(self, sig: int) -> None:
        """Send a signal to the process."""
        if self.alive():
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(10)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (SIGCONT first, in case it is stopped), then SIGKILL if it lingers."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()


def free_port_pair() -> int:
    """A port free on 127.0.0.1 whose +10 (the default peer port) is free too."""
    import socket

    for _ in range(100):
        with socket.socket() as s1:
            s1.bind(("127.0.0.1", 0))
            port = s1.getsockname()[1]
        if port + 10 > 65535:
            continue
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + 10))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


class RealNode:
    """`swarmllm run` (python -m node.cli run) as a subprocess: the real node, no model."""

    def __init__(self, workdir: Path, name: str, args: list[str], port: int | None = None):
        self.name = name
        self.data_dir = workdir / name
        self.port = port or free_port_pair()
        self.peer_port = self.port + 10
        self.log_path = workdir / f"{name}.node.log"
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        """(Re)start with the same data dir, ports and arguments."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWARMLLM_")}
        out = open(self.log_path, "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli", "run", "-p", str(self.port), "--data-dir", str(self.data_dir),
             "--no-default-model", "--no-mdns", "-v", *self.args],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        """GET with the node's API key; (status, body)."""
        import urllib.error
        import urllib.request

        key = (self.data_dir / "api_key").read_text().strip()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def healthy(self) -> bool:
        """GET /health answers 200."""
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited (rc={self.proc.returncode}):\n{self.output()[-4000:]}")
        try:
            return self.get("/health", 2)[0] == 200
        except OSError:
            return False

    def peers(self) -> list[dict]:
        """GET /api/admin/peers."""
        status, body = self.get("/api/admin/peers")
        assert status == 200, body
        return json.loads(body)["peers"]

    def peer(self, node_id: str) -> dict | None:
        """One row of the peer table."""
        return next((p for p in self.peers() if p["node_id"] == node_id), None)

    def output(self) -> str:
        """The node's log."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
