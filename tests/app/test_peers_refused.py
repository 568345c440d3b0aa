"""A device in another swarm (a friend's, not invited yet) that dials this node is refused and never
links: the Peers table had no row for it (only the "Refused" label above it named it by id). It
has one, state "refused", with why and what to do in its tooltip."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from node.net import Swarm
from node.net._hints import LET_IN
from node.node import Node
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.swarm import join_test_swarm
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui]


def test_a_refused_peer_that_never_linked_is_listed_with_what_to_do(qtbot, run, tmp_path):
    (tmp_path / "a").mkdir()
    join_test_swarm(tmp_path / "friend", Swarm.create())  # the friend's own swarm

    async def body():
        async with running_app(node_config(tmp_path / "a")) as app:
            friend = Node(node_config(tmp_path / "friend", bootstrap=[f"127.0.0.1:{app.node.peers.listen_port}"]))
            await friend.start()
            try:
                peers = app.feeds.peers
                await wait_until(lambda: peers.cell_text(friend.node_id, "State") == "refused",
                                 DEADLINE_S, 0.1, what="the refused friend in the table")
                assert peers.cell_text(friend.node_id, "Peer") == friend.short_id
                col = [c.title for c in peers.columns].index("State")
                tip = peers.data(peers.index(peers.row_of(friend.node_id), col), Qt.ItemDataRole.ToolTipRole)
                assert tip.startswith("not in this swarm: ") and LET_IN in tip, tip
                assert app.window.peers_tab.count.text() == "1 peer(s)"
            finally:
                await friend.stop()
    run(body())
