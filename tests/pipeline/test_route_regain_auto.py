"""A `--serve auto` holder restarted (SIGKILL, same data dir) while requests arrive: every
request waits for it (ROUTE_REGAIN_S) and gets its 200 — also those arriving after it linked
again but before it had chosen and loaded its layers. Its HELLO came back with no slice (its
first choice waits AUTO_SERVE_LOOK_S and more, then loads): a request arriving then found the
peer linked, so not worth waiting for, and failed at once with a 503 "no holder has layers …"
(a churn test, 2026-12-06: 4 requests in 2 s, while those that arrived a moment earlier waited
and were served)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.pipeline.swarm import chat, run, wait_for_route, wait_peers
from tests.pipeline.test_autoserve import auto_model, held, per_layer, start_auto_node
from tests.pipeline.test_self_organising import empty_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]

THIRD_MB = 3  # f32 auto8 on f32 caches: three layers each, so two survivors cannot hold all eight


def test_requests_arriving_while_a_restarted_auto_holder_reloads_wait_for_it(tmp_path):
    model = auto_model(tmp_path)
    first = start_auto_node(tmp_path, "n0", model, [], budget_mb=THIRD_MB)
    nodes = [first] + [start_auto_node(tmp_path, f"n{i}", model, [first.peer_port], budget_mb=THIRD_MB)
                       for i in (1, 2)]
    empty = empty_node(tmp_path, "empty", [first.peer_port])
    procs = [*nodes, empty]
    try:
        async def formed():
            for p in nodes:
                await p.async_wait_ready()

            async def covered():
                return min(per_layer(await held(nodes))) >= 1
            await wait_until(covered, 60.0, 0.5, "every layer of auto8 to have a holder")
            await wait_peers(empty, 3)
            return await wait_for_route(empty, "auto8")
        model_id = run(formed())
        victim = nodes[1]

        async def restart_under_load():
            results: list[tuple[float, int, str]] = []
            began = time.monotonic()

            async def one(i: int):
                status, _, text = await chat(empty, model_id, f"question {i}", max_tokens=4, timeout_s=60)
                results.append((round(time.monotonic() - began, 2), status, text if status != 200 else ""))

            async def back():
                return (await held([victim]))[victim.name] if victim.alive() else []

            tasks = [asyncio.create_task(one(0))]
            await asyncio.to_thread(victim.kill)
            victim.start()
            deadline = time.monotonic() + 60
            i, served_since = 0, None
            while time.monotonic() < deadline:
                i += 1
                tasks.append(asyncio.create_task(one(i)))
                await asyncio.sleep(0.25)
                try:
                    if served_since is None and await back():
                        served_since = time.monotonic()
                except Exception:  # noqa: BLE001 - its API is not up yet
                    pass
                if served_since is not None and time.monotonic() - served_since > 1.0:
                    break
            await asyncio.gather(*tasks)
            return served_since, results
        served_since, results = run(restart_under_load())
        assert served_since is not None, "the restarted node never served its layers again"
        failed = [r for r in sorted(results) if r[1] != 200]
        assert not failed, f"{len(failed)} of {len(results)} requests failed: {failed[:3]}"
    finally:
        for p in procs:
            p.terminate()
