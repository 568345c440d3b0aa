"""`/api/admin/stats` says how often this node was itself paused (its loop stalled SELF_PAUSE_MIN_S
or more: SIGSTOP, a lid closed, a VM paused) and how long the last pause lasted, beside
`loop_stalls` (until 2026-12-07 it had only `loop_stalls`, which counts every stall over 100 ms:
a pause was told only by the log's `DIAG: this node was paused`). A real node in this process, its
loop blocked as a paused process's is."""

from __future__ import annotations

import json

import pytest

from node import const
from tests.node.test_api import raw
from tests.support.nodes import node_config, running_node
from tests.support.pause_harness import pause_this_node
from tests.support.waiting import wait_until


async def _stats(node) -> dict:
    status, _, text = await raw(node, "GET", "/api/admin/stats")
    assert status == 200, text
    return json.loads(text)


@pytest.mark.blocks_loop("this node's own pause, for its stats")
async def test_stats_count_this_nodes_pauses_and_the_last_ones_length(tmp_path):
    async with running_node(node_config(tmp_path / "data")) as node:
        before = await _stats(node)
        assert before["self_pauses"] == node.watchdog.pause_count
        if before["self_pauses"] == 0:
            assert before["last_pause_s"] is None
        pause_this_node(const.SELF_PAUSE_MIN_S + 0.5)
        after = await wait_until(lambda: _stats_after(node, before), 10, 0.1, what="the pause in the stats")
        assert after["self_pauses"] >= before["self_pauses"] + 1
        assert after["last_pause_s"] >= const.SELF_PAUSE_MIN_S, after
        assert after["loop_stalls"] >= before["loop_stalls"] + 1


async def _stats_after(node, before: dict) -> dict | None:
    stats = await _stats(node)
    return stats if stats["self_pauses"] > before["self_pauses"] else None
