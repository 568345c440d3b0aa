"""A config.toml the app cannot use is said in a dialog: `swarmllm-tray` wrote "configuration error:
… n_threads …" to a console its user never sees and exited, no window, no icon (found by hand on
2026-12-06)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

import app.main
from tests.support.ports import free_port

pytestmark = pytest.mark.gui


def test_a_bad_config_toml_is_said_in_a_dialog_naming_the_file_and_key(qtbot, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('n_threads = "four"\n')
    seen = []

    def read_and_close() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, read_and_close)  # not shown yet
            return
        seen.append(box.text())
        box.close()

    QTimer.singleShot(0, read_and_close)
    assert app.main.main(["--data-dir", str(tmp_path), "-p", str(free_port()), "--no-tray"]) == 2
    assert len(seen) == 1, "no dialog"
    assert "n_threads" in seen[0] and str(config) in seen[0] and "four" in seen[0], seen[0]
    assert config.read_text() == 'n_threads = "four"\n'
