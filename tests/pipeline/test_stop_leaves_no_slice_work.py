"""What Node.stop leaves of its slices' work (2026-12-07): nothing runs after it. A paused `--layers`
slice waits for its peers' sessions to end before it is freed (Contributions' drains); no stop step
ended that wait, so it outlived the stop, woke later, and unloaded the slice into the executor the
stop had shut down (RuntimeError, an announce to peers already gone) or, in the app, was destroyed
pending with the loop. Real node in this process, real slice engine, a real session on the slice."""

from __future__ import annotations

import asyncio

from node import const
from tests.pipeline.swarm import split_model
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until


def _pending(name: str) -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name() == name and not t.done()]


async def test_a_paused_slice_waiting_for_its_sessions_is_not_freed_after_the_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(const, "NODE_DRAIN_S", 0.2)  # (the stop's drain: the session below never ends)
    model = split_model(tmp_path)
    config = node_config(tmp_path / "n", model, layers="0-5", slice_dtype="f32", activation_bits=32)
    async with running_node(config) as node:
        [hosted] = node.slice_host.slices.values()
        assert hosted.state == "loaded", hosted.error
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(hosted.executor, hosted.model.new_session, "a-peers-chat")
        await node.contributions.async_set_paused(True)  # "Pause contributing": freed once its session ends
        await wait_until(lambda: hosted.state == "draining", 10, what="the slice to drain")
        assert _pending("contribute-release"), "the paused slice's wait for its session"
    # stopped
    assert not _pending("contribute-release"), "the paused slice's wait outlived the node's stop"
