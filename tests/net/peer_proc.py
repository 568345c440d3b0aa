"""A bare peer-network node in its own process, for tests (SIGKILL, namespaces, fuzzing).

    python -m tests.net.peer_proc --data-dir D --status S [--peer-port P] [--bootstrap H:P]...
        [--relay] [--relays H:P]... [--no-direct] [--mdns] [--echo] [--probe MARKER]
        [--tap FILE] [--host 0.0.0.0]

It writes its state as JSON to the status file (atomically) whenever a peer changes:
{"node_id", "peer_port", "peers": [PeerSnapshot...], "connections", "probes": {node_id: "ok"|error},
 "relay": stats}. --echo answers WORK with RESULT carrying the same payload; --probe sends one WORK
request with the marker in its payload to every peer that connects (relays excepted); --tap
appends every byte a relay forwards to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
from pathlib import Path

from node.config import NodeConfig
from node.logs import setup_logging
from node.net import Frame, FrameType, PeerManager, load_or_create_identity


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--status", required=True, type=Path)
    p.add_argument("--peer-port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--relays", action="append", default=[])
    p.add_argument("--relay", action="store_true")
    p.add_argument("--no-direct", action="store_true")
    p.add_argument("--mdns", action="store_true")
    p.add_argument("--clock-offset-s", type=float, default=0.0, help="shift this node's clock (Clock.offset_s)")
    p.add_argument("--echo", action="store_true")
    p.add_argument("--probe", default=None)
    p.add_argument("--tap", type=Path, default=None)
    p.add_argument("--const", action="append", default=[], help="NAME=VALUE overrides of node.const")
    return p.parse_args(argv)


async def _main(args: argparse.Namespace, tap_file) -> None:
    from node import const

    for item in args.const:
        name, _, value = item.partition("=")
        setattr(const, name, type(getattr(const, name))(value))
    cfg = NodeConfig(data_dir=args.data_dir, port=0, peer_port=args.peer_port, peer_host=args.host,
                     bootstrap=args.bootstrap, relays=args.relays, relay=args.relay,
                     no_direct=args.no_direct, mdns=args.mdns)
    manager = PeerManager(cfg, load_or_create_identity(args.data_dir),
                          models_provider=lambda: [{"model_id": "tiny", "layers": [0, 2], "n_layers": 2}])
    manager.clock.offset_s = args.clock_offset_s
    probes: dict[str, str] = {}

    def write_status(*_: object) -> None:
        status = {
            "node_id": manager.node_id, "peer_port": manager.listen_port, "pid": os.getpid(),
            "peers": [p.as_dict() for p in manager.peers()], "connections": manager.connection_count(),
            "probes": probes, "relay": manager.relay.stats() if manager.relay else None,
            "reachable_at": manager.reachable_at(),
        }
        tmp = args.status.with_suffix(".tmp")
        tmp.write_text(json.dumps(status))
        os.replace(tmp, args.status)

    async def echo(link, frame: Frame) -> Frame:
        return frame.reply(FrameType.RESULT, {"echo": True}, frame.payload)

    async def probe(node_id: str) -> None:
        payload = (args.probe + " ").encode() * 64
        try:
            reply = await manager.async_request(node_id, Frame(FrameType.WORK, {"probe": args.probe}, payload),
                                                timeout_s=20)
            probes[node_id] = "ok" if reply.payload == payload else "wrong payload"
        except Exception as exc:  # reported through the status file
            probes[node_id] = f"{type(exc).__name__}: {exc}"
        write_status()

    def on_peer(kind: str, snap) -> None:
        if (args.probe and kind == "changed" and snap.state == "connected" and not snap.is_relay
                and snap.node_id not in probes):
            probes[snap.node_id] = "pending"
            asyncio.get_running_loop().create_task(probe(snap.node_id))
        write_status()

    if args.echo:
        manager.register_handler(FrameType.WORK, echo)
    if manager.relay is not None and tap_file is not None:
        def tap(circuit: str, direction: str, data: bytes) -> None:
            tap_file.write(data)
            tap_file.flush()
        manager.relay.tap = tap
    manager.subscribe(on_peer)
    await manager.async_start()
    write_status()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    while not stop.is_set():
        try:
            async with asyncio.timeout(1.0):
                await stop.wait()
        except TimeoutError:
            write_status()
    await manager.async_stop()
    write_status()


def main() -> None:
    """Entry point."""
    args = _args()
    setup_logging(2, None)
    logging.getLogger("node.net._link").setLevel(logging.INFO)  # no per-frame lines
    # Test-only: the tap writes on the loop (a relay in production has no tap).
    tap_file = open(args.tap, "ab") if args.tap else None  # noqa: SIM115 (lives as long as the process)
    asyncio.run(_main(args, tap_file))


if __name__ == "__main__":
    main()
