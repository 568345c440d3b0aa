"""Concurrent streams on one GGUF: our node's local route (a real node process, continuous
batching) against llama.cpp's own `llama-server -np 8` (continuous batching), same file, same
thread count, same requests, from one run, side by side.

    python -m bench.concurrency [--models default,110m[,1b]] [--streams 1,4,8,16] [--tokens 32]
                                [--threads 2] [--rounds 2] [--llama-server PATH] [--cache DIR] [--chain]

For each model and each level N: N clients at once, each sending `--rounds` streaming
/v1/completions one after the other (greedy, `--tokens` tokens: the end-of-generation tokens are
banned with logit_bias on both servers, so every reply has exactly that length; every prompt
starts with its own number, so no prefix cache helps either side). Printed: aggregate tok/s
(all completion tokens / wall time), p50/p95 TTFT over every request, and ours/llama-server.
Both servers stay up; each level runs ours then llama-server, `--repeats` times, best run kept
(the machine may be shared: alternating keeps a load change from favouring one side).

Models: `default` (resources/models, 256-token context), `110m` (random Q8_0 llama, 12 layers x
768, the shape of bench/api_overhead.py), `1b` (node.inference.synth.LLAMA_1B, random Q8_0,
~1.3 GB): the random ones are written once to --cache (default ~/.cache/swarmllm-bench, outside
the repository). llama-server: --llama-server or $LLAMA_SERVER (default
/work/cache/llama-build/bin/llama-server); the bench says so and measures only ours when it is
missing. Both run flash attention off (our engine's default) and `-np`/max_concurrent 8;
`--flash-attention` turns it on in both (ours: NodeConfig.flash_attention; llama-server `-fa on`).

`--chain` adds a third server: the same file as a 3-segment chain (bench.pipeline_bench.Arm: three
`swarmllm run` processes on 127.0.0.1, one per third of the layers, int8 slices, each with
--threads or --chain-threads), asked through its first node; printed with its own 8 / 1 scaling.
`--chain-segments 1` makes it one node serving every layer as one slice (the slice engine in
place of llama.cpp, through the distributed route).
(Every process of every server shares this machine's cores: on 2 vCPUs the chain's three nodes
take turns, and with 2 threads each they oversubscribe the cores once all three compute.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.grammar_engines import cpu_name
from node.inference.synth import LLAMA_1B, SynthSpec, write_gguf
from node.inference.tokenizer import ModelTokenizer
from node.resources import default_model_path
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SERVER = Path("/work/cache/llama-build/bin/llama-server")
MID = SynthSpec(n_layers=12, hidden=768, n_heads=12, n_kv_heads=4, ffn=2048, vocab=8192, n_ctx=2048,
                qtype="Q8_0", name="bench-110m")
SHAPES = {"110m": (MID, "bench-110m-q8_0.gguf"), "1b": (LLAMA_1B, "llama-3.2-1b-shaped-q8_0.gguf")}
PARALLEL = 8
PROMPT = "Request {i}. The node serves a model to local apps through an API that"


def model_path(name: str, cache: Path) -> Path:
    if name == "default":
        return default_model_path()
    spec, filename = SHAPES[name]
    path = cache / filename
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", file=sys.stderr, flush=True)
        tmp = path.with_suffix(".part")
        write_gguf(tmp, spec)
        tmp.rename(path)
    return path


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    base: str
    headers: dict
    model: str
    data: Path | None = None  # our node's data dir, removed at stop

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.data:
            shutil.rmtree(self.data, ignore_errors=True)


async def wait_ready(base: str, path: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server at {base} exited with {proc.returncode}")
            try:
                async with s.get(base + path) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the server at {base} did not become ready")
            await asyncio.sleep(0.2)


async def start_ours(path: Path, threads: int, n_ctx: int, log_dir: Path, flash_attention: bool = False) -> Server:
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="concbench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARMLLM_")}
    env.update(SWARMLLM_MAX_CONCURRENT=str(PARALLEL), SWARMLLM_MDNS="false",
               SWARMLLM_FLASH_ATTENTION="true" if flash_attention else "false")
    out = open(log_dir / f"ours-{path.stem}.log", "wb")  # noqa: SIM115, ASYNC230 - the child holds it
    proc = subprocess.Popen([sys.executable, "-m", "node.cli", "run", "-p", str(port), "--data-dir", str(data),  # noqa: ASYNC220
                             "--model", str(path), "--no-default-model", "--n-threads", str(threads),
                             "--ctx", str(n_ctx)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    out.close()
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, "/health/ready", proc)
    key = (data / "api_key").read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as s, s.get(base + "/v1/models", headers=headers) as r:
        model = (await r.json())["data"][0]["id"]
    return Server("ours", proc, base, headers, model, data)


async def start_llama_server(binary: Path, path: Path, threads: int, n_ctx: int, log_dir: Path,
                             flash_attention: bool = False) -> Server:
    port = free_port()
    out = open(log_dir / f"llama-server-{path.stem}.log", "wb")  # noqa: SIM115, ASYNC230
    proc = subprocess.Popen([str(binary), "-m", str(path), "--host", "127.0.0.1", "--port", str(port),  # noqa: ASYNC220
                             "-t", str(threads), "-tb", str(threads), "-np", str(PARALLEL), "-c", str(n_ctx * PARALLEL),
                             "--cont-batching", "-fa", "on" if flash_attention else "off", "--no-webui"], stdout=out, stderr=subprocess.STDOUT)
    out.close()
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, "/health", proc)
    return Server("llama-server", proc, base, {}, path.name)


class ChainServer(Server):
    """An N-segment chain (pipeline_bench.Arm) as a Server: asked through its first node."""

    def __init__(self, arm, model: str, segments: int):
        super().__init__(f"chain{segments}", arm.procs[0], arm.base, {"Authorization": f"Bearer {arm.key}"}, model)
        self.arm = arm

    def stop(self) -> None:
        self.arm.stop()


async def start_chain(path: Path, threads: int, segments: int = 3) -> Server:
    from bench.pipeline_bench import Arm
    from node.models.gguf_meta import read_header

    n_layers = (await asyncio.to_thread(read_header, path)).n_layers
    arm = Arm(path, n_layers, segments, threads, 16)
    return ChainServer(arm, await arm.ready(path.stem), segments)


async def one_stream(session: aiohttp.ClientSession, server: Server, prompt: str, n_tokens: int,
                     bias: dict) -> tuple[float, int]:
    """(TTFT s, completion tokens) of one streaming completion."""
    body = {"model": server.model, "prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "stream": True,
            "logit_bias": bias}
    started = time.perf_counter()
    ttft, pieces, finish = None, 0, None
    async with session.post(server.base + "/v1/completions", json=body, headers=server.headers) as r:
        if r.status != 200:
            raise SystemExit(f"{server.name}: HTTP {r.status}: {(await r.text())[:300]}")
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            choice = (event.get("choices") or [{}])[0]
            if choice.get("text"):
                pieces += 1
                if ttft is None:
                    ttft = time.perf_counter() - started
            finish = choice.get("finish_reason") or finish
    if finish != "length":
        raise SystemExit(f"{server.name}: a reply ended with {finish!r} after {pieces} pieces, not at max_tokens")
    return ttft if ttft is not None else time.perf_counter() - started, n_tokens


async def level(server: Server, n: int, rounds: int, n_tokens: int, bias: dict, counter: list[int]) -> dict:
    ttfts: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600),
                                     connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:
        async def client() -> int:
            total = 0
            for _ in range(rounds):
                counter[0] += 1
                ttft, tokens = await one_stream(session, server, PROMPT.format(i=counter[0]), n_tokens, bias)
                ttfts.append(ttft)
                total += tokens
            return total
        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(client() for _ in range(n))))
        wall = time.perf_counter() - started
    ttfts.sort()
    return {"tps": tokens / wall, "p50": statistics.median(ttfts),
            "p95": ttfts[min(len(ttfts) - 1, int(round(0.95 * (len(ttfts) - 1))))], "n": len(ttfts)}


def banned(path: Path) -> dict:
    tok = ModelTokenizer(path)
    try:
        return {str(i): -100 for i in range(tok.n_vocab) if tok.is_eog(i)}
    finally:
        tok.close()


async def bench_model(name: str, args) -> None:
    path = model_path(name, args.cache)
    n_ctx = 256 if name == "default" else args.ctx
    bias = banned(path)
    servers = []
    binary = args.llama_server
    log_dir = Path(tempfile.mkdtemp(prefix="concbench-logs-"))
    results: dict[str, dict[int, dict]] = {}
    try:
        servers.append(await start_ours(path, args.threads, n_ctx, log_dir, args.flash_attention))
        if binary.exists():
            servers.append(await start_llama_server(binary, path, args.threads, n_ctx, log_dir, args.flash_attention))
        else:
            print(f"llama-server is missing at {binary} (give --llama-server or $LLAMA_SERVER): measuring ours only")
        if args.chain:
            servers.append(await start_chain(path, args.chain_threads or args.threads, args.chain_segments))
        counter = [0]
        for server in servers:
            async with aiohttp.ClientSession() as session:  # warm-up: page cache, first-step costs
                await one_stream(session, server, "warm up", 4, bias)
            results[server.name] = {}
        # both servers stay up (the idle one costs next to nothing); each level runs ours, then
        # llama-server, `--repeats` times, and the best run of each counts: the machine is shared,
        # and alternating keeps a load change from favouring one side
        for n in args.streams:
            for _ in range(args.repeats):
                for server in servers:
                    got = await level(server, n, args.rounds, args.tokens, bias, counter)
                    best = results[server.name].get(n)
                    if best is None or got["tps"] > best["tps"]:
                        results[server.name][n] = got
    finally:
        for server in servers:
            if server.proc.poll() is None:
                server.stop()
    print(f"\nmodel={name} file={path.name} threads={args.threads} tokens={args.tokens} rounds={args.rounds} "
          f"repeats={args.repeats} (best) flash_attention={'on' if args.flash_attention else 'off'} "
          f"n_ctx/seq={n_ctx} parallel={PARALLEL} cpu={cpu_name()} logs={log_dir}")
    print(f"{'streams':>7} | {'ours tok/s':>10} {'p50 TTFT':>9} {'p95 TTFT':>9} | {'l-s tok/s':>10} "
          f"{'p50 TTFT':>9} {'p95 TTFT':>9} | {'tok/s ratio':>11} {'p95 ratio':>9}")
    ours, ls = results.get("ours", {}), results.get("llama-server", {})
    for n in args.streams:
        o, s = ours.get(n), ls.get(n)
        row = f"{n:>7} | {o['tps']:>10.1f} {o['p50']:>8.3f}s {o['p95']:>8.3f}s |"
        if s:
            row += (f" {s['tps']:>10.1f} {s['p50']:>8.3f}s {s['p95']:>8.3f}s | {o['tps'] / s['tps']:>11.2f} "
                    f"{o['p95'] / s['p95']:>9.2f}")
        print(row)
    cname = f"chain{args.chain_segments}"
    chain = results.get(cname, {})
    if chain:
        print(f"{'streams':>7} | {cname + ' tok/s':>12} {'p50 TTFT':>9} {'p95 TTFT':>9} | {'vs ours local':>13}")
        for n in args.streams:
            c, o = chain[n], ours[n]
            print(f"{n:>7} | {c['tps']:>12.1f} {c['p50']:>8.3f}s {c['p95']:>8.3f}s | {c['tps'] / o['tps']:>13.2f}")
        if 1 in chain and 8 in chain:
            print(f"{cname}: 8 streams / 1 stream aggregate = {chain[8]['tps'] / chain[1]['tps']:.2f}x; "
                  f"p95 TTFT 8 / 1 = {chain[8]['p95'] / chain[1]['p95']:.2f}x")
    if 1 in ours and 8 in ours:
        print(f"ours: 8 streams / 1 stream aggregate = {ours[8]['tps'] / ours[1]['tps']:.2f}x; "
              f"p95 TTFT 8 / 1 = {ours[8]['p95'] / ours[1]['p95']:.2f}x")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="default,110m")
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="runs per level and server; the best counts")
    ap.add_argument("--ctx", type=int, default=512, help="context per sequence for the random models")
    ap.add_argument("--llama-server", type=Path, default=Path(os.environ.get("LLAMA_SERVER", DEFAULT_SERVER)))
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "swarmllm-bench")
    ap.add_argument("--chain", action="store_true", help="also a 3-segment chain of the same file")
    ap.add_argument("--flash-attention", action="store_true", help="flash attention on in ours and llama-server")
    ap.add_argument("--chain-segments", type=int, default=3, help="segments of the --chain (1: one node runs every layer on the slice engine)")
    ap.add_argument("--chain-threads", type=int, default=0, help="threads per chain node (default: --threads)")
    args = ap.parse_args()
    args.streams = [int(s) for s in args.streams.split(",")]
    print(f"load before: {os.getloadavg()}")
    for name in args.models.split(","):
        asyncio.run(bench_model(name, args))
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
