"""A data dir the app cannot use is said in the app's own window, as `swarmllm run` says it.

Seen: `swarmllm-tray --data-dir PATH` with PATH a file (or a folder it cannot write) ended in an
OSError traceback from setup_logging (`FileExistsError: [Errno 17] File exists: '…'`) on a
console a tray app's user never sees, and no window opened; `swarmllm run` checked the data dir
and said "cannot use the data dir …: give a writable directory with --data-dir".
"""

from __future__ import annotations

import pytest

import app.main
from app.host import AppState
from tests.app.helpers import running_app
from tests.support.ports import free_port

pytestmark = pytest.mark.gui  # the window shows: offscreen Qt warns it cannot raise() it


def test_a_data_dir_that_is_a_file_is_said_in_the_window(qtbot, run, tmp_path, monkeypatch):
    in_the_way = tmp_path / "swarm-data"
    in_the_way.write_text("a file where the data dir should be\n")
    asked = {}
    monkeypatch.setattr(app.main, "run_app", lambda config, **kwargs: asked.update(config=config, **kwargs) or 0)
    argv = ["--data-dir", str(in_the_way), "-p", str(free_port()), "--no-default-model", "--no-mdns", "--no-tray"]
    assert app.main.main(argv) == 0  # the app goes on to open its window
    assert asked["tray_available"] is False

    async def body():
        async with running_app(asked["config"], tray_available=False) as tray_app:
            assert tray_app.host.state == AppState.ERROR
            banner = tray_app.window.overview_tab.banner
            assert tray_app.window.isVisible() and banner.isVisible()
            said = banner.title.text() + banner.text.text()
            assert f"cannot use the data dir {in_the_way} (a file, not a directory)" in said, said
            assert "--data-dir" in said and "Errno" not in said
            assert not banner.folder_button.isVisible()  # no models folder to open there
            assert tray_app.feeds.overview.text("Peers") == "0 (peer network off)"  # not "starting" for good

    run(body())


def test_a_reason_holding_markup_is_shown_as_written(qtbot, run, tmp_path, monkeypatch):
    """The banner's first line is bold rich text: a path (or a peer's text) holding `<i>` was read as
    HTML, and the banner showed another path than the one to fix."""
    from PySide6.QtGui import QTextDocument

    in_the_way = tmp_path / "swarm<i>data"
    in_the_way.write_text("a file where the data dir should be\n")
    asked = {}
    monkeypatch.setattr(app.main, "run_app", lambda config, **kwargs: asked.update(config=config, **kwargs) or 0)
    assert app.main.main(["--data-dir", str(in_the_way), "-p", str(free_port()), "--no-default-model",
                          "--no-mdns", "--no-tray"]) == 0

    async def body():
        async with running_app(asked["config"], tray_available=False) as tray_app:
            banner = tray_app.window.overview_tab.banner
            shown = QTextDocument()
            shown.setHtml(banner.title.text())
            said = shown.toPlainText() + banner.text.text()
            assert str(in_the_way) in said, said

    run(body())
