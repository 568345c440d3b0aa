"""Helpers for app tests: deadline polling, hermetic node configs, a running TrayApp."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

from node.config import NodeConfig

DEADLINE_S = 90.0  # generous: the test machine may be two busy cores


async def async_until(predicate: Callable[[], object], what: str, timeout_s: float = DEADLINE_S) -> None:
    """Poll a condition on the loop until it holds or the deadline passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def http_file(path: str, handler):
    """A local HTTP server with one GET route; yields that route's URL (a download source)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}{path}"  # noqa: SLF001
    finally:
        await runner.cleanup()


def node_config(data_dir, *models, port: int = 0, **overrides) -> NodeConfig:
    """A hermetic node config: own data dir, no default model, one compute thread."""
    return NodeConfig(data_dir=data_dir, port=port, include_default_model=False,
                      models=[str(m) for m in models], log_to_file=False, n_threads=1, mdns=False, peer_host="127.0.0.1",
                      **overrides)


@contextlib.asynccontextmanager
async def running_app(config: NodeConfig, **kwargs):
    """A TrayApp running its whole life (`async_run`) until the block ends, then quit cleanly."""
    from app.host import AppState
    from app.tray_app import TrayApp

    tray_app = TrayApp(config, **kwargs)
    task = asyncio.ensure_future(tray_app.async_run())
    try:
        await async_until(lambda: tray_app.host.state not in (AppState.STARTING, AppState.LOADING)
                          or task.done(), "the node to start")
        yield tray_app
    finally:
        tray_app.request_quit()
        await task


def port_is_free(port: int) -> bool:
    """True when a new listener can bind the port (as the next node start would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
