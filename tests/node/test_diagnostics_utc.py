"""The diagnostics report's `generated:` stamp and node.log's lines are UTC, marked Z (2026-12-07): the
stamp was local time with a zone's abbreviation and the log lines local with none, so a report and a
log pasted from another zone read hours apart."""

from __future__ import annotations

import logging
import re
import time

import aiohttp
import pytest

from node.logs import DATE_FORMAT, LOG_FORMAT, LineFormatter
from tests.support.nodes import node_config, running_node

pytestmark = pytest.mark.llama


async def _report(node) -> str:
    url = f"http://127.0.0.1:{node.api.port}/api/admin/diagnostics"
    async with aiohttp.ClientSession() as s, s.get(url, headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        assert r.status == 200
        return await r.text()


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
    at = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%SZ")) - time.timezone  # (TZ is UTC again here)
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
