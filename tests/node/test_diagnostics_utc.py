"""The diagnostics report's `generated:` stamp and node.log's lines are UTC, marked Z (2026-12-07): the
stamp was local time with a zone's abbreviation and the log lines local with none, so a report and a
log pasted from another zone read hours apart."""

from __future__ import annotations

import calendar
import io
import logging
import re
import sys
import time

import aiohttp
import pytest

from node.inference.pipeline.budgets import ChoiceFailure
from node.logs import DATE_FORMAT, LOG_FORMAT, LineFormatter, LogFileHandler
from node.net._hints import no_answer_since
from tests.support.nodes import node_config, running_node


async def _report(node) -> str:
    url = f"http://127.0.0.1:{node.api.port}/api/admin/diagnostics"
    async with aiohttp.ClientSession() as s, s.get(url, headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        assert r.status == 200
        return await r.text()


@pytest.mark.llama
async def test_the_generated_stamp_is_utc_marked_z(tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Kathmandu")  # +05:45: no zone a local stamp could be mistaken for UTC in
    time.tzset()
    try:
        async with running_node(node_config(tmp_path / "data")) as node:
            before = time.time()
            text = await _report(node)
            after = time.time()
    finally:
        monkeypatch.undo()
        time.tzset()
    stamp = re.search(r"^generated: (\S+)  redacted: yes$", text, re.M)
    assert stamp is not None, text[:800]
    assert stamp.group(1).endswith("Z"), stamp.group(1)
    at = calendar.timegm(time.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%SZ"))  # (review r71: mktime and DST)
    assert int(before) - 1 <= at <= after + 1, (stamp.group(1), before, after)


def test_log_lines_are_stamped_in_utc_marked_z(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Kathmandu")
    time.tzset()
    try:
        record = logging.LogRecord("node.x", logging.INFO, __file__, 1, "hello", None, None)
        line = LineFormatter(LOG_FORMAT, DATE_FORMAT).format(record)
    finally:
        monkeypatch.undo()
        time.tzset()
    want = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z "
    assert line.startswith(want), (line, want)


def test_times_quoted_in_messages_and_the_log_writers_own_warning_are_utc_marked_z(monkeypatch):
    """Review r71: a gone peer's "no answer since", a failed layer choice's "chosen again at" (both
    quoted in node.log and the report) and the warning that node.log cannot be written (on stderr,
    under UTC lines) were local time with no zone."""
    now = time.time()
    days_ago = now - 3 * 86400
    said = io.StringIO()
    monkeypatch.setenv("TZ", "Asia/Kathmandu")
    time.tzset()
    try:
        monkeypatch.setattr(sys, "stderr", said)
        LogFileHandler._say("cannot write node.log")  # noqa: SLF001
        silent, silent_long = no_answer_since(now - 5, "timed out"), no_answer_since(days_ago, "timed out")
        failure = ChoiceFailure("m", 0, 2, "why", now, now + 60, 1).text()
    finally:
        monkeypatch.undo()
        time.tzset()
    def shown(t: float) -> str:  # (the time of day today, UTC; else the date too)
        today = time.gmtime(t)[:3] == time.gmtime(now)[:3]
        return time.strftime("%H:%M:%SZ" if today else "%Y-%m-%d %H:%MZ", time.gmtime(t))
    assert f"no answer since {shown(now - 5)} " in silent, silent
    assert f"no answer since {time.strftime('%Y-%m-%d %H:%MZ', time.gmtime(days_ago))} " in silent_long, silent_long
    assert failure.endswith(f"chosen again at {shown(now + 60)}"), failure
    stamp = said.getvalue().split(" ", 1)[0]
    at = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    assert abs(at - now) < 60, (stamp, now)
