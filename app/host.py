"""NodeHost: owns the node object inside the app, its lifecycle and the app-level state.

The node is started and stopped on the running loop (qasync's QEventLoop). State is derived from
node events (model, slice host, peer and contribution observers, start/stop outcome), never by
polling: every change emits `state_changed`, which the tray icon, the status bar and the first-run banner follow. The banner's
text also names what changes with no state change (a file the folder watch skipped, a download's
progress): the Models tab's folder-watch timer reads it again (`FirstRunBanner.update_from_host`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.serving import Serving, serving_of
from app.tasks import spawn
from node.config import NodeConfig
from node.datadir import MODELS_DIR, DataDirInUse, data_dir_error
from node.errors import NodeError
from node.node import Node
from node.resources import DEFAULT_MODEL_FILE, default_model_path

log = logging.getLogger(__name__)


class AppState(StrEnum):
    """What the tray icon tells at a glance."""

    STARTING = "starting"
    LOADING = "loading"  # a model is loading and none serves yet
    SERVING = "serving"
    PAUSED = "paused"  # serving locally, not contributing to peers
    NO_MODEL = "no_model"
    ERROR = "error"
    STOPPING = "stopping"


STATE_WORDS = {
    AppState.STARTING: "starting",
    AppState.LOADING: "loading a model",
    AppState.SERVING: "serving",
    AppState.PAUSED: "serving (contributing paused)",
    AppState.NO_MODEL: "no model can serve",
    AppState.ERROR: "error",
    AppState.STOPPING: "stopping",
}


class NodeHost(QObject):
    """The app's handle on its node: start, stop, load/unload, pause, and the derived state."""

    state_changed = Signal(str)
    started = Signal()  # the node is up (peers may now be attached)
    # this node's swarm changed (a join, a leave, a removal asked here): no peer event says so when
    # no peer is in the table, and the Peers tab and the tray kept naming the swarm it had left
    swarm_changed = Signal()

    def __init__(self, config: NodeConfig, parent: QObject | None = None):
        super().__init__(parent)
        self.node = Node(config)
        self.state = AppState.STARTING
        self.start_error: str | None = None
        # why the last "Add model file…" was refused (not a GGUF, truncated): the first-run banner says
        # it, wherever the Add was clicked (the Overview's banner, where the Models tab's line is not seen)
        self.add_error: str | None = None
        self.is_started = False
        self._unsubscribe = self.node.models.subscribe(self._on_model_event)
        # layer slices load, fail and go after the start too (--serve auto, "Help serve", a resume)
        self._unsubscribe_slices = self.node.slice_host.subscribe(self._on_slice_event)
        self._unsubscribe_peers: Callable[[], None] = lambda: None
        self._unsubscribe_contributions = self.node.contributions.events.subscribe(self._recompute)
        # a join, leave or remove, the app's or the admin API's / CLI's (review r62)
        self._unsubscribe_swarm = self.node.swarm_events.subscribe(self.swarm_changed.emit)

    # --- lifecycle ---

    async def async_start(self) -> bool:
        """Start the node on the running loop; False (and state ERROR) if it cannot."""
        self._set_state(AppState.STARTING)
        try:
            await self.node.start()
        except DataDirInUse:
            # another copy (or a `swarmllm run`) runs on this data dir: the node refused before it
            # started anything, so the first one is undisturbed
            self.start_error = ("SwarmLLM is already running with this data folder; use that copy (its "
                                "tray icon or window), or quit it first")
        except OSError as exc:
            self.start_error = _start_error_text(exc, self.node.config)
        except NodeError as exc:
            self.start_error = exc.message
        except Exception as exc:  # the app shows the reason instead of vanishing
            log.exception("the node failed to start")
            self.start_error = f"{type(exc).__name__}: {exc}"
        if self.start_error is not None:
            log.error("cannot start the node: %s", self.start_error)
            await self.node.stop()
            self._set_state(AppState.ERROR)
            return False
        self.is_started = True
        self.node.note_activity("desktop app started the node")
        if self.node.peers is not None:  # swarm coverage changes with peers
            self._unsubscribe_peers = self.node.peers.subscribe(self._on_peer_event)
        self._recompute()
        self.started.emit()
        return True

    async def async_stop(self) -> None:
        """Stop serving and free the API port, models and KV sessions (idempotent)."""
        self._set_state(AppState.STOPPING)
        self._unsubscribe()
        self._unsubscribe_slices()
        self._unsubscribe_peers()
        self._unsubscribe_contributions()
        self._unsubscribe_swarm()
        await self.node.stop()
        self.is_started = False

    # --- user actions ---

    @property
    def contributing(self) -> bool:
        return self.node.config.contribute

    def set_contributing(self, on: bool) -> None:
        """The tray's "Pause contributing": stop (or resume) serving work for peers; a pause also
        frees the slices' memory (the Swarm tab's box too). Kept in config.toml for the next start."""
        if not self.is_started:  # nothing runs yet: the flag is all there is
            if self.node.config.contribute != on:
                self.node.config.contribute = on
                self._recompute()
            return
        # asked even when the flag says so already: a change asked before may not have run yet (another
        # contributions change held the node's lock), and the last click must win; until 2026-12-07 an
        # un-pause right after a pending pause was dropped here and the pause ran alone. The node's
        # changes run in the order asked, and one to the state it is in does nothing.
        log.info("DIAG: contributing change asked contribute=%s source=app", on)
        spawn(self.node.contributions.async_set_paused(not on), what="changing contributing")

    async def async_help_serve(self, model_id: str, budget_mb: int) -> None:
        """The Swarm tab's "Help serve this model" (a new budget for one already helped)."""
        await self.node.contributions.async_help(model_id, budget_mb)

    async def async_stop_helping(self, model_id: str) -> None:
        await self.node.contributions.async_stop(model_id)

    def _require_started(self) -> None:
        """Model actions need a running node (one that could not start would load a model that
        no API serves)."""
        if not self.is_started:
            raise NodeError(f"the node is not running: {self.start_error or STATE_WORDS[self.state]}")

    async def async_load(self, model_id: str) -> None:
        """Load a model (the Models tab's Load button)."""
        self._require_started()
        served = await self.node.models.async_load(model_id, after_unload=True)
        self.node.note_activity(f"model {served.id} loaded on {served.device}")

    async def async_unload(self, model_id: str) -> None:
        """Unload a model (refused while a request uses it)."""
        served = await self.node.models.async_unload(model_id)
        self.node.note_activity(f"model {served.id} unloaded")

    async def async_add_model(self, path: Path) -> tuple[str, bool]:
        """Serve a GGUF file for this session (catalog, register, load): its id, and whether it is new
        here, or the file of a model whose own was gone (False: this file, or one of the same bytes,
        was served already)."""
        self._require_started()
        try:
            model_id, added = await self.node.async_add_model_file(path, "gui")
        except NodeError as exc:
            self.add_error = exc.message if path.name in exc.message else f"{path.name}: {exc.message}"
            self.state_changed.emit(self.state.value)  # (the banner reads it again)
            raise
        if self.add_error is not None:
            self.add_error = None
            self.state_changed.emit(self.state.value)
        await self.async_load(model_id)
        return model_id, added

    async def async_join(self, code: str) -> str:
        """Join the swarm of the node that made the invite code (Join a swarm…)."""
        return await self.node.async_join(code)  # (swarm_changed: the node's swarm_events)

    async def async_leave(self) -> str:
        """Leave the swarm for a new private one of this node alone (Leave swarm)."""
        return await self.node.async_leave()  # (swarm_changed: the node's swarm_events)

    async def async_remove_member(self, node_id: str) -> int:
        """Remove a member and rotate the swarm secret (Remove from swarm)."""
        return await self.node.async_remove_member(node_id)  # (swarm_changed: the node's swarm_events)

    # --- state ---

    @property
    def models_dir(self) -> Path:
        return self.node.data_dir / MODELS_DIR

    def _on_model_event(self, event: str, served) -> None:
        if self.is_started:
            self._recompute()

    def _on_slice_event(self, hosted) -> None:
        if self.is_started:
            self._recompute()

    def _on_peer_event(self, kind: str, snapshot) -> None:
        if self.is_started:
            self._recompute()

    def serving(self) -> Serving:
        """What this node can serve right now: whole models, its slices, models the swarm covers."""
        return serving_of(self.node)

    def _recompute(self) -> None:
        if self.state in (AppState.STOPPING,) or self.start_error is not None:
            return
        now = self.serving()
        if now.whole_loaded or now.slices_loaded or now.swarm or now.whole_idle:
            # an unloaded whole model still serves: a request loads it again (on demand)
            new = AppState.SERVING if self.contributing else AppState.PAUSED
        elif now.loading:
            new = AppState.LOADING
        elif (now.failed or now.choice_failed) and not now.idle:
            new = AppState.ERROR
        else:
            new = AppState.NO_MODEL
        self._set_state(new)

    def _set_state(self, state: AppState) -> None:
        if state != self.state:
            self.state = state
            log.debug("DIAG: tray state changed state=%s", state.value)
        self.state_changed.emit(state.value)

    def status_line(self) -> str:
        """One line for the tray tooltip and the status bar."""
        words = STATE_WORDS[self.state]
        if self.state in (AppState.SERVING, AppState.PAUSED):
            return f"SwarmLLM {self.node.short_id} — {words}: {self.serving().describe()} at {self.node.api_url}"
        if self.state == AppState.ERROR and self.start_error:
            return f"SwarmLLM — could not start: {self.start_error}"
        return f"SwarmLLM {self.node.short_id} — {words}".replace("  ", " ")

    def status_brief(self) -> tuple[str, str]:
        """The status bar's line (what it serves in counts) and its tooltip (every model, one a line):
        every model id in one line ran off the window's edge."""
        if self.state not in (AppState.SERVING, AppState.PAUSED):
            return self.status_line(), self.status_line()
        now = self.serving()
        words = STATE_WORDS[self.state]
        lines = [f"SwarmLLM {self.node.short_id} — {words} at {self.node.api_url}"]
        lines += [f"  {m}" for m in now.whole_loaded]
        lines += [f"  {m} (unloaded: loads on the first request)" for m in now.whole_idle]
        lines += [f"  layers {s}" for s in now.slices_loaded]
        local_names = {w.rsplit("-", 1)[0] for w in now.whole_loaded}
        lines += [f"  via peers {n}" for n in now.swarm if n not in local_names]
        return f"SwarmLLM {self.node.short_id} — {words}: {now.brief()} at {self.node.api_url}", "\n".join(lines)

    def first_run_text(self) -> str | None:
        """What to tell a user whose node cannot serve any model yet (None when it can)."""
        if self.start_error is not None:
            return f"The node could not start: {self.start_error}"
        if self.state not in (AppState.NO_MODEL, AppState.ERROR):
            return None
        models = self.node.models.whole_models()
        lines = ["No model can serve requests yet."]
        failed = [m for m in models if m.state == "failed"]
        for m in failed:
            lines.append(f"Model {m.id} failed to load: {m.error}")
        for s in self.node.slice_host.slices.values():
            if s.state == "failed":
                lines.append(f"Layers {s.start}–{s.end - 1} of {s.entry.id} failed to load: {s.error}")
            elif s.state == "loading" and s.retrying is not None and s.auto_budget is None:  # (auto: below)
                lines.append(f"Layers {s.start}–{s.end - 1} of {s.entry.id} failed to load: {s.retrying} (retrying…)")
        for what in self.serving().choice_failed:  # (--serve auto's, "Help serve"'s: the slice itself is gone)
            lines.append(what[0].upper() + what[1:])
        skipped = self.node.catalog.skipped_reasons()
        for why in skipped:  # a truncated copy in the models folder
            lines.append(f"Not served: {why}")
        if self.add_error is not None and self.add_error not in skipped:  # (a file of the models folder: said)
            lines.append(f"Not added: {self.add_error}")
        for job in self.node.downloads.all():  # (the Models tab's Download…: it serves once done)
            if job.active:
                done = f": {100 * job.done_bytes / job.total_bytes:.0f}%" if job.total_bytes else ""
                lines.append(f"Downloading {job.file_name}{done}; it is served once the download is done.")
        if models and not failed:
            lines.append("No model is loaded: select one in the Models tab and press Load.")
        if not models:
            if self.node.config.include_default_model and not default_model_path().is_file():
                lines.append(f"The embedded default model ({DEFAULT_MODEL_FILE}) is missing from this "
                             "installation.")
            lines.append(f"To add a model, click “Add model file…”, or copy a .gguf file into "
                         f"{self.models_dir} (it is picked up within seconds), or start with --model PATH.")
        return "\n".join(lines)


def _start_error_text(exc: OSError, config: NodeConfig) -> str:
    # (a port it cannot listen on is a NodeError, in `swarmllm run`'s words: node.api.server)
    # a data dir it cannot use: `swarmllm run`'s words, not "[Errno 17] File exists: '…'"
    return data_dir_error(config.data_dir, exc) or str(exc)
