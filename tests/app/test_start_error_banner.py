"""A node that could not start says why in the first-run banner, and the window still fits a
screen: the reason wraps instead of widening the window past it.

Seen in the app: starting a second copy while one runs ("cannot listen for peers on
127.0.0.1:24080 (error while attempting to bind on address ('127.0.0.1', 24080): address already in
use); choose another with --peer-port") in the banner's one-line bold title made the window 1332 px
wide on a 1280 px screen, its right edge and the status bar's end off-screen.
"""

from __future__ import annotations

import pytest

from app.host import AppState
from tests.app.helpers import running_app
from tests.support.nodes import node_config

pytestmark = pytest.mark.gui

NARROW_SCREEN_PX = 1024


def test_a_start_error_wraps_in_the_banner_and_the_window_fits_a_screen(qtbot, run, data_dir, tmp_path, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as first:
            other = tmp_path / "other"
            other.mkdir()
            # the same peer port as the running app: the node cannot start
            config = node_config(other, tiny_model, peer_port=first.node.peers.listen_port)
            async with running_app(config) as second:
                assert second.host.state == AppState.ERROR
                window = second.window
                banner = window.overview_tab.banner
                assert banner.isVisible()
                assert "cannot listen for peers" in banner.title.text() + banner.text.text()
                width = window.minimumSizeHint().width()
                assert width <= NARROW_SCREEN_PX, f"the window needs {width} px for the start error"

    run(body())
