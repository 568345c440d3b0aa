"""The downloads panel's line for a finished download: the model it became and that peers see it
once it is loaded (a user who downloaded a model saw nothing on their other laptop), or, for one part
of a split set fetched alone from a signed URL, the parts still missing (it said "model None")."""

from __future__ import annotations

import pytest

from app.ui.downloads_panel import DownloadsPanel
from node.models.download.job import DownloadJob

pytestmark = pytest.mark.gui


def _done(**kw) -> DownloadJob:
    return DownloadJob(id="d1", url="https://example.invalid/m.gguf", file_name="m.gguf", state="done",
                       total_bytes=5 * 2**20, done_bytes=5 * 2**20, **kw)


def test_a_finished_download_says_its_model_and_that_the_swarm_takes_its_layers_now(qtbot):
    """Not loaded, its file is shared (peers fetch its layers from here); loading lets them use it."""
    panel = DownloadsPanel(node=None)
    qtbot.addWidget(panel)
    panel.on_download(_done(model_id="m-1a2b3c4d"))
    text = panel.rows["file:m.gguf"].detail.text()
    assert "model m-1a2b3c4d" in text and "swarm can take its layers from this device now" in text, text
    assert "to share it" not in text, text


def test_a_split_part_fetched_alone_says_what_is_still_missing(qtbot):
    panel = DownloadsPanel(node=None)
    qtbot.addWidget(panel)
    note = "parts 1 and 3 of 3 are still missing: each needs its own URL"
    panel.on_download(_done(note=note))
    text = panel.rows["file:m.gguf"].detail.text()
    assert note in text and "None" not in text, text


def test_a_finished_split_set_says_it_is_served_on_this_device_only(qtbot):
    """A split model is never advertised to peers, loaded or not: telling its user that Load shares
    it was untrue (found in review)."""
    panel = DownloadsPanel(node=None)
    qtbot.addWidget(panel)
    job = _done(model_id="big-1a2b3c4d")
    job.file_name = "big-00001-of-00003.gguf"
    panel.on_download(job)
    text = panel.rows["file:big-00001-of-00003.gguf"].detail.text()
    assert "this device only" in text and "swarm can take its layers" not in text, text


def test_a_full_disks_failure_text_is_readable_whole_in_a_narrow_window(qtbot):
    """The text says what to do (free space; the partial file is kept and resumes); beside the bar it
    ran past the window's edge, cut at 'downloading it again resu…' (2026-12-06). A failure whose
    size was never known showed a busy bar, as if it went on."""
    from PySide6.QtCore import QRect, Qt
    from PySide6.QtGui import QFontMetrics

    panel = DownloadsPanel(node=None)
    qtbot.addWidget(panel)
    error = ("the disk is full: no space left in /data/models (free some space there); the partial file "
             "/data/models/m.gguf.part (20 MB) is kept: downloading it again resumes, or delete it")
    panel.on_download(DownloadJob(id="d2", url="https://example.invalid/m.gguf", file_name="m.gguf",
                                  state="failed", done_bytes=20 * 2**20, error=error))
    panel.resize(800, 200)
    panel.show()
    qtbot.waitExposed(panel)
    row = panel.rows["file:m.gguf"]
    label = row.detail
    assert label.text() == f"failed: {error}"
    right_edge = label.mapTo(panel, label.rect().topRight()).x()
    assert right_edge <= panel.width(), (right_edge, panel.width())
    flags = Qt.TextWordWrap if label.wordWrap() else Qt.TextSingleLine
    needed = QFontMetrics(label.font()).boundingRect(QRect(0, 0, label.width(), 10_000), flags, label.text())
    assert needed.width() <= label.width() and needed.height() <= label.height(), (needed, label.size())
    assert row.bar.maximum() > 0, "a failed download's bar is busy"


def test_a_failed_download_whose_partial_file_is_kept_offers_resume_and_cancel(qtbot):
    """2026-12-06: its text said "downloading it again resumes" but it had no Resume."""
    panel = DownloadsPanel(node=None)
    qtbot.addWidget(panel)
    job = DownloadJob(id="d2", url="https://example.invalid/m.gguf", file_name="m.gguf", state="failed",
                      done_bytes=2 * 2**20, error="failed 6 times; last: timeout (the partial file is kept)")
    panel.on_download(job)
    row = panel.rows["file:m.gguf"]
    assert row.pause_button.isHidden() and row.cancel_button.isHidden()  # nothing kept: nothing to resume
    job.kept_bytes = 2 * 2**20
    panel.on_download(job)
    assert not row.pause_button.isHidden() and row.pause_button.text() == "Resume"
    assert not row.cancel_button.isHidden()
