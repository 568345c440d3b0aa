"""The screenshot script produces a PNG of every tab of the real window under Xvfb."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

pytestmark = [pytest.mark.gui, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXPECTED = ["0-first-run", "1-overview", "2-swarm-gap", "3-swarm-chain", "4-chat", "5-peers", "6-models", "7-requests",
            "8-diagnostics", "9-swarm-dark", "tray-icons"]


def _distinct_colours(image: QImage, step: int = 23) -> int:
    return len({image.pixel(x, y) for x in range(0, image.width(), step) for y in range(0, image.height(), step)})


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWARMLLM_", "QT_QPA_PLATFORM"))}
    env.pop("DISPLAY", None)  # the script starts its own Xvfb
    env["PYTHONPATH"] = str(REPO)
    return env


def _xcb_problem() -> str | None:
    """Why Qt's xcb platform cannot start here (missing X libraries), or None when it can."""
    from app.screenshots import x_display

    with x_display() as display:
        probe = subprocess.run([sys.executable, "-c", "from PySide6.QtGui import QGuiApplication; QGuiApplication([])"],
                               env={**_clean_env(), "DISPLAY": display, "QT_QPA_PLATFORM": "xcb"},
                               capture_output=True, text=True, timeout=60)
    if probe.returncode == 0:
        return None
    return "Qt's xcb platform cannot start (apt-get install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 " \
           "libxcb-xinerama0): " + probe.stderr.strip().splitlines()[0]


@pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed (apt-get install xvfb)")
def test_screenshots_of_every_tab_under_xvfb(qapp, tmp_path):
    problem = _xcb_problem()
    if problem:
        pytest.skip(problem)
    env = _clean_env()
    done = subprocess.run([sys.executable, "-m", "app.screenshots", "--out", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in EXPECTED:
        image = QImage(str(tmp_path / f"{name}.png"))
        assert not image.isNull(), name
        assert image.width() >= 600 and image.height() >= 150, (name, image.size())
        assert _distinct_colours(image) > 5, f"{name} looks blank"
