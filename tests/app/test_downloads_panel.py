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
