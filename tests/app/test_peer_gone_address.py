"""A peer that dialled this node and then left kept a row in the Peers tab whose Address turned
into the port its connection came from (127.0.0.1:49788, seen under Xvfb; /api/admin/peers said
the same): connected, the row said where the peer listens (127.0.0.1:42030); gone, it said an
ephemeral port nothing listens on. The address kept for a gone peer is now the one it can be
dialled at. Real nodes on loopback: B dials the app's node, then stops."""

from __future__ import annotations

import pytest

from node.node import Node
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui]


def test_a_gone_peer_keeps_the_address_it_listens_at(qtbot, run, tmp_path):
    async def body():
        async with running_app(node_config(tmp_path / "a")) as app:
            peers = app.feeds.peers
            app.window.peers_tab.show_addresses.setChecked(True)  # the addresses as they are
            b = Node(node_config(tmp_path / "b", bootstrap=[f"127.0.0.1:{app.node.peers.listen_port}"]))
            await b.start()
            stopped = False
            try:
                b_id = b.peers.node_id
                listens = f"127.0.0.1:{b.peers.listen_port}"
                await wait_until(lambda: peers.value(b_id) is not None and peers.cell_text(b_id, "State") == "connected",
                                 DEADLINE_S, what="B connected")
                assert peers.cell_text(b_id, "Address") == listens
                await b.stop()
                stopped = True
                await wait_until(lambda: peers.cell_text(b_id, "State") == "gone", DEADLINE_S, what="B gone")
                assert peers.cell_text(b_id, "Address") == listens, peers.value(b_id)
            finally:
                if not stopped:
                    await b.stop()

    run(body())
