"""Peer-link benchmark: round-trip latency and throughput over loopback.

    python bench/link_bench.py [--rtt-iters 2000] [--big-iters 100] [--modes tcp,direct,relayed]

Three transports in one run, the far end always in its own process:
- tcp:     plain TCP, the same 24-byte frame prefix + JSON header, echoed inline (the baseline);
- tls:     the same over the links' TLS 1.3 set-up (preamble + mutual auth), still echoed inline:
           what TLS alone costs, without the link machinery;
- direct:  a PeerManager link (TLS 1.3) to an echo node whose handler is a plain function
           (called inline by the link's reader);
- direct-async: the same with a coroutine handler (one task per frame);
- relayed: as direct, spliced through a relay node (a third process).
RTT: one request in flight, echo of the same payload (8 KiB and 1 MiB), p50/p99 in µs; the modes
are measured in interleaved blocks so background load falls on all of them alike.
Throughput: one-way stream of fire-and-forget frames, then one request to know they all arrived.
Prints figures only; nothing is asserted (speed lives here, never in tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.config import NodeConfig  # noqa: E402
from node.net import Frame, FrameType, Identity, PeerManager, Swarm, load_or_create_identity, write_swarm_file  # noqa: E402, E501
from node.net._connect import async_accept_tls, async_dial_direct  # noqa: E402
from node.net._frames import FLAG_RESPONSE, encode_frame  # noqa: E402
from node.net._link import async_read_frame  # noqa: E402
from node.net._preamble import read_preamble  # noqa: E402
from node.net._stream import Stream, open_stream  # noqa: E402
from node.net._tls import TlsConfig  # noqa: E402

SMALL = 8 * 1024
BIG = 1024 * 1024


# --- far ends (run in their own processes) -------------------------------------------------------

async def _serve_tcp(use_tls: bool, work: Path | None) -> None:
    tls = None
    if use_tls:
        tls = TlsConfig(Identity.generate(), work)
        tls.prepare()

    async def on_frames(stream: Stream) -> None:
        try:
            if tls is not None:
                _, body = await read_preamble(stream)
                await async_accept_tls(stream, tls, body)
            while True:
                frame = await async_read_frame(stream)
                if frame.request_id:
                    stream.writelines(encode_frame(Frame(FrameType.RESULT, {}, frame.payload,
                                                         frame.request_id, FLAG_RESPONSE)))
                    await stream.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            stream.close()

    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Stream(on_connect=lambda s: loop.create_task(on_frames(s))), "127.0.0.1", 0)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await asyncio.Event().wait()


async def _serve_node(data_dir: Path, relay: bool, relays: list[str], async_handler: bool) -> None:
    cfg = NodeConfig(data_dir=data_dir, port=0, peer_port=0, peer_host="127.0.0.1", mdns=False,
                     relay=relay, relays=relays, no_direct=bool(relays))
    manager = PeerManager(cfg, load_or_create_identity(data_dir))

    def echo(link, frame):
        return frame.reply(FrameType.RESULT, {}, frame.payload)

    async def async_echo(link, frame):
        return frame.reply(FrameType.RESULT, {}, frame.payload)

    manager.register_handler(FrameType.WORK, async_echo if async_handler else echo)
    await manager.async_start()
    print(json.dumps({"port": manager.listen_port, "node_id": manager.node_id}), flush=True)
    await asyncio.Event().wait()


BENCH_SWARM = Swarm.create()  # every node and client of one run is a member of this swarm


def _spawn(*args: str) -> tuple[subprocess.Popen, dict]:
    if args[0] == "node":
        write_swarm_file(Path(args[1]), BENCH_SWARM)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", *args], stdout=subprocess.PIPE)
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"far end {args} did not start")
    return proc, json.loads(line)


# --- measuring -------------------------------------------------------------------------------------

class TcpClient:
    """Request/response and streaming over the plain-TCP baseline."""

    def __init__(self, stream: Stream):
        self.stream = stream
        self.rid = 0

    async def request(self, payload: bytes) -> None:
        self.rid += 1
        self.stream.writelines(encode_frame(Frame(FrameType.WORK, {}, payload, self.rid)))
        await self.stream.drain()
        reply = await async_read_frame(self.stream)
        assert reply.request_id == self.rid and len(reply.payload) == len(payload)

    async def send(self, payload: bytes) -> None:
        self.stream.writelines(encode_frame(Frame(FrameType.WORK, {}, payload)))
        await self.stream.drain()


class LinkClient:
    """The same over a PeerManager link."""

    def __init__(self, manager: PeerManager, node_id: str):
        self.manager, self.node_id = manager, node_id

    async def request(self, payload: bytes) -> None:
        reply = await self.manager.async_request(self.node_id, Frame(FrameType.WORK, {}, payload), timeout_s=60)
        assert len(reply.payload) == len(payload)

    async def send(self, payload: bytes) -> None:
        await self.manager.async_send(self.node_id, Frame(FrameType.WORK, {}, payload))


async def measure_rtt(clients: dict, size: int, iters: int, rounds: int = 20) -> dict[str, list[float]]:
    """RTT samples (µs) per mode, interleaved: `rounds` blocks of iters/rounds round trips per mode
    in turn, so that load from other processes falls on every mode alike."""
    payload = os.urandom(size)
    samples: dict[str, list[float]] = {mode: [] for mode in clients}
    for client in clients.values():
        for _ in range(min(50, iters)):
            await client.request(payload)  # warm up
    block = max(1, iters // rounds)
    for _ in range(rounds):
        for mode, client in clients.items():
            for _ in range(block):
                t0 = time.perf_counter()
                await client.request(payload)
                samples[mode].append((time.perf_counter() - t0) * 1e6)
    return samples


async def measure_throughput(client, size: int, stream_bytes: int) -> float:
    """One-way MB/s: fire-and-forget frames, then one request (frames are handled in order)."""
    payload = os.urandom(size)
    count = max(1, stream_bytes // size)
    t0 = time.perf_counter()
    for _ in range(count):
        await client.send(payload)
    await client.request(b"end")
    return count * size / (time.perf_counter() - t0) / 1e6


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def _client_manager(work: Path, name: str, relays: list[str]) -> PeerManager:
    write_swarm_file(work / name, BENCH_SWARM)
    cfg = NodeConfig(data_dir=work / name, port=0, peer_port=0, peer_host="127.0.0.1", mdns=False,
                     relays=relays, no_direct=bool(relays))
    manager = PeerManager(cfg, load_or_create_identity(cfg.data_dir))
    await manager.async_start()
    return manager


async def run(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING)
    results: dict[tuple[str, int], dict] = {}
    procs: list[subprocess.Popen] = []
    managers: list[PeerManager] = []
    sizes = [(SMALL, args.rtt_iters, args.stream_mb * 1_000_000), (BIG, args.big_iters, args.stream_mb * 4_000_000)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            clients: dict[str, TcpClient | LinkClient] = {}
            for mode in args.modes.split(","):
                if mode == "tcp":
                    proc, info = _spawn("tcp")
                    procs.append(proc)
                    clients[mode] = TcpClient(await open_stream("127.0.0.1", info["port"]))
                elif mode == "tls":
                    proc, info = _spawn("tls", str(work / "tls-server"))
                    procs.append(proc)
                    tls = TlsConfig(Identity.generate(), work / "tls-client")
                    await asyncio.get_running_loop().run_in_executor(None, tls.prepare)
                    stream, _ = await async_dial_direct(tls, f"127.0.0.1:{info['port']}", None)
                    clients[mode] = TcpClient(stream)
                elif mode in ("direct", "direct-async"):
                    extra = ["--async-handler"] if mode == "direct-async" else []
                    proc, info = _spawn("node", str(work / f"echo-{mode}"), *extra)
                    procs.append(proc)
                    manager = await _client_manager(work, f"client-{mode}", [])
                    managers.append(manager)
                    await manager.async_connect(f"127.0.0.1:{info['port']}", info["node_id"])
                    clients[mode] = LinkClient(manager, info["node_id"])
                elif mode == "relayed":
                    proc, relay = _spawn("node", str(work / "relay"), "--relay")
                    procs.append(proc)
                    relay_addr = f"127.0.0.1:{relay['port']}"
                    proc, info = _spawn("node", str(work / "echo-relayed"), "--relays", relay_addr)
                    procs.append(proc)
                    manager = await _client_manager(work, "client-relayed", [relay_addr])
                    managers.append(manager)
                    deadline = time.monotonic() + 30
                    while (link := manager.link(info["node_id"])) is None or link.transport != "relayed":
                        if time.monotonic() > deadline:
                            raise RuntimeError("relayed link did not come up")
                        await asyncio.sleep(0.05)
                    clients[mode] = LinkClient(manager, info["node_id"])
                else:
                    raise SystemExit(f"unknown mode {mode}")
            for size, iters, stream_bytes in sizes:
                samples = await measure_rtt(clients, size, iters)
                for mode, client in clients.items():
                    mb_s = await measure_throughput(client, size, stream_bytes)
                    results[(mode, size)] = {"p50_us": statistics.median(samples[mode]),
                                             "p99_us": _pct(samples[mode], 0.99), "mb_s": mb_s}
                    r = results[(mode, size)]
                    print(f"{mode:12s} {size // 1024:5d} KiB  rtt p50 {r['p50_us']:9.1f} µs  "
                          f"p99 {r['p99_us']:9.1f} µs  throughput {r['mb_s']:8.1f} MB/s", flush=True)
        finally:
            for manager in managers:
                await manager.async_stop()
            for proc in procs:
                proc.kill()
                proc.wait()
    for mode in ("tls", "direct", "direct-async"):
        if ("tcp", SMALL) in results and (mode, SMALL) in results:
            extra = results[(mode, SMALL)]["p50_us"] - results[("tcp", SMALL)]["p50_us"]
            verdict = "meets" if extra <= 100 else "MISSES"
            what = "TLS alone adds" if mode == "tls" else f"{mode} link adds"
            print(f"{what} {extra:.1f} µs p50 RTT over plain TCP at 8 KiB"
                  + (f" ({verdict} the ≤ 100 µs target)" if mode != "tls" else ""))
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")


def main() -> None:
    """Entry point (also the far ends, with --serve)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="tcp,tls,direct,direct-async,relayed")
    parser.add_argument("--rtt-iters", type=int, default=2000, help="round trips at 8 KiB")
    parser.add_argument("--big-iters", type=int, default=100, help="round trips at 1 MiB")
    parser.add_argument("--stream-mb", type=int, default=20, help="MB streamed at 8 KiB (×4 at 1 MiB)")
    parser.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--relay", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--relays", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--async-handler", action="store_true", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.serve:
        logging.basicConfig(level=logging.WARNING)
        if args.serve[0] in ("tcp", "tls"):
            asyncio.run(_serve_tcp(args.serve[0] == "tls", Path(args.serve[1]) if len(args.serve) > 1 else None))
        else:
            asyncio.run(_serve_node(Path(args.serve[1]), args.relay, args.relays, args.async_handler))
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
