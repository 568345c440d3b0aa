"""The Chat tab's route badge and timings belong to the last reply: New chat clears them (no empty
coloured pill left), and a reply that fails does not keep the previous reply's.

Seen in the app: after New chat the badge's text was cleared but not its green background (an
empty green pill stayed top right), and a reply refused by the node ("maximum context length …")
showed under the previous reply's "local" badge and "TTFT 229 ms · 154.8 tok/s · 256 tokens".
"""

from __future__ import annotations

import pytest

from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gui


def _badge_shown(chat) -> bool:
    """What the user sees: a badge with text or with its coloured background."""
    badge = chat.route_badge
    return badge.isVisible() and bool(badge.text().strip() or "background" in badge.styleSheet())


def test_new_chat_and_a_failed_reply_leave_no_stale_badge(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            app.window.show_tab("Chat")
            chat = app.window.chat_tab
            await wait_until(lambda: chat.send_button.isEnabled(), DEADLINE_S, what="the chat ready")
            await chat.send("hello")
            assert _badge_shown(chat) and chat.route_badge.text().strip() == "local"
            assert chat.stats.text()
            chat.new_button.click()
            assert not _badge_shown(chat), f"badge after New chat: {chat.route_badge.styleSheet()!r}"
            assert chat.stats.text() == ""
            await chat.send("hello again")
            assert _badge_shown(chat)
            task = chat.send("word " * 5000)  # longer than the model's context: the node refuses it
            await wait_until(lambda: task.done(), DEADLINE_S, what="the refused reply")
            assert "maximum context length" in chat.transcript.toPlainText()
            assert not _badge_shown(chat), "the failed reply shows the previous reply's route"
            assert chat.stats.text() == "", f"the failed reply shows the previous reply's timings: {chat.stats.text()}"

    run(body())
