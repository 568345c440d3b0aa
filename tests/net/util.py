"""Helpers for the peer-network tests: loopback addresses, bare peer processes (tests.net.peer_proc).

Waiting is tests.support.waiting; a whole node in a subprocess is tests.support.processes.NodeProcess.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from node.net import FrameType
from tests.support.processes import REPO, hermetic_env
from tests.support.swarm import join_test_swarm
from tests.support.waiting import wait_until, wait_until_sync


def addr(manager) -> str:
    """A PeerManager's dialable loopback address."""
    return f"127.0.0.1:{manager.listen_port}"


def linked(a, b) -> bool:
    """Two PeerManagers each hold a live link to the other."""
    return a.link(b.node_id) is not None and b.link(a.node_id) is not None


async def linked_pair(make_manager):
    """Two PeerManagers, (lower id, higher id), one link between them that the higher id dialled."""
    low, high = sorted([await make_manager(), await make_manager()], key=lambda m: m.node_id)
    await high.async_connect(addr(low))
    await wait_until(lambda: linked(low, high), what="the two linked")
    return low, high


def hold_work(manager) -> tuple[asyncio.Event, asyncio.Event]:
    """Serve WORK on a PeerManager by echoing the payload once released: returns (arrived, release),
    set when a request reaches the handler / set by the test to let the replies go."""
    arrived, release = asyncio.Event(), asyncio.Event()

    async def held(link, frame):
        arrived.set()
        await release.wait()
        return frame.reply(FrameType.RESULT, {}, frame.payload)
    manager.register_handler(FrameType.WORK, held)
    return arrived, release


class PeerProc:
    """`python -m tests.net.peer_proc` in a subprocess (optionally inside a network namespace)."""

    def __init__(self, workdir: Path, name: str, args: list[str], netns: str | None = None):
        self.workdir = workdir
        self.name = name
        self.data_dir = workdir / name
        self.data_dir.mkdir(parents=True, exist_ok=True)
        join_test_swarm(self.data_dir)
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
        env = hermetic_env({"PYTHONPATH": str(REPO)})
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
