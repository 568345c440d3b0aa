"""Helpers for multi-node tests: start `swarmllm run` processes serving slices, compute references."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from node.inference.synth import SynthSpec, write_gguf
from tests.support.processes import NodeProcess
from tests.support.sse import SseJson, delta_text, finish_reasons
from tests.support.waiting import wait_until

# f32 weights: the distributed path is compared token for token with llama.cpp on the same file.
SPLIT = SynthSpec(n_layers=6, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=1024, name="split6")


def split_model(directory: Path) -> Path:
    path = directory / "split6.gguf"
    if not path.exists():
        write_gguf(path, SPLIT)
    return path


def start_slice_node(base: Path, name: str, model: Path, layers: str, *, bootstrap: list[int] = (),
                     extra: list[str] = ()) -> NodeProcess:
    """A node serving `layers` (inclusive A-B) of model, dialling the given peer ports."""
    args = ["--model", str(model), "--no-default-model", "--layers", layers, "--slice-dtype", "f32",
            "--activation-bits", "32", "--no-mdns", "--n-threads", "1"]
    for peer_port in bootstrap:
        args += ["--bootstrap", f"127.0.0.1:{peer_port}"]
    return NodeProcess(base / name, args=[*args, *extra])


def start_chain3(base: Path, model: Path, *, first_extra: list[str] = ()) -> list[NodeProcess]:
    """Nodes a [0-1], b [2-3], c [4-5] of the split model, b and c dialling a."""
    a = start_slice_node(base, "a", model, "0-1", extra=first_extra)
    return [a, *(start_slice_node(base, name, model, layers, bootstrap=[a.peer_port])
                 for name, layers in (("b", "2-3"), ("c", "4-5")))]


@contextlib.contextmanager
def chain3_and_a_coordinator(base: Path, model: Path, d_config: str, *, d_extra: list[str] = ()):
    """start_chain3 (a at -vv) plus node d holding nothing, with `d_config` as its config.toml,
    dialling a; yields {"model_id", "nodes": [a, b, c, d]} once both a and d can route the model,
    and stops them all after. A node's own config.toml may be written under base/<name> first."""
    a, b, c = start_chain3(base, model, first_extra=["-vv"])
    (base / "d").mkdir(exist_ok=True)
    (base / "d" / "config.toml").write_text(d_config)
    d = NodeProcess(base / "d", args=["--no-default-model", "--no-mdns", "--n-threads", "1", *d_extra,
                                      "--bootstrap", f"127.0.0.1:{a.peer_port}"])
    procs = [a, b, c, d]
    try:
        async def ready():
            for p in procs:
                await p.async_wait_ready()
            await wait_peers(a, 2)  # d holds nothing
            await wait_peers(d, 3)
            model_id = await wait_for_route(a, "split6")
            assert await wait_for_route(d, "split6") == model_id
            return model_id
        yield {"model_id": run(ready()), "nodes": procs}
    finally:
        for p in procs:
            p.terminate()


def start_whole_node(base: Path, name: str, model: Path, *, bootstrap: list[int] = ()) -> NodeProcess:
    """A node serving the model whole with llama.cpp (no --layers), nothing else."""
    args = ["--model", str(model), "--no-default-model", "--no-mdns", "--n-threads", "1"]
    for peer_port in bootstrap:
        args += ["--bootstrap", f"127.0.0.1:{peer_port}"]
    return NodeProcess(base / name, args=args)


def start_coordinator(base: Path, holder: NodeProcess, *, config: str = "", name: str = "c") -> NodeProcess:
    """A node holding no model, dialling `holder`; `config`: its config.toml."""
    if config:
        (base / name).mkdir(exist_ok=True)
        (base / name / "config.toml").write_text(config)
    return NodeProcess(base / name, args=["--no-default-model", "--no-mdns", "--n-threads", "1",
                                          "--bootstrap", f"127.0.0.1:{holder.peer_port}"])


async def routed_through(coordinator: NodeProcess, holder: NodeProcess, model_name: str) -> str:
    """Both nodes up, linked, and the coordinator able to route the model: its id."""
    await holder.async_wait_ready()
    await coordinator.async_wait_ready()
    await wait_peers(coordinator, 1)
    return await wait_for_route(coordinator, model_name)


async def wait_for_route(proc: NodeProcess, model_name: str, timeout_s: float = 60.0) -> str:
    """Wait until the node lists the model as servable; returns its id."""
    async def listed():
        data = await proc.async_get_json("/v1/models")
        ids = [m["id"] for m in data["data"] if m["name"] == model_name]
        return ids[0] if ids else None
    return await wait_until(listed, timeout_s, 0.2, f"{model_name} to be servable via the swarm")


async def wait_peers(proc: NodeProcess, n: int, timeout_s: float = 60.0) -> None:
    await proc.async_wait_ready(timeout_s, path="/health")  # up: its API key is written (it raced a fresh node)

    async def enough():
        data = await proc.async_get_json("/api/admin/peers")
        return sum(1 for p in data["peers"] if p["state"] == "connected" and p["models"]) >= n
    await wait_until(enough, timeout_s, 0.2, f"{n} connected peers with models")


async def chat(proc: NodeProcess, model: str, content: str, *, max_tokens: int, stream: bool = False,
               timeout_s: float = 120.0) -> tuple[int, dict, str]:
    """(status, headers, text or error body) of a greedy chat completion."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.post(
            proc.base + "/v1/chat/completions", json=body, headers=proc.auth) as r:
        if not stream or r.status != 200:
            raw = await r.text()
            if r.status != 200:
                return r.status, dict(r.headers), raw
            return r.status, dict(r.headers), json.loads(raw)["choices"][0]["message"]["content"]
        text, finishes = "", 0
        async for event in SseJson(r):
            if "error" in event:  # headers were sent: the failure comes as an SSE error event
                return 503, dict(r.headers), json.dumps(event)
            text += delta_text(event)
            finishes += len(finish_reasons(event))
        assert finishes == 1
        return r.status, dict(r.headers), text


@dataclass
class SignalledStream:
    """What `stream_and_signal` saw: "ok" or "error" (an SSE error event), the text, the error
    event, the process signalled (None if the stream ended first) and the response headers."""

    outcome: str
    text: str
    error: dict | None
    signalled: NodeProcess | None
    headers: dict


async def stream_and_signal(coordinator: NodeProcess, model_id: str, content: str, max_tokens: int,
                            pick: Callable[[list[str]], NodeProcess], *, after: int = 6,
                            sig: int = signal.SIGKILL) -> SignalledStream:
    """Stream a greedy chat from the coordinator; after `after` SSE chunks (the first is the
    role's) send `sig` to the node `pick(nodes)` names, nodes being the response's x-swarm-nodes."""
    body = {"model": model_id, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": True, "temperature": 0}
    text, signalled, chunks = "", None, 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s, s.post(
            coordinator.base + "/v1/chat/completions", json=body, headers=coordinator.auth) as r:
        assert r.status == 200
        headers = dict(r.headers)
        nodes = r.headers["x-swarm-nodes"].split(",")
        async for event in SseJson(r):
            if "error" in event:
                return SignalledStream("error", text, event, signalled, headers)
            text += delta_text(event)
            chunks += 1
            if chunks == after and signalled is None:
                signalled = pick(nodes)
                signalled.proc.send_signal(sig)
    return SignalledStream("ok", text, None, signalled, headers)


def llama_greedy(model: Path, content: str | list[dict], max_tokens: int) -> str:
    """What llama.cpp generates greedily for the same chat prompt (one user message, or these
    messages) on the whole file."""
    from node.inference.llamacpp import load
    from node.inference.tokenizer import ModelTokenizer

    tok = ModelTokenizer(model)
    ids = tok.chat_tokens([{"role": "user", "content": content}] if isinstance(content, str) else content)
    llm = load().Llama(str(model), n_ctx=SPLIT.n_ctx, n_threads=1, verbose=False)
    out: list[int] = []
    for t in llm.generate(ids, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        if tok.is_eog(t):
            break
        out.append(t)
        if len(out) >= max_tokens:
            break
    llm.close()
    data = b"".join(tok.piece(t) for t in out)
    tok.close()
    return data.decode("utf-8", errors="replace")


def run(coro):
    return asyncio.run(coro)
