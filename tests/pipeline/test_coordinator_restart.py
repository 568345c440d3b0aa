"""A coordinator that restarts (kill -9, then the same data dir: same identity, a new process)
while its peer keeps KV sessions for its conversations: the new process knows nothing of them (its
prefix cache died with the old one), yet the peer held them for KEPT_SESSION_TTL_S (900 s), KV
counted against its budget, pushing other coordinators' kept sessions out. Now the peer frees them
as soon as the new process links (its HELLO's boot_id differs), with one DIAG line. A link that
merely comes back from the same process (paused past the peer's liveness deadline) keeps them:
the next turn still resumes them."""

from __future__ import annotations

import asyncio
import re
import signal

import openai
import pytest

from tests.pipeline.swarm import split_model, start_slice_node, wait_for_route, wait_peers
from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow]

OPENER = "tell me everything about the swarm and how its nodes share the layers of one model"


def _chat(a: NodeProcess, model_id: str, messages: list[dict]):
    client = openai.OpenAI(base_url=a.base + "/v1", api_key=a.api_key, max_retries=0, timeout=120)
    return client.chat.completions.create(model=model_id, messages=messages, max_tokens=6, temperature=0)


async def _linked(b: NodeProcess, a_id: str, connected: bool) -> bool:
    peers = (await b.async_get_json("/api/admin/peers"))["peers"]
    return any(p["node_id"] == a_id and p["state"] == "connected" for p in peers) == connected


async def _kept(b: NodeProcess) -> int:
    return (await b.async_get_json("/api/admin/stats"))["kv_kept"]


async def _one_kept(b: NodeProcess) -> bool:
    """b keeps one session (the last turn's) and has none in use."""
    stats = await b.async_get_json("/api/admin/stats")
    return (stats["kv_sessions"], stats["kv_kept"]) == (0, 1)


def test_a_restarted_coordinators_kept_sessions_are_freed_and_a_relinked_ones_are_not(tmp_path):
    model = split_model(tmp_path)
    a = start_slice_node(tmp_path, "a", model, "0-2")
    b = start_slice_node(tmp_path, "b", model, "3-5", bootstrap=[a.peer_port])
    try:
        async def ready() -> tuple[str, str]:
            for p in (a, b):
                await p.async_wait_ready()
            await wait_peers(a, 1)
            return await wait_for_route(a, "split6"), (await a.async_get_json("/api/admin/stats"))["node_id"]
        model_id, a_id = asyncio.run(ready())
        messages = [{"role": "user", "content": OPENER}]
        reply = _chat(a, model_id, messages)
        asyncio.run(wait_until(lambda: _one_kept(b), 30, 0.1, "b to keep the first turn's session"))

        # the same process, its link lost and regained: b keeps what it keeps for it
        a.send_signal(signal.SIGSTOP)
        try:
            asyncio.run(wait_until(lambda: _linked(b, a_id, False), 30, 0.1, "b to find a's link dead"))
        finally:
            a.send_signal(signal.SIGCONT)
        asyncio.run(wait_until(lambda: _linked(b, a_id, True), 30, 0.1, "a to link again"))
        assert asyncio.run(_kept(b)) == 1
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "and then?"}]
        turn2 = _chat(a, model_id, messages)
        assert turn2.usage.prompt_tokens_details.cached_tokens > 0  # resumed the kept sessions
        asyncio.run(wait_until(lambda: _one_kept(b), 30, 0.1, "b to keep the second turn's session"))
        assert "restarted coordinator" not in b.node_log()

        # a new process with the same identity: what b kept for the old one goes at once
        a.kill()
        a.start()
        asyncio.run(wait_until(lambda: _linked(b, a_id, True), 60, 0.1, "the restarted a to link"))
        asyncio.run(wait_until(lambda: _no_kept(b), 30, 0.1,
                               "b to free the old process's kept session"))
        line = re.findall(r"DIAG: KV sessions of a restarted coordinator freed .*", b.node_log())
        assert len(line) == 1 and f"peer_id={a_id[:8]}" in line[0] and "count=1" in line[0], line
        assert int(re.search(r"bytes_freed=(\d+)", line[0]).group(1)) > 0
    finally:
        for p in (a, b):
            p.terminate()


async def _no_kept(b: NodeProcess) -> bool:
    return await _kept(b) == 0
