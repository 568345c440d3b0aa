"""A device in another swarm (a friend's, not invited yet) that dials this node is refused and never
links: the Peers table had no row for it (only the "Refused" label above it named it by id). It
has one, state "refused", with why and what to do in its tooltip."""

from __future__ import annotations

import asyncio

import pytest
from PySide6.QtCore import Qt

from app.ui.peers_model import REFUSED_ROWS_MAX
from node.net import Swarm
from node.net._hints import LET_IN
from node.node import Node
from tests.app.helpers import DEADLINE_S, running_app
from tests.net.rawclient import RawPeer
from tests.net.test_refusal_text import refuse_with
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
                assert "not in this swarm: " in tip and LET_IN in tip, tip
                assert app.window.peers_tab.count.text() == "1 peer(s)"
            finally:
                await friend.stop()
    run(body())


def test_strangers_refusals_fill_at_most_a_few_rows_shown_as_plain_text(qtbot, run, tmp_path):
    """Anyone who can reach the peer port can be refused under fresh identities, each answering our
    proof with its own text (found in review, 2026-12-06): the table kept a row per refusal (up to
    MAX_REFUSALS), its tooltip the stranger's text, rendered by Qt as rich text when it looked like
    HTML. Now the most recent REFUSED_ROWS_MAX rows, the text shown as the text it is."""
    (tmp_path / "a").mkdir()
    many = REFUSED_ROWS_MAX + 5

    async def body():
        async with running_app(node_config(tmp_path / "a")) as app:
            strangers = [RawPeer(tmp_path / f"s{i}", "127.0.0.1", app.node.peers.listen_port) for i in range(many)]
            for s in strangers:
                await asyncio.to_thread(refuse_with, s, "<b>bold</b> <a href='x'>click</a>")
            peers = app.feeds.peers
            last = strangers[-1].identity.node_id
            await wait_until(lambda: peers.cell_text(last, "State") == "refused", DEADLINE_S, 0.1,
                             what="the last stranger's row")
            states = [peers.cell_text(s.identity.node_id, "State") for s in strangers]
            assert states.count("refused") == REFUSED_ROWS_MAX, states
            assert all(st == "refused" for st in states[-REFUSED_ROWS_MAX:]), states  # the most recent
            col = [c.title for c in peers.columns].index("State")
            tip = peers.data(peers.index(peers.row_of(last), col), Qt.ItemDataRole.ToolTipRole)
            assert "&lt;b&gt;bold&lt;/b&gt;" in tip and "<b>" not in tip, tip
    run(body())
