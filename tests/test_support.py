"""The suite's own helpers (tests/support): what every test relies on them to do."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.sse import DONE, delta_text, finish_reasons, sse_data
from tests.support.waiting import wait_until, wait_until_sync


def test_sse_data_follows_the_event_stream_rules():
    body = ('data: {"a": 1}\n\n'
            ": a comment line\n"
            "event: ignored\n"
            "data:no-space\n\n"
            "data: first\ndata: second\n\n"
            "data: [DONE]")  # no blank line at the very end
    assert sse_data(body) == ['{"a": 1}', "no-space", "first\nsecond", DONE]
    assert sse_data("data: x\r\n\r\n") == ["x"]


def test_stream_chunk_text_and_finish_reasons():
    chat = {"choices": [{"delta": {"content": "he"}}, {"delta": {"content": "y"}, "finish_reason": "stop"}]}
    assert delta_text(chat) == "hey" and finish_reasons(chat) == ["stop"]
    assert delta_text({"choices": [{"text": "abc", "finish_reason": None}]}) == "abc"
    assert delta_text({"choices": [{"delta": {"role": "assistant", "content": None}}]}) == ""
    assert finish_reasons({"choices": []}) == []


async def test_wait_until_returns_the_value_and_accepts_coroutines():
    box = []
    asyncio.get_running_loop().call_later(0.05, box.append, "ready")

    async def check():
        return box and box[0]
    assert await wait_until(check, 5, 0.01, "the box") == "ready"


async def test_wait_until_names_what_it_waited_for():
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0.2 s waiting for the impossible"):
        await wait_until(lambda: False, 0.2, 0.05, "the impossible")
    assert time.monotonic() - started >= 0.2


def test_wait_until_sync_checks_once_more_after_the_deadline():
    calls = []

    def late():
        calls.append(time.monotonic())
        return len(calls) >= 2  # true on the poll after the sleep that crosses the deadline
    assert wait_until_sync(late, 0.01, 0.05, "the second poll")
    with pytest.raises(AssertionError, match="waiting for never"):
        wait_until_sync(lambda: False, 0.1, 0.02, "never")
