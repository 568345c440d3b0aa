"""A bounded soak with faults: a swarm on loopback, clients sending mixed requests, a chaos loop
killing nodes.

    python bench/soak.py [--requests 2000] [--clients 6] [--max-minutes 40] [--seed 1]

The swarm: model M (random f32 llama, 6 layers) split in 3 segments, each held by two nodes (a
primary and a standby), and model W (random, 2 layers) served whole by llama.cpp. The coordinator
C holds M's layers 0-1 and W whole, and takes every client request; the other five nodes bootstrap
to it. C is never killed; every `--chaos-every` seconds (random within the range) the chaos loop
SIGKILLs one other node, leaves it dead for `--down` seconds and restarts it (same data dir, same
ports), one node down at a time.

Clients send a fixed number of requests, each drawn from a seeded mix: M or W, chat or text,
stream or not, short or long, and a tenth of the streams cancelled by the client after two chunks.
Every reply is greedy (temperature 0) and checked against llama.cpp on the same file (the anchor).
A request is
  ok      200 and exactly llama.cpp's text (a cancelled stream: a prefix of it);
  failed  a clean OpenAI error: a 4xx/5xx with {"error": {...}}, or a stream ending in an SSE
          error event and [DONE];
  lost    anything else: no answer within the deadline, a broken connection, a 200 with other
          text, a body that is not the OpenAI shape.
It prints the counts, per-node RSS and open fds over time (and each node's RSS growth after
warm-up, per process incarnation), the KV sessions and in_flight counts once the clients stop,
and the CPU. The request loops are bounded in count and in time and stop by themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.soak_swarm import SEGMENTS, SPLIT, WHOLE, NodeProc, Swarm, make_swarm  # noqa: E402

PROMPTS = [f"question {i}: what do peers {w} in a swarm?" for i, w in enumerate(
    ["share", "hold", "send", "ask", "serve", "split", "find", "keep", "drop", "join", "leave", "route"])]
SHORT, LONG = 6, 40


def cpu_name() -> str:
    """The CPU model, as the kernel names it."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# --- the anchor ----------------------------------------------------------------------------------


def llama_references(path: Path, n_ctx: int) -> dict[tuple[str, int, int], str]:
    """llama.cpp's greedy text for every (kind, prompt index, max_tokens) the clients may send."""
    from node.inference.llamacpp import load
    from node.inference.tokenizer import ModelTokenizer

    tok = ModelTokenizer(path)
    llm = load().Llama(str(path), n_ctx=n_ctx, n_threads=1, verbose=False)
    out: dict[tuple[str, int, int], str] = {}
    try:
        for kind in ("chat", "text"):
            for i, prompt in enumerate(PROMPTS):
                ids = tok.chat_tokens([{"role": "user", "content": prompt}]) if kind == "chat" else tok.tokenize(prompt)
                tokens: list[int] = []
                for t in llm.generate(ids, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
                    if tok.is_eog(t) or len(tokens) >= LONG:
                        break
                    tokens.append(t)
                llm.reset()
                for n in (SHORT, LONG):
                    out[(kind, i, n)] = b"".join(tok.piece(t) for t in tokens[:n]).decode("utf-8", errors="replace")
    finally:
        llm.close()
        tok.close()
    return out


# --- clients -------------------------------------------------------------------------------------


@dataclass
class Tally:
    ok: int = 0
    failed: int = 0
    lost: int = 0
    wrong: int = 0  # lost with a 200 and other text
    cancelled: int = 0  # cancelled by the client (counted in ok when the prefix was right)
    by_status: dict[str, int] = field(default_factory=dict)
    lost_examples: list[str] = field(default_factory=list)
    progress: asyncio.Event = field(default_factory=asyncio.Event)  # set after every request

    @property
    def total(self) -> int:
        return self.ok + self.failed + self.lost

    def note(self, outcome: str, detail: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        self.progress.set()
        if outcome != "ok":
            self.by_status[detail.split(":", 1)[0]] = self.by_status.get(detail.split(":", 1)[0], 0) + 1
        if outcome == "lost" and len(self.lost_examples) < 10:
            self.lost_examples.append(detail)


def _clean_error(body: object) -> bool:
    err = body.get("error") if isinstance(body, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and isinstance(err.get("type"), str)


async def one_request(session: aiohttp.ClientSession, c: NodeProc, model: str, kind: str, i: int, n: int,
                      stream: bool, cancel: bool, expected: str, deadline_s: float) -> tuple[str, str]:
    """Send one request; (outcome, detail)."""
    body: dict = {"model": model, "max_tokens": n, "temperature": 0, "stream": stream}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": PROMPTS[i]}]
        url = c.base + "/v1/chat/completions"
    else:
        body["prompt"] = PROMPTS[i]
        url = c.base + "/v1/completions"
    try:
        async with asyncio.timeout(deadline_s):
            async with session.post(url, json=body, headers={"Authorization": f"Bearer {c.api_key}"}) as r:
                if r.status != 200:
                    raw = await r.read()
                    try:
                        parsed = json.loads(raw)
                    except ValueError:
                        return "lost", f"{r.status}: not JSON: {raw[:120]!r}"
                    return ("failed", f"{r.status}: {parsed['error'].get('code')}") if _clean_error(parsed) \
                        else ("lost", f"{r.status}: not an OpenAI error: {raw[:120]!r}")
                if not stream:
                    data = await r.json()
                    ch = data["choices"][0]
                    text = ch["message"]["content"] if kind == "chat" else ch["text"]
                    return ("ok", "200") if text == expected else ("wrong", f"200: {text!r} != {expected!r}")
                text, chunks, done, finishes = "", 0, False, 0
                async for line in r.content:
                    line = line.strip()
                    if line == b"data: [DONE]":
                        done = True
                        break
                    if not line.startswith(b"data: {"):
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        rest = [ln.strip() async for ln in r.content]
                        clean = _clean_error(event) and b"data: [DONE]" in rest
                        return ("failed", f"stream: {event['error'].get('code')}") if clean \
                            else ("lost", f"stream: error event without [DONE]: {event}")
                    for ch in event.get("choices", []):
                        text += (ch.get("delta", {}).get("content") if kind == "chat" else ch.get("text")) or ""
                        finishes += bool(ch.get("finish_reason"))
                    chunks += 1
                    if cancel and chunks >= 2:
                        break  # the client goes away mid-stream
                if cancel and not done:
                    return ("cancelled", "200") if expected.startswith(text) \
                        else ("wrong", f"200 (cancelled): {text!r} is not a prefix of {expected!r}")
                if not done or finishes != 1:
                    return "lost", f"200: stream ended without [DONE] or with {finishes} finish chunks"
                return ("ok", "200") if text == expected else ("wrong", f"200 stream: {text!r} != {expected!r}")
    except TimeoutError:
        return "lost", f"timeout: no complete answer within {deadline_s:.0f} s"
    except (aiohttp.ClientError, OSError, ValueError, KeyError, TypeError) as exc:
        return "lost", f"client: {type(exc).__name__}: {exc}"


async def client_loop(session, swarm: Swarm, refs: dict, rng: random.Random, budget: list[int], tally: Tally,
                      stop_at: float, deadline_s: float) -> None:
    while budget[0] > 0 and time.monotonic() < stop_at:
        budget[0] -= 1
        whole = rng.random() < 0.25
        kind = rng.choice(("chat", "text"))
        i = rng.randrange(len(PROMPTS))
        n = SHORT if rng.random() < 0.6 else LONG
        stream = rng.random() < 0.5
        cancel = stream and rng.random() < 0.1
        model = swarm.whole_id if whole else swarm.split_id
        expected = refs["W" if whole else "M"][(kind, i, n)]
        outcome, detail = await one_request(session, swarm.coordinator, model, kind, i, n, stream, cancel,
                                            expected, deadline_s)
        if outcome == "cancelled":
            tally.cancelled += 1
            outcome = "ok"
        if outcome == "wrong":
            tally.wrong += 1
            outcome = "lost"
        tally.note(outcome, detail)


async def chaos_loop(swarm: Swarm, session, rng: random.Random, every_s: tuple[float, float],
                     down_s: tuple[float, float], stop: asyncio.Event, log: list[str], t0: float,
                     kill_when: list[Callable[[], bool]] | None = None, targeted: float = 0.5,
                     progress: asyncio.Event | None = None) -> int:
    """Kill a node, leave it down for `down_s`, restart it and wait until it is ready.

    Paced by time (`every_s`, one node down at a time), or by the clients' progress (`kill_when`:
    one kill as each condition comes true, the restarts running meanwhile, so a short run still
    gets every kill; two nodes may then be down at once)."""
    kills = 0
    down: set[str] = set()
    restarts: list[asyncio.Task] = []

    async def bounce(victim: NodeProc) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(*down_s))
        victim.start()
        try:
            await victim.ready(session)
            await _linked_to_coordinator(swarm, victim, session)
            log.append(f"{time.monotonic() - t0:7.1f}s  {victim.name} back (incarnation {victim.incarnation})")
        except (RuntimeError, TimeoutError) as exc:
            log.append(f"{time.monotonic() - t0:7.1f}s  {victim.name} did not come back: {exc}")
        finally:
            down.discard(victim.name)

    pending = list(kill_when or [])
    assert kill_when is None or progress is not None
    while not stop.is_set():
        if kill_when is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.uniform(*every_s))
        else:
            if not pending:
                break
            while not pending[0]() and not stop.is_set():
                await progress.wait()  # set by the clients after each request
                progress.clear()
            pending.pop(0)
        if stop.is_set():
            break
        victim, why = await _pick_victim(swarm, session, rng, targeted, down)
        if victim is None:
            continue
        await asyncio.to_thread(victim.kill)
        down.add(victim.name)
        kills += 1
        log.append(f"{time.monotonic() - t0:7.1f}s  SIGKILL {victim.name} ({why})")
        if kill_when is None:
            await bounce(victim)
        else:
            restarts.append(asyncio.create_task(bounce(victim)))
    await asyncio.gather(*restarts)
    return kills


async def _linked_to_coordinator(swarm: Swarm, n: NodeProc, session, timeout_s: float = 60.0) -> None:
    """Until the coordinator is linked to n again and sees its layers (n is back for the swarm)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, OSError, KeyError):
            rows = (await swarm.coordinator.get_json(session, "/api/admin/peers"))["peers"]
            if any(p["short_id"] == n.short_id and p["state"] == "connected" and p["models"] for p in rows):
                return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the coordinator did not relink to {n.name}")


def _layers(n: NodeProc) -> str:
    return n.args[n.args.index("--layers") + 1]


async def _pick_victim(swarm: Swarm, session, rng: random.Random, targeted: float,
                       down: set[str]) -> tuple[NodeProc | None, str]:
    """With probability `targeted` a node in the chain of a request in flight (a kill mid-request),
    else any node but the coordinator; never one that is down or restarting, nor the last holder
    of its layers that is up (the swarm stays able to serve: a 503 is then a fault, not the plan)."""
    down_layers = {_layers(n) for n in swarm.others if n.name in down}
    up = [n for n in swarm.others if n.name not in down and _layers(n) not in down_layers]
    if rng.random() < targeted:
        with contextlib.suppress(aiohttp.ClientError, OSError, KeyError):
            live = await swarm.coordinator.get_json(session, "/api/admin/requests")
            in_chains = {seg["node_short_id"] for t in live["in_flight"] for seg in t.get("segments", [])}
            busy = [n for n in up if n.short_id in in_chains]
            if busy:
                return rng.choice(busy), "in a live chain"
    return (rng.choice(up), "at random") if up else (None, "")


async def sampler(swarm: Swarm, stop: asyncio.Event, t0: float, every_s: float = 1.0) -> None:
    while not stop.is_set():
        t = time.monotonic() - t0
        for n in swarm.nodes:
            n.sample(t)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


# --- the run -------------------------------------------------------------------------------------


@dataclass
class SoakResult:
    tally: Tally
    kills: int
    elapsed_s: float
    end_stats: dict[str, dict]  # node → /api/admin/stats at the end
    rss_growth: dict[str, tuple[float, float] | None]  # node → (% RSS growth after warm-up, over seconds)
    chaos_log: list[str]
    failovers: int  # requests the coordinator served with assemblies > 1
    report: str


async def soak(*, requests: int, clients: int, max_s: float, seed: int, chaos_every_s: tuple[float, float],
               down_s: tuple[float, float], deadline_s: float, workdir: Path, quiesce_s: float = 60.0,
               kill_at: tuple[float, ...] = (), targeted: float = 0.5, out=print) -> SoakResult:
    """Run the soak (see the module docstring). `kill_at`: kill when these fractions of the requests
    are done instead of on a timer (a short run still gets its kills)."""
    swarm = await asyncio.to_thread(make_swarm, workdir)  # writes the models: off the loop
    out(f"cpu: {cpu_name()} ({os.cpu_count()} logical), python {platform.python_version()}")
    out(f"swarm: C (layers {SEGMENTS[0]} + {WHOLE.name} whole) and " + ", ".join(
        f"{n.name} ({_layers(n)})" for n in swarm.others))
    refs = {"M": await asyncio.to_thread(llama_references, swarm.split_path, SPLIT.n_ctx),
            "W": await asyncio.to_thread(llama_references, swarm.whole_path, WHOLE.n_ctx)}
    tally, chaos_log = Tally(), []
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        try:
            swarm.coordinator.start()
            await swarm.coordinator.ready(session)
            for n in swarm.others:
                n.start()
            for n in swarm.others:
                await n.ready(session)
            await _wait_for_chain(swarm, session)
            for n in swarm.nodes:
                n.short_id = (await n.get_json(session, "/api/admin/stats"))["short_id"]
            out(f"swarm ready: {swarm.split_id} across 3 segments x 2, {swarm.whole_id} whole on C")
            t0 = time.monotonic()
            stop = asyncio.Event()
            sampling = asyncio.create_task(sampler(swarm, stop, t0))
            kill_when = [(lambda f=f: tally.total >= f * requests) for f in kill_at] if kill_at else None
            chaos = asyncio.create_task(chaos_loop(swarm, session, random.Random(seed + 1), chaos_every_s, down_s,
                                                   stop, chaos_log, t0, kill_when, targeted, tally.progress))
            budget = [requests]
            stop_at = t0 + max_s
            await asyncio.gather(*(client_loop(session, swarm, refs, random.Random(seed * 1000 + k), budget, tally,
                                               stop_at, deadline_s) for k in range(clients)))
            elapsed = time.monotonic() - t0
            stop.set()
            tally.progress.set()  # a chaos loop waiting for progress sees the stop
            kills = await chaos
            await sampling
            for n in swarm.others:  # the last victim may still be starting
                if n.alive:
                    with contextlib.suppress(RuntimeError, TimeoutError):
                        await n.ready(session)
            end_stats = await _quiesce(swarm, session, quiesce_s)
            failovers = sum(1 for line in (swarm.coordinator.data_dir / "node.log").read_text(errors="replace")
                            .splitlines() if "DIAG: request complete" in line and "assemblies=" in line)
        finally:
            await asyncio.gather(*(asyncio.to_thread(n.stop) for n in swarm.nodes))
    growth = {n.name: _growth(n) for n in swarm.nodes}
    report = _report(swarm, tally, kills, elapsed, end_stats, growth, chaos_log, failovers, requests)
    out(report)
    return SoakResult(tally, kills, elapsed, end_stats, growth, chaos_log, failovers, report)


async def _wait_for_chain(swarm: Swarm, session, timeout_s: float = 120.0) -> None:
    """Until C lists both models and every other node is linked to C."""
    c = swarm.coordinator
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        models = await c.get_json(session, "/v1/models")
        by_name = {m["name"]: m["id"] for m in models["data"]}
        peers = await c.get_json(session, "/api/admin/peers")
        linked = sum(1 for p in peers["peers"] if p["state"] == "connected" and p["models"])
        if SPLIT.name in by_name and WHOLE.name in by_name and linked >= len(swarm.others):
            swarm.split_id, swarm.whole_id = by_name[SPLIT.name], by_name[WHOLE.name]
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the swarm did not assemble")


async def _quiesce(swarm: Swarm, session, timeout_s: float) -> dict[str, dict]:
    """Poll every node until no KV session, trace or pipeline is left (or the deadline); the stats."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = {}
        for n in swarm.nodes:
            if n.alive:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    stats[n.name] = await n.get_json(session, "/api/admin/stats")
        idle = all(s["kv_sessions"] == 0 and s["in_flight"]["traces"] == 0 and s["in_flight"]["pipelines"] == 0
                   for s in stats.values())
        if (idle and len(stats) == len(swarm.nodes)) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.5)


def _growth(n: NodeProc) -> tuple[float, float] | None:
    """(RSS growth %, seconds observed) of the node's longest-lived incarnation, from its sample
    after warm-up (a quarter of its life, at least 10 s in) to its last; None if it lived < 30 s."""
    best = max(n.rss_mb.values(), key=lambda s: s[-1][0] - s[0][0] if s else 0, default=[])
    if not best or best[-1][0] - best[0][0] < 30:
        return None
    start = best[0][0]
    warm_at = max(start + (best[-1][0] - start) / 4, start + 10)
    warm = next(rss for t, rss in best if t >= warm_at)
    return (best[-1][1] - warm) / warm * 100, best[-1][0] - warm_at


def _report(swarm, tally, kills, elapsed, end_stats, growth, chaos_log, failovers, asked) -> str:
    lines = ["", f"requests: {tally.total} of {asked} in {elapsed:.0f} s ({tally.total / max(elapsed, 1e-9):.1f}/s)",
             f"  ok {tally.ok} (of which {tally.cancelled} cancelled by the client mid-stream, prefix right)",
             f"  failed with a clean OpenAI error {tally.failed}  "
             + ", ".join(f"{k}={v}" for k, v in sorted(tally.by_status.items()) if k != "timeout"),
             f"  lost {tally.lost} (wrong text {tally.wrong})",
             f"node kills: {kills}; requests that failed over (assemblies>1): {failovers}"]
    lines += [f"    lost: {ex}" for ex in tally.lost_examples]
    lines.append("rss MB / open fds over time (every ~10 s; '-' = not running):")
    t_max = max((s[-1][0] for n in swarm.nodes for s in n.rss_mb.values() if s), default=0)
    header = "     t " + "".join(f"{n.name:>14}" for n in swarm.nodes)
    lines.append(header)
    for t in range(0, int(t_max) + 1, 10):
        row = f"{t:5d}s "
        for n in swarm.nodes:
            cell = "-"
            for inc, samples in n.rss_mb.items():
                near = [(abs(st - t), rss, n.fds[inc][k][1]) for k, (st, rss) in enumerate(samples) if abs(st - t) < 1.5]
                if near:
                    _, rss, fd = min(near)
                    cell = f"{rss:.0f}/{fd}"
            row += f"{cell:>14}"
        lines.append(row)
    lines.append("rss growth after warm-up (longest-lived incarnation, over the seconds shown): " + ", ".join(
        f"{k} {'n/a (<30 s)' if v is None else f'{v[0]:+.1f}% ({v[1]:.0f} s)'}" for k, v in growth.items()))
    lines.append("at the end: " + ", ".join(
        f"{k} kv_sessions={s['kv_sessions']} in_flight={s['in_flight']['traces']}/{s['in_flight']['pipelines']}"
        for k, s in end_stats.items()))
    lines.append("chaos:")
    lines += ["  " + line for line in chaos_log]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--max-minutes", type=float, default=40.0, help="stop sending after this long anyway")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chaos-every", type=float, nargs=2, default=(3.0, 6.0), metavar=("MIN_S", "MAX_S"))
    ap.add_argument("--down", type=float, nargs=2, default=(1.0, 3.0), metavar=("MIN_S", "MAX_S"))
    ap.add_argument("--deadline", type=float, default=60.0, help="seconds a request may take before it is lost")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the nodes' data dirs and logs here")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="swarmllm-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir: {workdir}")
    result = asyncio.run(soak(requests=args.requests, clients=args.clients, max_s=args.max_minutes * 60,
                              seed=args.seed, chaos_every_s=tuple(args.chaos_every), down_s=tuple(args.down),
                              deadline_s=args.deadline, workdir=workdir))
    t = result.tally
    idle = all(s["kv_sessions"] == 0 and s["in_flight"]["traces"] == 0 and s["in_flight"]["pipelines"] == 0
               for s in result.end_stats.values())
    print(f"targets: lost 0 -> {t.lost}; wrong 0 -> {t.wrong}; idle at the end -> {idle}")
    return 0 if t.lost == 0 and idle else 1


if __name__ == "__main__":
    sys.exit(main())
