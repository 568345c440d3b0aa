"""Helpers for app tests: a running TrayApp, a local download source, the app tests' deadline.

Waiting, ports and node configs are the suite's own (tests.support.waiting, .ports, .nodes).
"""

from __future__ import annotations

import asyncio
import contextlib

from node.config import NodeConfig
from tests.support.waiting import wait_until

DEADLINE_S = 90.0  # generous: the test machine may be two busy cores


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


@contextlib.asynccontextmanager
async def running_app(config: NodeConfig, **kwargs):
    """A TrayApp running its whole life (`async_run`) until the block ends, then quit cleanly."""
    from app.host import AppState
    from app.tray_app import TrayApp

    tray_app = TrayApp(config, **kwargs)
    task = asyncio.ensure_future(tray_app.async_run())
    try:
        def started() -> bool:
            return tray_app.host.state not in (AppState.STARTING, AppState.LOADING) or task.done()
        await wait_until(started, DEADLINE_S, what="the node to start")
        yield tray_app
    finally:
        tray_app.request_quit()
        await task
