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
import importlib.abc, sys
for name in ({hidden}):
    sys.modules[name] = None

class BrokenLibrary(importlib.abc.MetaPathFinder):  # PySide6 installed, a system library it loads not
    def find_spec(self, name, path=None, target=None):
        if name in ({broken}):
            raise ImportError("libEGL.so.1: cannot open shared object file: No such file or directory")

sys.meta_path.insert(0, BrokenLibrary())
from app.main import main
sys.exit(main(sys.argv[1:]))
"""


def _tray(tmp_path, hidden: str = "", broken: str = "") -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(hidden=hidden, broken=broken), "--data-dir", str(tmp_path),
         "-p", str(free_port()), "--no-mdns", "--no-default-model"],
        cwd=REPO, env=hermetic_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "swarmllm run" in proc.stderr, proc.stderr
    return proc


# segno (the join dialog's QR code) is in the gui extra too: without it the app died at import
# with a traceback (found in review, 2026-12-07)
@pytest.mark.parametrize("hidden", ['"PySide6", "PySide6.QtWidgets"', '"qasync",', '"segno",'])
def test_the_tray_without_its_gui_packages_says_what_to_install(tmp_path, hidden):
    proc = _tray(tmp_path, hidden=hidden)
    assert "pip install 'swarmllm[gui]'" in proc.stderr, proc.stderr
    assert hidden.split('"')[1] in proc.stderr, proc.stderr


def test_an_installed_pyside_missing_a_system_library_names_the_library(tmp_path):
    """Found in review (2026-12-07): on a minimal Linux, PySide6 is installed but libEGL.so.1 is not;
    any ImportError read as "PySide6 missing" (qasync too, which imports it), so the user was told
    to pip install the extra again and never saw the library's name."""
    proc = _tray(tmp_path, broken='"PySide6.QtWidgets", "PySide6.QtGui"')
    assert "libEGL.so.1" in proc.stderr and "system library" in proc.stderr, proc.stderr
    assert "pip install 'swarmllm[gui]'" not in proc.stderr and "qasync" not in proc.stderr, proc.stderr
