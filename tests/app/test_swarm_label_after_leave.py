"""Leave swarm on a node with no peer: the Peers tab's swarm line and the tray's kept naming the
swarm it had left (they were redrawn on peer-row changes only, and a node alone has none); the
app's Join, Leave and Remove now say the swarm changed (NodeHost.swarm_changed)."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QMessageBox

from tests.app.helpers import running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui


def test_leaving_with_no_peer_renames_the_swarm_in_the_peers_tab_and_the_tray(qtbot, run, tmp_path):
    async def body():
        async with running_app(node_config(tmp_path / "app")) as app:
            tab = app.window.peers_tab
            old = app.node.swarm_status()["swarm"]
            assert tab.swarm_label.text().startswith(f"Swarm {old} (private)")
            tab.leave()
            box = next(b for b in tab.findChildren(QMessageBox) if b.windowTitle() == "Leave swarm")
            next(b for b in box.buttons() if b.text() == "Leave").click()
            await wait_until(lambda: app.node.swarm_status()["swarm"] != old, 30, what="the node to leave")
            new = app.node.swarm_status()["swarm"]
            await wait_until(lambda: tab.swarm_label.text().startswith(f"Swarm {new} (private)")
                             and app.tray.swarm_action.text() == f"Swarm: {new} (private)", 10,
                             what=f"the Peers tab and the tray naming {new}: {tab.swarm_label.text()!r}, "
                                  f"{app.tray.swarm_action.text()!r}")

    run(body())


def test_a_leave_through_the_admin_api_renames_the_swarm_in_the_app_too(qtbot, run, tmp_path):
    """Review r62: `swarmllm swarm leave` (the admin API) on the app's own node left both lines naming
    the old swarm: only the app's own buttons said the swarm changed. The node says it now."""
    async def body():
        import aiohttp

        async with running_app(node_config(tmp_path / "app")) as app:
            tab = app.window.peers_tab
            old = app.node.swarm_status()["swarm"]
            async with aiohttp.ClientSession() as session, session.post(
                    f"http://127.0.0.1:{app.node.api.port}/api/admin/swarm/leave",
                    headers={"Authorization": f"Bearer {app.node.api_key}"}) as reply:
                assert reply.status == 200, await reply.text()
            new = app.node.swarm_status()["swarm"]
            assert new != old
            await wait_until(lambda: tab.swarm_label.text().startswith(f"Swarm {new} (private)")
                             and app.tray.swarm_action.text() == f"Swarm: {new} (private)", 10,
                             what=f"the Peers tab and the tray naming {new}: {tab.swarm_label.text()!r}, "
                                  f"{app.tray.swarm_action.text()!r}")

    run(body())
