"""Downloads: one row per download with a real progress bar (bytes, rate, time left), Pause /
Resume and Cancel; and one row per partial model's layers being fetched (layers a–b), from the
slice host's fetch events. Fed by node events (the downloader's observer, slice host events).
"""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.tasks import spawn
from app.ui import fmt
from node import const
from node.errors import NodeError
from node.models.file_kinds import split_part


def eta_text(done: int, total: int | None, bytes_per_s: float | None) -> str:
    """'12 s left', '3 min left', or '' when it cannot be told."""
    if not total or not bytes_per_s or bytes_per_s <= 0 or done >= total:
        return ""
    left = (total - done) / bytes_per_s
    return f"{left:.0f} s left" if left < 90 else f"{left / 60:.0f} min left"


def progress_text(done: int, total: int | None, bytes_per_s: float | None) -> str:
    parts = [f"{fmt.size(done)} of {fmt.size(total)}" if total else fmt.size(done)]
    if bytes_per_s:
        parts.append(f"{bytes_per_s / 2**20:.1f} MiB/s")
    eta = eta_text(done, total, bytes_per_s)
    if eta:
        parts.append(eta)
    return " · ".join(parts)


class ProgressRow(QWidget):
    """A title, a progress bar, the figures, and optional buttons."""

    def __init__(self, title: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = QLabel(title)
        self.title.setMinimumWidth(220)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setAccessibleName(f"Progress of {title}")
        # the figures on a line of their own under the bar, wrapped: a failure's text (what to do
        # with a full disk) ran past the window's edge beside the bar, which it squeezed (2026-12-06)
        self.detail = QLabel()
        self.detail.setWordWrap(True)
        self.pause_button = QPushButton("Pause")
        self.cancel_button = QPushButton("Cancel")
        line = QHBoxLayout()
        line.setContentsMargins(0, 0, 0, 0)
        line.addWidget(self.title)
        line.addWidget(self.bar, 1)
        line.addWidget(self.pause_button)
        line.addWidget(self.cancel_button)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addLayout(line)
        column.addWidget(self.detail)

    def show_progress(self, done: int, total: int | None, bytes_per_s: float | None, state: str) -> None:
        if total:
            self.bar.setRange(0, 1000)
            self.bar.setValue(min(1000, done * 1000 // total))
            self.bar.setFormat(f"{done * 100 // total}%")
        elif state in ("downloading", "fetching", "starting", "checking sha256"):
            self.bar.setRange(0, 0)  # busy: the size is not known yet
        else:  # ended (failed, paused, cancelled) without a size: not a busy bar, as if it went on
            self.bar.setRange(0, 1000)
            self.bar.setValue(0)
            self.bar.setFormat("")
        words = progress_text(done, total, bytes_per_s)
        self.detail.setText(words if state in ("downloading", "fetching") else f"{state} · {words}")
        self.bar.setAccessibleDescription(self.detail.text())


class DownloadsPanel(QWidget):
    """Every download of this run and every layer fetch in progress; hidden while there are none."""

    def __init__(self, node, parent: QWidget | None = None):
        super().__init__(parent)
        self.node = node
        self.rows: dict[str, ProgressRow] = {}
        self._fetch_started: dict[str, tuple[float, int]] = {}  # slice key -> (first seen, bytes then)
        # file key -> (when its bytes last grew, bytes then): a download whose bytes stop growing
        # sends no events, so a timer looks and says "stalled" (the bar just stood still before)
        self._last_growth: dict[str, tuple[float, int]] = {}
        self._stall_timer = QTimer(self, interval=int(const.DOWNLOAD_STALL_CHECK_S * 1000))
        self._stall_timer.timeout.connect(self._show_stalls)
        self.layout_ = QVBoxLayout(self)
        self.layout_.setContentsMargins(0, 0, 0, 0)
        self.setVisible(False)
        for job in node.downloads.all() if node is not None else []:  # already there: an earlier run's unfinished ones (paused), found
            if job.active or job.resumable:  # at start, were hidden until 2026-12-06
                self.on_download(job)

    def _row(self, key: str, title: str) -> ProgressRow:
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = ProgressRow(title)
            self.layout_.addWidget(row)
            self.setVisible(True)
        return row

    def _drop(self, key: str) -> None:
        row = self.rows.pop(key, None)
        self._last_growth.pop(key, None)
        if row is not None:
            self.layout_.removeWidget(row)
            row.deleteLater()
        self.setVisible(bool(self.rows))

    # --- downloads (the downloader's observer) ---

    def on_download(self, job) -> None:
        key = f"file:{job.file_name}"  # a resumed download is a new job of the same file: the same row
        n_parts = len(job.parts)
        # a split set: its part 1's name alone read as one file of it (found 2026-12-06)
        row = self._row(key, f"{job.file_name} (split model, {n_parts} parts)" if n_parts > 1 else job.file_name)
        summary = job.summary()
        rate = summary["mb_per_s"] * 1e6 if summary.get("mb_per_s") and job.state == "downloading" else None
        state = {"verifying": "checking sha256"}.get(job.state, job.state)
        row.show_progress(job.done_bytes, job.total_bytes, rate, state)
        if n_parts > 1 and job.active:  # which part of the set is on the wire; the bar is the set's
            row.detail.setText(f"part {job.part} of {n_parts} · {row.detail.text()}")
        self._note_growth(key, job)
        if job.state == "failed":
            row.detail.setText(f"failed: {job.error}")
        elif job.state == "paused" and job.restored:
            row.detail.setText(f"{row.detail.text()} · kept from an earlier run: Resume goes on from there, "
                               "Cancel deletes it")
        row.setToolTip(summary["url"])
        # the buttons act on the row's job of the moment (a resume makes a new one): connected once
        # (disconnecting a button with nothing connected printed a RuntimeWarning on the console)
        row.job = job
        if not getattr(row, "buttons_connected", False):
            row.pause_button.clicked.connect(lambda: self._pause_or_resume(row.job))
            row.cancel_button.clicked.connect(lambda: self._cancel(row.job))
            row.buttons_connected = True
        # a failed download whose partial file is kept resumes too (it had no button until 2026-12-06)
        row.pause_button.setVisible(job.state in ("downloading", "starting") or job.resumable)
        row.pause_button.setText("Resume" if job.resumable else "Pause")
        row.pause_button.setToolTip("Resume from where it stopped (HTTP Range)" if job.resumable
                                    else "Stop for now; the bytes so far are kept")
        row.cancel_button.setVisible(job.active or job.resumable)
        row.cancel_button.setToolTip("Stop and delete the partial file")
        if job.state == "done":
            size = fmt.size(job.total_bytes or job.done_bytes)
            if job.model_id is None and job.note:  # one part of a split set, fetched alone: what is missing
                row.detail.setText(f"done · {size} · {job.note}")
            elif split_part(Path(job.file_name)):  # served here only, loaded or not (found in review)
                row.detail.setText(f"done · {size} · model {job.model_id} · split in parts: served on this "
                                   "device only")
            else:  # peers take its layers from here now (while contributing: a download from a public
                # origin, download/public.py; a private or signed one, or a file the user added, is handed
                # out only while loaded); they see the model loaded only
                row.detail.setText(f"done · {size} · model {job.model_id} · your swarm can take its layers from "
                                   "this device now if its source is public (a private repo's or signed link's "
                                   "download, or a file you add, is shared only while loaded); Load it (Models "
                                   "tab) to let them use it here")

    def _note_growth(self, key: str, job) -> None:
        if job.state != "downloading":
            self._last_growth.pop(key, None)
        else:
            seen = self._last_growth.get(key)
            if seen is None or job.done_bytes != seen[1]:
                self._last_growth[key] = (time.monotonic(), job.done_bytes)
        if self._last_growth and not self._stall_timer.isActive():
            self._stall_timer.start()
        elif not self._last_growth:
            self._stall_timer.stop()

    def _show_stalls(self) -> None:
        """A download with no new byte for DOWNLOAD_STALLED_S says so (its average rate and time left
        went on as if bytes came in; the node retries and resumes by itself after a read timeout)."""
        now = time.monotonic()
        for key, (since, done) in self._last_growth.items():
            row = self.rows.get(key)
            idle = now - since
            if row is None or idle < const.DOWNLOAD_STALLED_S:
                continue
            job = row.job
            size = f"{fmt.size(done)} of {fmt.size(job.total_bytes)}" if job.total_bytes else fmt.size(done)
            part = f"part {job.part} of {len(job.parts)} · " if len(job.parts) > 1 else ""
            row.detail.setText(f"{part}stalled: no data for {idle:.0f} s · {size} · the origin is slow or "
                               "unreachable; it retries and resumes by itself (or Pause and Resume later)")
            row.bar.setAccessibleDescription(row.detail.text())

    def _pause_or_resume(self, job) -> None:
        if job.resumable:
            self._resume(job)
        else:
            self.node.downloads.pause(job.id)

    def _resume(self, job) -> None:
        """Resume, and wire the row to the new download at once (its first event comes later: a
        Cancel meanwhile must stop the download that writes the partial file, not the paused one)."""
        try:
            resumed = self.node.downloads.resume(job.id)
        except NodeError as exc:
            self._row(f"file:{job.file_name}", job.file_name).detail.setText(f"could not resume: {exc.message}")
            return
        self.on_download(resumed)

    def _cancel(self, job) -> None:
        if job.active:
            self.node.downloads.cancel(job.id)
        else:  # paused, or failed with its part file kept: it goes as a cancel's would
            spawn(self.node.downloads.async_discard(job.id), what=f"removing the partial {job.file_name}")

    # --- partial models' layers (slice host events) ---

    def on_slice(self, hosted) -> None:
        key = f"slice:{hosted.entry.sha256}:{hosted.start}:{hosted.end}"
        if hosted.fetch is None or hosted.state != "loading":
            if key in self.rows and hosted.state != "loading":
                self._drop(key)
            return
        done, total = hosted.fetch
        first = self._fetch_started.setdefault(key, (time.monotonic(), done))
        elapsed = time.monotonic() - first[0]
        rate = (done - first[1]) / elapsed if elapsed > 0.5 and done > first[1] else None
        row = self._row(key, f"{hosted.entry.name} layers {hosted.start}–{hosted.end - 1}")
        row.pause_button.hide()
        helping = hosted.entry.id in self.node.config.contribute_models  # chosen in the Swarm tab
        row.cancel_button.setVisible(helping)  # (--layers and --serve auto slices are the command line's)
        row.cancel_button.setToolTip("Stop fetching these layers and stop helping serve the model; what arrived "
                                     "is kept: “Help serve this model” again resumes from there")
        if not getattr(row, "cancel_connected", False):  # once per row (its model does not change);
            # disconnecting with nothing connected printed a RuntimeWarning on the console
            model_id = hosted.entry.id
            row.cancel_button.clicked.connect(lambda: spawn(self.node.contributions.async_stop(model_id),
                                                            what=f"stopping the fetch of {model_id}"))
            row.cancel_connected = True
        row.show_progress(done, total, rate, "fetching")
        row.setToolTip("layers of a partial model arriving from peers and the origin")
