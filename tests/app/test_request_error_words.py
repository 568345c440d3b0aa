"""A failed request's Outcome named the error's class ("error: InsufficientCapacity", seen under
Xvfb after the peer holding half of a split model left), words a user cannot read; what went
wrong was only in the cell's tooltip. The cell now says the error's message (the class stays in
the tooltip). A real node; a prompt longer than its context."""

from __future__ import annotations

import openai
import pytest

from tests.app.helpers import DEADLINE_S, running_app
from tests.support.nodes import node_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gui]


def test_a_failed_request_says_why_in_words(qtbot, run, data_dir, tiny_model):
    async def body():
        async with running_app(node_config(data_dir, tiny_model)) as app:
            client = openai.AsyncOpenAI(base_url=app.node.api_url, api_key=app.node.api_key, max_retries=0)
            try:
                with pytest.raises(openai.APIError) as raised:
                    await client.chat.completions.create(model=app.node.list_openai_models()[0]["id"],
                                                         max_tokens=8,
                                                         messages=[{"role": "user", "content": "word " * 6000}])
            finally:
                await client.close()
            rows = app.feeds.requests
            await wait_until(lambda: any(rows.cell_text(k, "Outcome").startswith("error") for k in rows.keys()),
                             DEADLINE_S, what="the failed request's row")
            key = next(k for k in rows.keys() if rows.cell_text(k, "Outcome").startswith("error"))
            text, trace = rows.cell_text(key, "Outcome"), rows.value(key)
            assert trace.error_type and trace.error_type not in text, text
            assert text == f"error: {trace.error_message}", (text, raised.value.message)

    run(body())
