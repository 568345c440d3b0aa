"""A chat reply cut at the Chat tab's token limit says so, instead of stopping mid-sentence with no
sign (the stats only said "256 tokens"; a user asking for code got half of it and no hint why)."""

from __future__ import annotations

import pytest

from app.ui.chat_tab import MAX_TOKENS
from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def test_a_reply_cut_at_the_token_limit_says_so(qtbot, run, data_dir, long_model):
    async def body():
        async with running_app(node_config(data_dir, long_model)) as app:
            chat = app.window.chat_tab
            await wait_until(lambda: chat.send_button.isEnabled(), DEADLINE_S, what="the chat ready")
            await chat.send("def hello(")
            trace = app.node.traces.recent[-1]
            assert trace.finish_reason == "length" and trace.completion_tokens == MAX_TOKENS  # ran to the limit
            tail = chat.transcript.toPlainText()[-200:]
            assert f"{MAX_TOKENS} tokens" in tail and "cut" in tail, tail
            # the note is not part of the conversation sent back to the model
            assert "cut" not in chat.messages[-1]["content"][-60:]

    run(body())
