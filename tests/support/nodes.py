"""Helpers to run real nodes in tests: in-process on the test's loop, or as `swarmllm run` subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from node.config import NodeConfig
from node.inference.synth import SynthSpec, write_gguf
from node.node import Node

REPO = Path(__file__).resolve().parents[2]
TINY = SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=256, name="tiny")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (and port+10 too, for the peer listener)."""
    for _ in range(50):
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
    raise RuntimeError("no free port pair found")


def tiny_model(directory: Path, spec: SynthSpec = TINY, name: str = "tiny.gguf") -> Path:
    """Write (once per directory) a tiny random-weight llama GGUF."""
    path = directory / name
    if not path.exists():
        write_gguf(path, spec)
    return path


def node_config(data_dir: Path, models: list[Path], **overrides) -> NodeConfig:
    """A hermetic NodeConfig: own data dir, ephemeral ports, no default model, no mDNS."""
    cfg = NodeConfig(data_dir=data_dir, port=0, include_default_model=False,
                     models=[str(m) for m in models], log_to_file=False, n_threads=1)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    if hasattr(cfg, "mdns") and "mdns" not in overrides:
        cfg.mdns = False
    return cfg


@contextlib.asynccontextmanager
async def running_node(config: NodeConfig):
    """Start a Node on the running loop; always stop it."""
    node = Node(config)
    try:
        await node.start()
        yield node
    finally:
        await node.stop()


async def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition"):
    """Poll predicate() (sync or async) until truthy, or fail naming what was awaited."""
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


class NodeProcess:
    """`python -m node.cli run ...` as a subprocess with its own data dir and port."""

    def __init__(self, data_dir: Path, port: int, args: list[str], env: dict | None = None):
        self.data_dir, self.port = data_dir, port
        self.log_path = data_dir.parent / f"node-{port}.out"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SWARMLLM_")}
        full_env.update(env or {})
        self._out = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli", "run", "-p", str(port), "--data-dir", str(data_dir), *args],
            cwd=REPO, env=full_env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_key(self) -> str:
        return (self.data_dir / "api_key").read_text().strip()

    async def wait_ready(self, timeout_s: float = 90.0) -> None:
        async def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"node exited early (rc={self.proc.returncode}):\n{self.output()}")
            try:
                async with aiohttp.ClientSession() as s, s.get(self.base + "/health/ready") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False
        await wait_until(ready, timeout_s, 0.2, f"node on port {self.port} to be ready")

    def output(self) -> str:
        self._out.flush()
        return self.log_path.read_text(errors="replace")

    def terminate(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()
        return self.proc.returncode
