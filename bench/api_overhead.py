"""What the API costs: decode tok/s streamed through a node's API vs llama-cpp-python called directly.

Same GGUF, same settings (greedy, n_threads, n_ctx, the same prompt tokens, the same number of
generated tokens), alternating arms in one run. Decode tok/s = (n-1) / (t_last_token - t_first_token),
measured where a user measures it: client-side for the API (a separate `swarmllm run` process,
read over SSE), in the generate loop for llama-cpp-python.

    python bench/api_overhead.py                       # a ~110M-parameter random llama + the default model
    python bench/api_overhead.py --model path.gguf --tokens 256 --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from node.inference.synth import SynthSpec, write_gguf  # noqa: E402
from node.resources import default_model_path  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

MID = SynthSpec(n_layers=12, hidden=768, n_heads=12, n_kv_heads=4, ffn=2048, vocab=8192, n_ctx=2048,
                qtype="Q8_0", name="bench-110m")


def direct_decode(path: Path, prompt_text: str, n_tokens: int, n_threads: int, n_ctx: int) -> tuple[float, int, list[int]]:
    """llama-cpp-python's own generate loop: decode tok/s, tokens generated, prompt tokens."""
    from node.inference.llamacpp import load

    llm = load().Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                          n_batch=min(512, n_ctx), verbose=False)
    prompt = llm.tokenize(prompt_text.encode(), add_bos=llm._model.add_bos_token(), special=True)
    stamps = []
    for tok in llm.generate(prompt, top_k=0, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        stamps.append(time.perf_counter())
        if llm._model.token_eos() == tok or len(stamps) >= n_tokens:
            break
    llm.close()
    n = len(stamps)
    return (n - 1) / (stamps[-1] - stamps[0]), n, prompt


async def api_decode(base: str, key: str, model: str, prompt_text: str, n_tokens: int) -> tuple[float, int]:
    """Stream one completion; decode tok/s from the client's arrival times of content chunks."""
    body = {"model": model, "prompt": prompt_text, "max_tokens": n_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    stamps, usage = [], None
    async with aiohttp.ClientSession() as s, s.post(base + "/v1/completions", json=body,
                                                    headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status == 200, await r.text()
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if choice.get("text"):
                    stamps.append(time.perf_counter())
    n = usage["completion_tokens"] if usage else len(stamps)
    # chunks may carry several tokens when the loop batches; use token count over the chunk window
    return (n - 1) / (stamps[-1] - stamps[0]), n


async def bench_model(path: Path, n_tokens: int, reps: int, n_threads: int, n_ctx: int) -> None:
    prompt_text = "The node serves a model to local apps through an API that"
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="apibench-"))
    proc = subprocess.Popen([sys.executable, "-m", "node.cli", "run", "-p", str(port), "--data-dir", str(data),  # noqa: ASYNC220
                             "--model", str(path), "--no-default-model", "--n-threads", str(n_threads),
                             "--ctx", str(n_ctx)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        async with aiohttp.ClientSession() as s:
            while True:
                try:
                    async with s.get(base + "/health/ready") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("node did not become ready")
                await asyncio.sleep(0.2)
        key = (data / "api_key").read_text().strip()
        async with aiohttp.ClientSession() as s, s.get(base + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as r:
            model_id = (await r.json())["data"][0]["id"]
        direct, api = [], []
        await api_decode(base, key, model_id, prompt_text, 8)  # warm-up (page cache, first-load costs)
        for _ in range(reps):
            tps, n_direct, _prompt = await asyncio.to_thread(direct_decode, path, prompt_text, n_tokens, n_threads, n_ctx)
            direct.append(tps)
            tps_api, n_api = await api_decode(base, key, model_id, prompt_text, n_direct)
            api.append(tps_api)
        d, a = statistics.median(direct), statistics.median(api)
        if n_direct < 16:
            print(f"model={path.name}: the model ends its reply after {n_direct} tokens; too short to measure decode")
            return
        print(f"model={path.name} tokens={n_direct}/{n_api} threads={n_threads} reps={reps}")
        print(f"  llama-cpp-python direct : {d:8.1f} tok/s  (runs: {', '.join(f'{x:.1f}' for x in direct)})")
        print(f"  through the API (SSE)   : {a:8.1f} tok/s  (runs: {', '.join(f'{x:.1f}' for x in api)})")
        print(f"  API cost                : {100 * (1 - a / d):+.1f}%  (target <= 5%)")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=None, help="GGUF file (repeatable)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    args = ap.parse_args()
    models = [Path(m) for m in args.model] if args.model else []
    if not models:
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "swarmllm-bench"
        cache.mkdir(parents=True, exist_ok=True)
        mid = cache / "bench-110m-q8_0.gguf"
        if not mid.exists():
            write_gguf(mid, MID)
        models = [mid]
        if default_model_path().exists():
            models.append(default_model_path())
    for path in models:
        asyncio.run(bench_model(path, args.tokens, args.reps, args.threads, args.ctx))


if __name__ == "__main__":
    main()
