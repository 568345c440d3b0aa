"""TrayApp: puts the host, the tray, the window and the node's lifecycle together.

`async_run()` is the app's whole life on the qasync loop: show the tray (or the window where the
platform has no tray), start the node, wait for Quit (menu, window close without a tray, SIGTERM
or SIGINT), then stop the node so the API port, models and KV sessions are freed.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections.abc import Callable

from PySide6.QtWidgets import QSystemTrayIcon

from app.actions import AppActions
from app.host import AppState, NodeHost
from app.tray import Tray
from app.ui.feeds import NodeFeeds
from app.ui.main_window import MainWindow
from node.config import NodeConfig
from node.stopping import stop_signals

log = logging.getLogger(__name__)


class TrayApp:
    """The desktop app around one node."""

    def __init__(self, config: NodeConfig, *, show_window: bool = False, tray_available: bool | None = None):
        self.host = NodeHost(config)
        self.actions = AppActions(self.host)
        self.feeds = NodeFeeds(self.host)
        if tray_available is None:
            tray_available = QSystemTrayIcon.isSystemTrayAvailable()
        self.tray_available = tray_available
        self.show_window_at_start = show_window or not tray_available
        self.window = MainWindow(self.host, self.feeds, self.actions, tray_available=tray_available,
                                 on_quit=self.request_quit)
        self.tray = Tray(self.host, self.actions, on_open=self.window.bring_up, on_quit=self.request_quit,
                         on_invite=self._invite, on_join=self._join)
        self.feeds.peers.modelReset.connect(self.tray.refresh_swarm)  # a join or leave resets the peers
        self.feeds.peers.rowsInserted.connect(self.tray.refresh_swarm)
        self.feeds.peers.dataChanged.connect(self.tray.refresh_swarm)
        self.host.swarm_changed.connect(self.tray.refresh_swarm)  # (alone: no peer row changes)
        self._quit = asyncio.Event()
        self.exit_code = 0

    @property
    def node(self):
        return self.host.node

    def _invite(self) -> None:
        self.window.bring_up()
        self.window.show_tab("Peers")
        self.window.peers_tab.invite()

    def _join(self) -> None:
        self.window.bring_up()
        self.window.show_tab("Peers")
        self.window.peers_tab.join()

    def request_quit(self) -> None:
        """Quit from anywhere (menu, window, signal); the shutdown itself runs in async_run."""
        if not self._quit.is_set():
            log.info("DIAG: tray quit requested")
        self._quit.set()

    async def async_start(self) -> bool:
        """Show the tray (or the window) and start the node; False if the node failed to start."""
        if self.tray_available:
            self.tray.show()
        if self.show_window_at_start:
            self.window.bring_up()
        ok = await self.host.async_start()
        freeze_startup_objects()
        if self.host.first_run_text() is not None:
            # Nothing can serve: say so where the user will see it.
            self.window.show_tab("Overview")
            self.window.bring_up()
        if not ok:
            self.exit_code = 1
        return ok

    async def async_wait_quit(self) -> None:
        await self._quit.wait()

    async def async_shutdown(self) -> None:
        """Stop the node (port, models, KV freed), then take the tray and window down."""
        self.feeds.detach()
        await self.host.async_stop()
        gc.unfreeze()
        self.tray.hide()
        self.window.tray_available = True  # closing now must not re-request quit
        self.window.close()
        log.info("DIAG: tray app stopped state=%s", AppState.STOPPING.value)

    async def async_run(self) -> int:
        """The app's whole life; returns the process exit code."""
        remove_handlers = install_quit_signals(self.request_quit)
        try:
            start = asyncio.ensure_future(self.async_start())
            quit_asked = asyncio.ensure_future(self.async_wait_quit())
            await asyncio.wait({start, quit_asked}, return_when=asyncio.FIRST_COMPLETED)
            if not start.done():
                # Quit while the node starts (hashing or loading a large model): give the start up
                # rather than finish it first; the shutdown below stops what it had started.
                log.info("DIAG: tray quit during start-up state=%s", self.host.state.value)
                start.cancel()
                await asyncio.gather(start, return_exceptions=True)
            else:
                start.result()  # a start that raised (a bug past the node's own errors) ends the app, not
                # a wait for Quit in the starting state
            await quit_asked
        finally:
            await self.async_shutdown()
            remove_handlers()
        return self.exit_code


def freeze_startup_objects() -> None:
    """Keep the start-up heap (Qt, torch, numpy, the node: ~200k objects) out of cyclic GC.

    A full collection over that heap takes 100-200 ms on the loop thread, which showed up as the
    largest event-loop stall while a stream was running (the loop-latency test). Freezing is
    instant (no collection first: that would itself be the stall we avoid); later collections
    only scan objects made after start-up. (The log line once counted the frozen objects,
    `gc.get_freeze_count()`: a walk of the whole heap, 20 ms at start-up and 0.26 s in a test
    process's heap, on the loop.)
    """
    started = time.perf_counter()
    gc.freeze()
    log.info("DIAG: gc freeze elapsed_ms=%d", (time.perf_counter() - started) * 1000)


def install_quit_signals(on_quit: Callable[[], None]) -> Callable[[], None]:
    """SIGTERM, SIGINT and SIGHUP (the terminal that started `swarmllm-tray` closed; not when it is
    ignored: nohup) request a clean quit, as they stop `swarmllm run` (node.stopping.stop_signals;
    SIGHUP's default ended the app at once until 2026-12-06: no drain, the node's files and
    sessions left as they were). Returns a function that removes the handlers."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in stop_signals():
        try:
            loop.add_signal_handler(sig, on_quit)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
            try:
                signal.signal(sig, lambda *_a: loop.call_soon_threadsafe(on_quit))
            except ValueError:
                pass

    def remove() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return remove
