"""The soak's swarm (bench/soak.py): six `swarmllm run` processes on loopback, restartable with
the same data dir and ports. Model M (random f32 llama, 6 layers) in 3 segments, each held by a
primary and a standby; model W (2 layers) served whole by llama.cpp on the coordinator C."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

from node.inference.synth import SynthSpec, write_gguf
from node.net import Swarm as MemberSwarm
from node.net import write_swarm_file
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[1]
SPLIT = SynthSpec(n_layers=6, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=1024, name="soak-split")
WHOLE = SynthSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=1024, name="soak-whole",
                  seed=7)
SEGMENTS = ("0-1", "2-3", "4-5")


# --- nodes -------------------------------------------------------------------------------------


@dataclass
class NodeProc:
    """One `swarmllm run` process; restartable with the same data dir and ports."""

    name: str
    data_dir: Path
    port: int
    args: list[str]
    proc: subprocess.Popen | None = None
    incarnation: int = 0
    short_id: str = ""  # the node id's first 8 hex digits (its identity survives restarts)
    rss_mb: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # incarnation → samples
    fds: dict[int, list[tuple[float, int]]] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_key(self) -> str:
        return (self.data_dir / "api_key").read_text().strip()

    def start(self) -> None:
        self.incarnation += 1
        out = open(self.data_dir.parent / f"{self.name}.out", "ab")  # noqa: SIM115 (owned by the process)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWARMLLM_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli", "run", "-p", str(self.port), "--data-dir", str(self.data_dir),
             *self.args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def sample(self, t: float) -> None:
        if not self.alive:
            return
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(self.proc.pid)
            self.rss_mb.setdefault(self.incarnation, []).append((t, p.memory_info().rss / 2**20))
            self.fds.setdefault(self.incarnation, []).append((t, p.num_fds()))

    async def ready(self, session: aiohttp.ClientSession, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(f"{self.name} exited (rc={self.proc.returncode}); see {self.name}.out")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(self.base + "/health/ready") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f} s")

    async def get_json(self, session: aiohttp.ClientSession, path: str) -> dict:
        async with session.get(self.base + path, headers={"Authorization": f"Bearer {self.api_key}"}) as r:
            return await r.json()


@dataclass
class Swarm:
    coordinator: NodeProc
    others: list[NodeProc]
    split_path: Path
    whole_path: Path
    split_id: str = ""
    whole_id: str = ""

    @property
    def nodes(self) -> list[NodeProc]:
        return [self.coordinator, *self.others]


def make_swarm(workdir: Path) -> Swarm:
    """Write the models and the six nodes' set-up (not started)."""
    split = workdir / "soak-split.gguf"
    whole = workdir / "soak-whole.gguf"
    write_gguf(split, SPLIT)
    write_gguf(whole, WHOLE)
    members = MemberSwarm.create()  # all six nodes are members of one swarm
    common = ["--model", str(split), "--no-default-model", "--slice-dtype", "f32", "--activation-bits", "32",
              "--no-mdns", "--n-threads", "1"]
    c_port = free_port()
    c_dir = workdir / "C"
    (c_dir / "models").mkdir(parents=True)
    shutil.copy(whole, c_dir / "models" / whole.name)  # served whole: a data-dir model, not a --layers one
    write_swarm_file(c_dir, members)
    coordinator = NodeProc("C", c_dir, c_port, [*common, "--layers", SEGMENTS[0]])
    others = []
    for i, layers in enumerate(SEGMENTS):
        for role in ("a", "b"):
            if i == 0 and role == "a":
                continue  # C is segment 0's primary
            name = f"S{i}{role}"
            d = workdir / name
            d.mkdir()
            write_swarm_file(d, members)
            others.append(NodeProc(name, d, free_port(),
                                   [*common, "--layers", layers, "--bootstrap", f"127.0.0.1:{c_port + 10}"]))
    return Swarm(coordinator, others, split, whole)
