"""`swarmllm run` (python -m node.cli run) as a subprocess: the real node, own data dir and port.

One wrapper for every test that needs a node in its own process (SIGTERM/SIGKILL, the CLI, a
swarm of slices); sync methods for tests without a loop, `async_` ones for tests on a loop.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp

from node import const
from tests.support.ports import free_port
from tests.support.swarm import join_test_swarm
from tests.support.waiting import wait_until, wait_until_sync

REPO = Path(__file__).resolve().parents[2]


# Settings of the developer's that a child must not read: SWARMLLM_* (their data dir, config), and
# Hugging Face's (HF_TOKEN, HF_TOKEN_PATH, HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE, HUGGING_FACE_HUB_TOKEN …)
NOT_INHERITED = ("SWARMLLM_", "HF_", "HUGGING_FACE_")


@functools.cache
def empty_hf_home() -> str:
    """An empty Hugging Face home for the tests' process and children given none: with no HF_HOME the
    node reads huggingface-cli's token file in the developer's home (~/.cache/huggingface/token,
    node/models/download/hub.py `hf_token`). Removed when the test process ends."""
    home = tempfile.mkdtemp(prefix="swarmllm-tests-hf-home-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


def hermetic_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the developer's SWARMLLM_* and Hugging Face settings (an
    empty HF_HOME instead), then `extra`. Until 2026-12-07 the Hugging Face ones reached child nodes:
    a developer's HF_TOKEN was sent to the tests' Hub stand-ins, their HF_ENDPOINT or HF_HUB_OFFLINE
    moved or stopped a download, so a test passed or failed by who ran it. A child that talks to a
    Hub gets `hub_env`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(NOT_INHERITED)}
    env["HF_HOME"] = empty_hf_home()
    env.update(extra or {})
    return env


def hub_env(endpoint: str, home: Path) -> dict[str, str]:
    """A child node's Hugging Face settings: the Hub at `endpoint` (a local stand-in, or a closed port
    for none), its cache and token file under `home` (no token: hermetic_env drops the developer's)."""
    return {"HF_ENDPOINT": endpoint, "HF_HOME": str(home)}


class NodeProcess:
    """`python -m node.cli run -p PORT --data-dir DATA_DIR ARGS...`, its stdout+stderr appended to
    `log_path`. Started at construction; `start()` again after a kill restarts it with the same
    data dir (same identity), ports and arguments. With `netns` it runs inside that network
    namespace (`ip netns exec`); the HTTP helpers below reach the host's loopback only, so such a
    node is driven from inside its namespace (tests.pipeline.netclient)."""

    def __init__(self, data_dir: Path, port: int | None = None, args: list[str] = (), *,
                 name: str | None = None, env: dict[str, str] | None = None, netns: str | None = None):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.peer_port = self.port + const.PEER_PORT_OFFSET
        self.name = name or self.data_dir.name
        self.log_path = self.data_dir.parent / f"{self.name}-{self.port}.out"
        self.args = list(args)
        self.env = env
        self.netns = netns
        self.proc: subprocess.Popen | None = None
        join_test_swarm(self.data_dir)  # a member of the test swarm unless the test gave it its own
        self.start()

    def start(self) -> None:
        """(Re)start the process."""
        cmd = [sys.executable, "-m", "node.cli", "run", "-p", str(self.port), "--data-dir", str(self.data_dir),
               *self.args]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        out = open(self.log_path, "ab")  # noqa: SIM115 (the child holds its own copy)
        try:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=hermetic_env(self.env), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()

    # --- addresses and credentials ---

    @property
    def base(self) -> str:
        """The API's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_key(self) -> str:
        """The key the node wrote to its data dir."""
        return (self.data_dir / "api_key").read_text().strip()

    @property
    def auth(self) -> dict[str, str]:
        """Authorization header for the API."""
        return {"Authorization": f"Bearer {self.api_key}"}

    # --- state ---

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def _check_alive(self) -> None:
        if not self.alive():
            raise AssertionError(f"{self.name} exited (rc={self.proc.returncode}):\n{self.output()[-4000:]}")

    def output(self) -> str:
        """Everything the process wrote to stdout and stderr (all runs)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def node_log(self) -> str:
        """The node's own node.log in its data dir."""
        path = self.data_dir / "node.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def torch_mapped(self) -> bool:
        """Whether the process has torch's native library mapped (/proc/PID/maps): torch imported."""
        self._check_alive()
        maps = Path(f"/proc/{self.proc.pid}/maps").read_text()
        return "libtorch_cpu" in maps or "torch/_C" in maps

    # --- blocking HTTP (for tests without a loop) ---

    def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        """GET with the node's API key; (status, body)."""
        req = urllib.request.Request(self.base + path, headers=self.auth)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def healthy(self, path: str = "/health") -> bool:
        """GET `path` answers 200 (an exited process fails the test, with its output)."""
        self._check_alive()
        try:
            req = urllib.request.Request(self.base + path)
            with urllib.request.urlopen(req, timeout=2) as resp:
                return resp.status == 200
        except OSError:  # refused, reset, timed out, or an HTTP error status
            return False

    def wait_ready(self, timeout_s: float = 120.0, path: str = "/health/ready") -> None:
        """Block until GET `path` answers 200."""
        wait_until_sync(lambda: self.healthy(path), timeout_s, 0.2, f"{self.name} ({self.base}{path}) to answer 200")

    def peers(self) -> list[dict]:
        """GET /api/admin/peers."""
        status, body = self.get("/api/admin/peers")
        assert status == 200, body
        return json.loads(body)["peers"]

    def peer(self, node_id: str) -> dict | None:
        """One row of the peer table."""
        return next((p for p in self.peers() if p["node_id"] == node_id), None)

    # --- on a loop ---

    async def async_wait_ready(self, timeout_s: float = 120.0, path: str = "/health/ready") -> None:
        """Wait on the running loop until GET `path` answers 200."""
        async def ready():
            self._check_alive()
            try:
                async with aiohttp.ClientSession() as s, s.get(self.base + path) as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False
        await wait_until(ready, timeout_s, 0.2, f"{self.name} ({self.base}{path}) to answer 200")

    async def async_get_text(self, path: str) -> str:
        """GET `path` with the API key; the body as text."""
        async with aiohttp.ClientSession() as s, s.get(self.base + path, headers=self.auth) as r:
            return await r.text()

    async def async_get_json(self, path: str) -> dict:
        """GET `path` with the API key; the JSON body."""
        async with aiohttp.ClientSession() as s, s.get(self.base + path, headers=self.auth) as r:
            return await r.json()

    # --- ending ---

    def send_signal(self, sig: int) -> None:
        """Send a signal to the process (if it runs)."""
        if self.alive():
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(10)

    def terminate(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Send `sig` (SIGTERM), wait for the exit, SIGKILL if it lingers; the return code."""
        if self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc.wait(10)
        return self.proc.returncode
