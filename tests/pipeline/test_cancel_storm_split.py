"""An editor's autocomplete cancel storm on the distributed route: two real nodes in the test's
process split a model (a [0-2] coordinates, b [3-5]); completions are sent and their connections
closed 10-100 ms later, one after another, while a chat streams alongside. Every cancelled request's
sessions are freed on both nodes, the honest coordinator's CANCEL / SESSION_END are never dropped by
b's per-sender budget, the chat's greedy text is what it is alone and a burst's last request gets
its text."""

from __future__ import annotations

import asyncio
import json
import os
import random

import aiohttp
import pytest

from tests.pipeline.swarm import split_model
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow]

STORM = int(os.environ.get("CANCEL_STORM_N", "40"))


async def _post(session, node, body: dict) -> tuple[int, str]:
    async with session.post(f"http://127.0.0.1:{node.api.port}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {node.api_key}"}) as r:
        raw = await r.text()
        if r.status != 200:
            return r.status, raw
        if not body.get("stream"):
            return r.status, json.loads(raw)["choices"][0]["message"]["content"]
        text = ""
        for line in raw.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:]).get("choices") or []:
                    text += (c.get("delta") or {}).get("content") or ""
        return r.status, text


async def test_a_cancel_storm_over_a_split_frees_both_nodes(tmp_path):
    model = split_model(tmp_path)
    common = dict(slice_dtype="f32", slice_kv_dtype="f32", activation_bits=32)
    async with running_node(node_config(tmp_path / "a", model, layers="0-2", **common)) as a:
        boot = [f"127.0.0.1:{a.peers.listen_port}"]
        async with running_node(node_config(tmp_path / "b", model, layers="3-5", bootstrap=boot, **common)) as b, \
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            auth = {"Authorization": f"Bearer {a.api_key}"}

            async def routed() -> str | None:
                async with s.get(f"http://127.0.0.1:{a.api.port}/v1/models", headers=auth) as r:
                    ids = [m["id"] for m in (await r.json())["data"] if m["name"] == "split6"]
                return ids[0] if ids and a.peers.link(b.node_id) else None
            model_id = await wait_until(routed, 60, 0.1, "a routing split6 over b")

            def body(i: int, max_tokens: int, stream: bool) -> dict:
                return {"model": model_id, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
                        "messages": [{"role": "user", "content": f"complete: def f{i}(x):\n    "}]}
            chat_body = body(-1, 48, True)
            status, chat_alone = await _post(s, a, chat_body)
            assert status == 200, chat_alone
            last = body(10_000, 8, False)
            _, last_alone = await _post(s, a, last)

            storming, rng, aborted = True, random.Random(3), 0

            async def chat_app() -> list[tuple[int, str]]:
                replies = []
                while storming or not replies:
                    replies.append(await _post(s, a, chat_body))
                return replies
            chat = asyncio.ensure_future(chat_app())
            lasts = []
            for i in range(STORM):
                task = asyncio.ensure_future(_post(s, a, body(i, 64, i % 2 == 0)))
                await asyncio.sleep(rng.uniform(0.01, 0.1))
                aborted += not task.done()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                if i % 10 == 9:
                    lasts.append(await _post(s, a, last))
            storming = False
            chats = await chat
            assert all(c == (200, chat_alone) for c in chats), chats[:2]
            assert all(r == (200, last_alone) for r in lasts), lasts

            def idle() -> bool:
                return (a.traces.in_flight == 0 and a.pipelines_in_flight() == 0
                        and b.slice_host.session_count() == 0
                        and a.slice_host.session_count() == 0)
            await wait_until(idle, 20, 0.05, "both nodes to free every session in use")
            print(f"split storm: aborted={aborted} cancelled={a.traces.counts['cancelled']} "
                  f"b_dropped={b.worker.control_budget.dropped} b_tombstones={len(b.worker.ended)} "
                  f"a_kv={a.slice_host.session_count()} b_kv={b.slice_host.session_count()} "
                  f"b_kept={b.slice_host.kept_count()}")
            assert b.worker.control_budget.dropped == 0 and a.worker.control_budget.dropped == 0
