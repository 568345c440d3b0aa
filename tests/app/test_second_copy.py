"""A second copy of the app on the same data dir tells the user one is already running, and does
not start a second node with the same identity.

Seen in the app: the second copy's banner said "cannot listen for peers on …:8810 (… address already
in use); choose another with --peer-port" (the peer listener binds before the API, so the app's
own "port 8800 is already in use (another SwarmLLM or another program); quit it or start with -p
PORT" never shows). Following either advice (-p PORT, --peer-port) started a second node on the
same data dir: the same identity key and node id as the first, both serving, both writing the
same config.toml, swarm.json and peers.json.
"""

from __future__ import annotations

import pytest

from app.host import AppState
from tests.app.helpers import running_app
from tests.support.nodes import node_config

pytestmark = pytest.mark.gui


def test_a_second_copy_on_the_same_data_dir_says_one_runs_and_starts_no_node(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as first:
            assert first.host.state == AppState.SERVING
            # other ports (as the first copy's error advised): only the data dir is shared
            async with running_app(node_config(data_dir, tiny_model)) as second:
                assert second.host.state == AppState.ERROR
                text = second.host.first_run_text()
                assert "already running" in text, text
                assert second.node.api.port in (None, 0), "the second copy started an API"
                assert second.node.peers is None or second.node.peers.listen_port in (None, 0)
                assert second.window.isVisible()
            assert first.host.state == AppState.SERVING  # the refused copy did not disturb it
        # the first copy gone, a new one starts on that data dir
        async with running_app(node_config(data_dir, tiny_model)) as third:
            assert third.host.state == AppState.SERVING

    run(body())
