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


def test_without_a_display_a_bad_config_exits_2_with_its_line(tmp_path):
    """No X11/Wayland and no QT_QPA_PLATFORM: Qt cannot make the dialog and aborts the process (exit
    134, found in review); the stderr line is said and the app exits 2."""
    import subprocess
    import sys

    from tests.support.processes import REPO, hermetic_env

    (tmp_path / "config.toml").write_text("n_threads = 2.7\n")
    env = {k: v for k, v in hermetic_env().items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    done = subprocess.run([sys.executable, "-m", "app.main", "--data-dir", str(tmp_path), "-p", str(free_port()),
                           "--no-tray"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "n_threads" in done.stderr and "2.7" in done.stderr
