"""The swarm in the desktop app: Invite a device… shows a working code and its QR; Join a swarm…
joins another node's swarm; the Peers tab and the tray say which swarm, and Remove takes a member out."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QDialogButtonBox, QMessageBox

from node.net import Swarm
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config, running_node
from tests.support.swarm import join_test_swarm
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui


def test_invite_join_and_remove_through_the_gui(qtbot, run, tmp_path, tiny_model):
    async def body():
        # the other device, alone in its own swarm
        join_test_swarm(tmp_path / "other", Swarm.create())
        async with running_node(node_config(tmp_path / "other", tiny_model)) as other, \
                running_app(node_config(tmp_path / "app", tiny_model)) as app:
            tab = app.window.peers_tab
            assert tab.swarm_label.text().startswith(f"Swarm {app.node.swarm_status()['swarm']} (private)")
            assert app.tray.swarm_action.text() == f"Swarm: {app.node.swarm_status()['swarm']} (private)"

            # Invite a device…: a code and its QR; the other node joins with it
            invite = tab.invite()
            await wait_until(lambda: invite.code.text().startswith("swarmllm1-"), DEADLINE_S, what="the code")
            assert invite.copy.isEnabled() and not invite.qr.pixmap().isNull()
            assert invite.qr.pixmap().width() >= 200
            await other.async_join(invite.code.text())
            await wait_until(lambda: app.node.peers.link(other.node_id) is not None, DEADLINE_S,
                             what="the invited node linked to the app's")
            await wait_until(lambda: "1 member(s) connected" in tab.swarm_label.text(), DEADLINE_S,
                             what="the Peers tab counting the member")
            invite.close()

            # Remove from swarm: select the member, confirm
            await wait_until(lambda: app.feeds.peers.rowCount() >= 1, DEADLINE_S, what="the member's row")
            row = next(i for i in range(app.feeds.peers.rowCount())
                       if app.feeds.peers.index(i, 0).data() == other.short_id)
            tab.view.selectRow(row)
            assert tab.remove_button.isEnabled()
            tab.remove_selected()
            box = next(b for b in tab.findChildren(QMessageBox) if b.windowTitle() == "Remove from swarm")
            next(b for b in box.buttons() if b.text() == "Remove").click()
            await wait_until(lambda: app.node.peers.link(other.node_id) is None and app.node.swarm_status()["epoch"] == 1,
                             DEADLINE_S, what="the member removed and the secret rotated")

            # Join a swarm…: the app joins a third node's swarm with its code
            join_test_swarm(tmp_path / "third", Swarm.create())
            async with running_node(node_config(tmp_path / "third", tiny_model)) as third:
                code, _ = await third.async_invite()
                dialog = tab.join()
                dialog.code.setText(code)
                dialog.join_button.click()
                await wait_until(lambda: dialog.status.text().startswith("Joined swarm"), DEADLINE_S,
                                 what="the join to finish")
                assert dialog.buttons.button(QDialogButtonBox.StandardButton.Cancel).text() == "Close"
                assert app.node.swarm_status()["swarm"] == third.swarm_status()["swarm"]
                await wait_until(lambda: third.peers.link(app.node.node_id) is not None, DEADLINE_S,
                                 what="the app's node linked into the third node's swarm")
                await wait_until(lambda: app.tray.swarm_action.text() == f"Swarm: {third.swarm_status()['swarm']} "
                                 "(private)", DEADLINE_S, what="the tray naming the new swarm")
                dialog.close()

                # Leave swarm: confirm; a new private swarm of its own, the third node's link gone
                tab.leave()
                box = next(b for b in tab.findChildren(QMessageBox) if b.windowTitle() == "Leave swarm")
                next(b for b in box.buttons() if b.text() == "Leave").click()
                await wait_until(lambda: app.node.swarm_status()["swarm"] != third.swarm_status()["swarm"]
                                 and third.peers.link(app.node.node_id) is None, DEADLINE_S, what="the app to leave")
                # the app dials the third node again: another swarm now, refused; the Peers tab says so
                await wait_until(lambda: f"{third.short_id} ×" in tab.refused_label.text()
                                 and tab.refused_label.isVisibleTo(tab), DEADLINE_S,
                                 what="the Peers tab naming the refused peer")

    run(body())
