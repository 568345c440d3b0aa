"""Distributed pipeline speed on loopback: the same model as 1, 2 and 3 segments vs llama.cpp.

Each arm is real `swarmllm run` processes (one per segment) on 127.0.0.1; the client streams a
greedy completion from the first node and measures TTFT (request sent → first content chunk) and
decode tok/s ((n-1) / (t_last - t_first)). Per-hop overhead comes from the coordinator's trace:
(step wall time − Σ segment compute) / network hops, averaged over decode steps; activation bytes
per token per hop from the trace's activation_bytes. "Δ vs 1 seg" is the client's view of the same
cost: (ms/token of this arm − ms/token of 1 segment) / network hops, from the medians (noisy: two
medians of decode rates, but it depends on no telemetry). llama.cpp runs the whole file in-process.
The pipe ring (bench/pipe_ring.py) runs the same slices in 1 and 3 processes joined by OS pipes,
with no network stack: what 3 processes lose on this machine before any hop cost.

    python bench/pipeline_bench.py                  # ~110M-parameter random llama, Q8_0, 12 layers
    python bench/pipeline_bench.py --model M.gguf --tokens 64 --threads 2
    python bench/pipeline_bench.py --speculation    # the node arms with n-gram speculation on

The node arms run without n-gram speculation by default (speculative_max_draft = 0), like llama.cpp
and the pipe ring beside them: a random-weight model loops, so speculation would multiply their
tok/s by the loop's accepted drafts (bench/speculative.py measures speculation itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from bench.api_overhead import MID, direct_decode  # noqa: E402
from bench.pipe_ring import ring_decode  # noqa: E402
from node.inference.synth import write_gguf  # noqa: E402
from node.models.gguf_meta import read_header  # noqa: E402
from node.net import Swarm, write_swarm_file  # noqa: E402
from node.sysinfo import cpu_name  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

PROMPT = "The swarm splits a model by layers and passes hidden states between peers so that"


class Arm:
    """N node processes, each serving an equal share of the layers."""

    def __init__(self, model: Path, n_layers: int, n_segments: int, threads: int, bits: int, *,
                 config_toml: str = "", first_args: tuple[str, ...] = (), slice_dtype: str | None = None,
                 repo: Path = REPO):
        """`config_toml`: every node's config.toml; `first_args`: more CLI arguments for the first
        node (the coordinator); `repo`: the checkout whose node runs (bench/ab_checkouts.py)."""
        self.procs: list[subprocess.Popen] = []
        self.ports: list[int] = []
        self.dirs: list[Path] = []
        bounds = [round(i * n_layers / n_segments) for i in range(n_segments + 1)]
        swarm = Swarm.create()  # the arm's nodes are members of one swarm
        for i in range(n_segments):
            port = free_port()
            data = Path(tempfile.mkdtemp(prefix=f"pipebench{i}-"))
            write_swarm_file(data, swarm)
            if config_toml:
                (data / "config.toml").write_text(config_toml)
            args = [sys.executable, "-m", "node.cli", "run", "-p", str(port), "--data-dir", str(data),
                    "--model", str(model), "--no-default-model", "--layers", f"{bounds[i]}-{bounds[i + 1] - 1}",
                    "--no-mdns", "--n-threads", str(threads), "--activation-bits", str(bits)]
            if slice_dtype:
                args += ["--slice-dtype", slice_dtype]
            if not self.ports:
                args += list(first_args)
            if self.ports:
                args += ["--bootstrap", f"127.0.0.1:{self.ports[0] + 10}"]
            self.procs.append(subprocess.Popen(args, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            self.ports.append(port)
            self.dirs.append(data)
        self.base = f"http://127.0.0.1:{self.ports[0]}"
        self.key = ""
        self.last_text = ""  # the last stream's text

    async def ready(self, name: str) -> str:
        deadline = time.monotonic() + 180
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                try:
                    if not self.key and (self.dirs[0] / "api_key").exists():
                        self.key = (self.dirs[0] / "api_key").read_text().strip()
                    async with s.get(self.base + "/v1/models", headers={"Authorization": f"Bearer {self.key}"}) as r:
                        if r.status == 200:
                            ids = [m["id"] for m in (await r.json())["data"] if m["name"] == name]
                            if ids:
                                return ids[0]
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.3)
        raise SystemExit("swarm did not come up")

    async def stream(self, model_id: str, n_tokens: int, prompt: str | list[dict] = PROMPT) -> tuple[float, float, int]:
        """(TTFT ms, decode tok/s, tokens) of one greedy stream; `prompt`: a text (/v1/completions)
        or chat messages (/v1/chat/completions)."""
        chat = isinstance(prompt, list)
        body = {"model": model_id, "max_tokens": n_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, **({"messages": prompt} if chat else {"prompt": prompt})}
        sent = time.perf_counter()
        stamps, usage, text = [], None, []
        url = self.base + ("/v1/chat/completions" if chat else "/v1/completions")
        async with aiohttp.ClientSession() as s, s.post(url, json=body,
                                                        headers={"Authorization": f"Bearer {self.key}"}) as r:
            assert r.status == 200, await r.text()
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                pieces = [(c.get("delta") or {}).get("content") if chat else c.get("text")
                          for c in event.get("choices", [])]
                if any(pieces):
                    stamps.append(time.perf_counter())
                    text += [piece or "" for piece in pieces]
        self.last_text = "".join(text)
        n = usage["completion_tokens"]
        return (stamps[0] - sent) * 1000, (n - 1) / (stamps[-1] - stamps[0]), n

    async def last_trace(self) -> dict:
        async with aiohttp.ClientSession() as s, s.get(self.base + "/api/admin/requests",
                                                        headers={"Authorization": f"Bearer {self.key}"}) as r:
            return (await r.json())["recent"][-1]

    async def hop_overhead(self) -> str | None:
        async with aiohttp.ClientSession() as s, s.get(self.base + "/api/admin/diagnostics",
                                                        headers={"Authorization": f"Bearer {self.key}"}) as r:
            m = re.search(r"per-hop overhead \(ewma, decode steps\): ([\d.]+) ms", await r.text())
            return m.group(1) if m else None

    def stop(self) -> None:
        """Stops the nodes and removes their data dirs (a slice's weight cache is the size of its
        weights: a bench run left gigabytes in /tmp)."""
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


async def run_arm(model: Path, n_layers: int, segments: int, args, bits: int) -> dict:
    config = "" if args.speculation else "speculative_max_draft = 0\n"
    arm = Arm(model, n_layers, segments, args.threads, bits, config_toml=config)
    try:
        model_id = await arm.ready(model.stem)
        await arm.stream(model_id, 4)  # warm-up
        ttfts, rates = [], []
        for _ in range(args.reps):
            ttft, rate, n = await arm.stream(model_id, args.tokens)
            ttfts.append(ttft)
            rates.append(rate)
        trace = await arm.last_trace()
        hops = max(1, segments - 1)
        act = trace.get("segments", [])
        act_bytes = sum(s.get("activation_bytes", 0) for s in act)
        per_tok_hop = act_bytes / max(1, (trace["prompt_tokens"] + trace["completion_tokens"])) / hops if segments > 1 else 0
        return {"segments": segments, "bits": bits, "ttft_ms": statistics.median(ttfts),
                "tok_s": statistics.median(rates), "runs": rates, "overhead_ms": await arm.hop_overhead(),
                "act_bytes_per_token_hop": per_tok_hop, "n": n}
    finally:
        arm.stop()


def default_model() -> Path:
    """The ~110M-parameter random llama (written once into the cache)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "swarmllm-bench"
    cache.mkdir(parents=True, exist_ok=True)
    model = cache / "bench-110m-q8_0.gguf"
    if not model.exists():
        write_gguf(model, MID)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speculation", action="store_true", help="the node arms speculate (n-gram drafts)")
    args = ap.parse_args()
    model = Path(args.model) if args.model else default_model()
    n_layers = read_header(model).n_layers
    rows = []
    for segments in (1, 2, 3):
        rows.append(asyncio.run(run_arm(model, n_layers, segments, args, 16)))
    rows.append(asyncio.run(run_arm(model, n_layers, 3, args, 8)))
    direct = [direct_decode(model, PROMPT, args.tokens, args.threads, 1024)[0] for _ in range(args.reps)]
    ring = {n: ring_decode(model, n_layers, n, args.threads, args.tokens, args.reps) for n in (1, 3)}
    print(f"model={model.name} layers={n_layers} tokens={args.tokens} threads={args.threads} reps={args.reps} "
          f"speculation={'on' if args.speculation else 'off'} cpu={cpu_name()}")
    print(f"{'arm':28} {'decode tok/s':>12} {'ttft ms':>9} {'hop overhead ms':>16} {'Δ vs 1 seg ms':>14} "
          f"{'act bytes/token/hop':>20}")
    one = rows[0]["tok_s"]
    for r in rows:
        name = f"{r['segments']} segment(s), {'f16' if r['bits'] == 16 else 'int8'}"
        hops = r["segments"]  # the coordinator serves segment 0: hops between segments, and back
        delta = f"{(1000 / r['tok_s'] - 1000 / one) / hops:.2f}" if r["segments"] > 1 else "-"
        print(f"{name:28} {r['tok_s']:12.1f} {r['ttft_ms']:9.0f} {str(r['overhead_ms'] or '-'):>16} {delta:>14} "
              f"{r['act_bytes_per_token_hop']:20.0f}   ({r['tok_s'] / one * 100:.0f}% of 1 segment)")
    print(f"{'llama.cpp single process':28} {statistics.median(direct):12.1f}")
    print(f"{'pipe ring, 1 process':28} {ring[1]:12.1f}")
    print(f"{'pipe ring, 3 processes':28} {ring[3]:12.1f}   ({ring[3] / ring[1] * 100:.0f}% of 1 process: this machine's "
          f"floor for 3 processes, no network stack)")
    print(f"3 segments (f16) vs the 3-process pipe ring: {rows[2]['tok_s'] / ring[3] * 100:.0f}%  "
          f"({os.cpu_count()} CPUs, {args.threads} thread(s) per segment)")


if __name__ == "__main__":
    main()
