"""`swarmllm-tray` on an install without the `gui` extra (README's quick start is `pip install -e .`).

The app's packages are hidden from a child process (None in sys.modules is what Python reports as
not installed); the app must say what to install and exit 2, where it ended in a
ModuleNotFoundError traceback.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.ports import free_port
from tests.support.processes import REPO, hermetic_env

CHILD = """
import sys
for name in ({hidden}):
    sys.modules[name] = None
from app.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("hidden", ['"PySide6", "PySide6.QtWidgets"', '"qasync",'])
def test_the_tray_without_its_gui_packages_says_what_to_install(tmp_path, hidden):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(hidden=hidden), "--data-dir", str(tmp_path),
         "-p", str(free_port()), "--no-mdns", "--no-default-model"],
        cwd=REPO, env=hermetic_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "pip install 'swarmllm[gui]'" in proc.stderr, proc.stderr
    assert "swarmllm run" in proc.stderr, proc.stderr
