"""Models tab: every model this node serves, where it runs and why; Load / Unload / Add / Download."""

from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.host import NodeHost
from app.tasks import spawn
from app.ui import fmt
from app.ui.downloads_panel import DownloadsPanel
from app.ui.models_model import ModelsModel, fit, is_slice
from app.ui.table_model import ROW_KEY_ROLE
from app.ui.widgets import ElidedLabel, FirstRunBanner, table_view
from node.errors import NodeError
from node.models.download.hfrepo import RepoSpec, read_spec
from node.models.file_kinds import split_part
from node.sysinfo import ram_available_bytes


class ModelsTab(QWidget):
    """A table over ModelsModel with actions on the selected model."""

    def __init__(self, host: NodeHost, model: ModelsModel, parent: QWidget | None = None):
        super().__init__(parent)
        self.host = host
        self.model = model
        self.banner = FirstRunBanner(host)
        self.banner.add_model_clicked.connect(self.choose_model_file)
        self.banner.open_folder_clicked.connect(self.open_models_folder)
        self.view = table_view(model)
        self.load_button = QPushButton("Load")
        self.unload_button = QPushButton("Unload")
        self.add_button = QPushButton("Add model file…")
        self.add_button.setToolTip("Serve a GGUF file from your disk. Your swarm's devices get its layers from "
                                   "this device only while it is loaded here (a file you add is not handed out "
                                   "otherwise; a download from a public source is, while you contribute)")
        self.download_button = QPushButton("Download…")
        self.download_button.setToolTip("Download a GGUF model from a URL (https://… or hf://owner/repo/file.gguf) "
                                        "into the models folder; your swarm's devices can take its layers from "
                                        "this device while you contribute: loaded or not if anyone could download "
                                        "it there, only while loaded from a private repo or a signed link")
        self.download_button.clicked.connect(self.ask_download_url)
        self.load_button.clicked.connect(self.load_selected)
        self.unload_button.clicked.connect(self.unload_selected)
        self.add_button.clicked.connect(self.choose_model_file)
        # its own line under the buttons, elided at the window's edge, the whole text in its tooltip:
        # beside them, word-wrapped, a long line (a download's, a fit's) grew into a tall column
        # that squeezed the buttons in a narrow window
        self.status = ElidedLabel()
        buttons = QHBoxLayout()
        for button in (self.load_button, self.unload_button, self.add_button, self.download_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addWidget(self.view, 1)
        # files in the models folder a scan skipped (a truncated copy): said here while other models
        # serve too (the first-run banner shows only while none does; the log alone said it)
        self.skipped = QLabel()
        self.skipped.setWordWrap(True)
        self.skipped.setVisible(False)
        layout.addWidget(self.skipped)
        host.state_changed.connect(self._show_skipped)
        # the folder watch skips (or forgets) a file with no state change to say so: read again at its pace
        self._fit_lead: str | None = None  # a line the fit text follows (a download just done)
        self._fit_for: str | None = None  # the model the status line's fit text is about, while shown
        self._fit_lead_shown: str | None = None  # the lead that fit text followed
        # (the first-run banners too: a file skipped, a download's progress change no state; the
        # main window hangs the Overview's on it)
        self.folder_timer = QTimer(self, interval=max(500, int(host.node.config.models_watch_s * 1000))
                                   if host.node is not None else 5000)
        self.folder_timer.timeout.connect(self._show_skipped)
        self.folder_timer.timeout.connect(self.banner.update_from_host)
        self.folder_timer.start()
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        self.downloads = DownloadsPanel(host.node)  # a progress bar per download and per layer fetch
        layout.addWidget(self.downloads)
        hint = QLabel("Whole models run on this machine with llama.cpp; layer slices (--layers) run "
                      "with torch for the swarm. “Placement reason” says why a model is on the CPU "
                      "rather than the GPU.")
        hint.setWordWrap(True)
        hint.setStyleSheet("color: palette(mid);")
        layout.addWidget(hint)
        self.view.selectionModel().selectionChanged.connect(self._update_buttons)
        self.view.selectionModel().selectionChanged.connect(self._tell_fit)
        model.dataChanged.connect(self._update_buttons)
        model.dataChanged.connect(self._drop_stale_fit)
        model.rowsInserted.connect(self._select_first_if_none)
        self._update_buttons()
        self._download_file: str | None = None  # the file this tab's download writes (a resume is a new job)
        unsubscribers = [host.node.downloads.subscribe(self._on_download),
                         host.node.downloads.subscribe(self.downloads.on_download),
                         host.node.slice_host.subscribe(self.downloads.on_slice)]
        self.destroyed.connect(lambda *_: [unsubscribe() for unsubscribe in unsubscribers])

    def selected_id(self) -> str | None:
        rows = self.view.selectionModel().selectedRows()
        return rows[0].data(ROW_KEY_ROLE) if rows else None

    def select(self, model_id: str) -> None:
        row = self.model.row_of(model_id)
        if row >= 0:
            self.view.selectRow(row)

    def _select_first_if_none(self, *_args) -> None:
        if self.selected_id() is None and self.model.rowCount():
            self.view.selectRow(0)

    def _update_buttons(self, *_args) -> None:
        model_id = self.selected_id()
        summary = self.model.summary(model_id) if model_id else None
        state = summary.get("state") if summary else None
        whole = summary is not None and not is_slice(summary)  # slices are set with --layers at start
        no_vocabulary = bool(summary and summary.get("no_vocabulary"))  # the node refuses every load of it
        self.load_button.setEnabled(whole and state in ("unloaded", "failed") and not no_vocabulary)
        self.load_button.setToolTip(f"It cannot be loaded: {summary.get('error')}. Without its vocabulary no load "
                                    "can succeed; replace the file with a whole, supported copy."
                                    if no_vocabulary and summary else "")
        self.unload_button.setEnabled(whole and state == "loaded" and not summary.get("busy"))

    def _report(self, text: str) -> None:
        self._fit_for = None  # (any other line replaces a fit line)
        self.status.set_full_text(text)
        self.status.setToolTip(text)

    def _drop_stale_fit(self) -> None:
        """A fit line whose model loaded since (by itself at the start, a request, the admin API) is
        dropped: "Loading X takes ≈ …" stayed under the loaded model, read as a load under way."""
        if self._fit_for is not None and self._loadable(self._fit_for) is None:
            self._report(self._fit_lead_shown or "")

    def _show_skipped(self, *_args) -> None:
        if self.host.node is None:  # (stopped)
            return
        reasons = self.host.node.catalog.skipped_reasons()
        self.skipped.setText("\n".join(f"Not served: {why}" for why in reasons))
        self.skipped.setVisible(bool(reasons))

    def _loadable(self, model_id: str | None) -> dict | None:
        summary = self.model.summary(model_id) if model_id else None
        if summary is None or is_slice(summary) or summary.get("state") not in ("unloaded", "failed") \
                or summary.get("no_vocabulary"):  # (refused for good: no fit line for a load that cannot be)
            return None
        return summary

    async def _async_fit(self, model_id: str) -> tuple[bool | None, str]:
        """Whether a load of this model fits in the RAM free now: estimated as the load would place
        it (what goes to a GPU takes no RAM), which also refreshes its row's Memory tooltip."""
        node = self.host.node
        estimate = await node.models.async_estimate_load(model_id) if node is not None else None
        free = await asyncio.get_running_loop().run_in_executor(None, ram_available_bytes)
        summary = self._loadable(model_id)
        if summary is None:
            return None, ""
        return fit({**summary, "memory_estimate": estimate or summary.get("memory_estimate")}, free)

    def _tell_fit(self, *_args) -> None:
        """A model that is not loaded selected: what loading it takes, against the RAM free now."""
        model_id, lead = self.selected_id(), self._fit_lead
        if self._loadable(model_id) is None:
            return

        async def run() -> None:
            text = (await self._async_fit(model_id))[1]
            if self.selected_id() == model_id and text:  # (still selected)
                self._report(f"{lead} · {text}" if lead else text)
                self._fit_for, self._fit_lead_shown = model_id, lead

        spawn(run(), what="reading the free memory")

    def load_selected(self) -> None:
        model_id = self.selected_id()
        if model_id:
            self._report(f"loading {model_id}…")

            async def run() -> None:
                fits, warning = await self._async_fit(model_id)
                too_big = fits is False
                if too_big:
                    self._report(f"loading {model_id}… {warning}")
                await self.host.async_load(model_id)
                self._report(f"{model_id} loaded" + (f" ({warning})" if too_big else ""))

            spawn(run(), what=f"loading {model_id}", on_error=self._report)

    def unload_selected(self) -> None:
        model_id = self.selected_id()
        if model_id:
            spawn(self._async_then(self.host.async_unload(model_id), f"{model_id} unloaded"),
                  what=f"unloading {model_id}", on_error=self._report)

    async def _async_then(self, coro, done_text: str) -> None:
        await coro
        self._report(done_text)

    def choose_model_file(self) -> None:
        """Pick a .gguf file (non-modal: the loop keeps turning while the dialog is open)."""
        dialog = QFileDialog(self, "Add a GGUF model", str(Path.home()), "GGUF models (*.gguf)")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.fileSelected.connect(lambda path: self.add_model_file(Path(path)))
        dialog.open()

    def add_model_file(self, path: Path) -> None:
        """Serve a GGUF file for this session."""
        self._report(f"adding {path.name}…")

        async def run() -> None:
            model_id, added = await self.host.async_add_model(path)
            self.select(model_id)
            if not added:  # (a second click on Add for the same file: one model, said so)
                self._report(f"{model_id} is served already ({path.name}: the same model)")
                return
            part = split_part(path)  # a split model: part 1 alone in models/ would be refused
            what = f"its {part[2]} parts ({path.name} …)" if part is not None else "the file"
            self._report(f"{model_id} added for this session; copy {what} into {self.host.models_dir} "
                         "to keep it")

        spawn(run(), what=f"adding {path.name}", on_error=self._report)

    def ask_download_url(self) -> None:
        """Ask for a URL (non-modal), then download it."""
        dialog = QInputDialog(self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.setWindowTitle("Download a model")
        dialog.setLabelText("GGUF URL (https://…, hf://owner/repo/file.gguf, or hf://owner/repo:Q4_K_M):")
        dialog.setTextEchoMode(QLineEdit.EchoMode.Normal)
        dialog.resize(560, dialog.height())
        dialog.textValueSelected.connect(lambda url: self.download_url(url.strip()) if url.strip() else None)
        dialog.open()

    def download_url(self, url: str) -> None:
        """Start downloading into the models folder; progress shows in the status line. A Hugging
        Face repo[:QUANT] is looked up on the Hub first (off the loop's critical path)."""
        try:
            target = read_spec(url)
            if isinstance(target, RepoSpec):
                self._report(f"looking up {target.label} on Hugging Face…")

                async def run() -> None:
                    self._downloading(await self.host.node.downloads.async_start(url))

                spawn(run(), what=f"downloading {target.label}", on_error=self._report)
                return
            self._downloading(self.host.node.downloads.start(target))
        except NodeError as exc:
            self._report(exc.message)

    def _downloading(self, job) -> None:
        self._download_file = job.file_name
        self._report(f"downloading {job.file_name}…")

    def _on_download(self, job) -> None:
        """Download progress (on the loop, which is Qt's thread under qasync)."""
        if job.file_name != self._download_file:
            return
        summary = job.summary()
        if job.state == "downloading" and job.total_bytes:
            # in the progress row's units (MiB): this line said MB, the row under it MiB, two figures
            rate = f", {summary['mb_per_s'] * 1e6 / 2**20:.1f} MiB/s" if summary.get("mb_per_s") else ""
            self._report(f"downloading {job.file_name}: {fmt.size(job.done_bytes)} of {fmt.size(job.total_bytes)} "
                         f"({summary['progress'] * 100:.0f}%{rate})")
        elif job.state == "verifying":
            self._report(f"checking {job.file_name}…")
        elif job.state == "done":
            done = f"downloaded {job.file_name}: {job.model_id} (select it and press Load)"
            self._report(done)
            self._fit_lead = done  # (selecting it tells what a load takes: after this line, not instead of it)
            self.select(job.model_id)
            self._fit_lead = None
        elif job.state in ("failed", "cancelled"):
            self._report(f"download of {job.file_name} {job.state}: {job.error}")

    def open_models_folder(self) -> None:
        folder = self.host.models_dir
        folder.mkdir(parents=True, exist_ok=True)
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))
