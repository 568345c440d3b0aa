"""Private swarms with real nodes: a request is never routed through another swarm's node, even
one that advertises every layer; invite and join through the CLI, then routed through, across a
restart without joining again; neither the secret nor an invite code reaches a report or a log."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from node.net import Swarm
from tests.pipeline.swarm import (
    chat,
    llama_greedy,
    run,
    split_model,
    start_slice_node,
    wait_for_route,
    wait_peers,
)
from tests.support.processes import REPO
from tests.support.swarm import join_test_swarm
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama, pytest.mark.slow]


def _cli(proc, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "node.cli", *args, "-p", str(proc.port), "--data-dir",
                           str(proc.data_dir)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def _swarm(proc) -> dict:
    return await proc.async_get_json("/api/admin/swarm")


def test_a_request_never_crosses_into_another_swarm(tmp_path):
    model = split_model(tmp_path)
    a1 = start_slice_node(tmp_path, "a1", model, "0-2")
    a2 = start_slice_node(tmp_path, "a2", model, "3-5", bootstrap=[a1.peer_port])
    join_test_swarm(tmp_path / "b1", Swarm.create())  # another swarm, holding every layer
    b1 = start_slice_node(tmp_path, "b1", model, "0-5", bootstrap=[a1.peer_port, a2.peer_port])
    procs = [a1, a2, b1]
    expected = llama_greedy(model, "which swarm?", 8)  # llama.cpp: not on the test's loop
    try:
        async def go():
            for p in procs:
                await p.async_wait_ready()
            model_id = await wait_for_route(a1, "split6")
            b_short = (await b1.async_get_json("/api/admin/stats"))["short_id"]
            a2_short = (await a2.async_get_json("/api/admin/stats"))["short_id"]

            async def refused_everywhere():
                for p in (a1, a2):
                    if not any(r["peer"] == b_short for r in (await _swarm(p))["refused"]):
                        return False
                return True
            await wait_until(refused_everywhere, 60, 0.2, "a1 and a2 to refuse b1")
            peers = (await a1.async_get_json("/api/admin/peers"))["peers"]
            assert not any(p["short_id"] == b_short and p["state"] == "connected" for p in peers)
            status, headers, text = await chat(a1, model_id, "which swarm?", max_tokens=8)
            assert status == 200, text
            assert b_short not in headers["x-swarm-nodes"] and a2_short in headers["x-swarm-nodes"]
            assert text == expected
            await asyncio.to_thread(a2.terminate)  # now only b1 holds layers 3-5: still never used
            await wait_until(lambda: wait_gone(a1, a2_short), 60, 0.2, "a1 to see a2 gone")
            status, headers, text = await chat(a1, model_id, "which swarm?", max_tokens=8)
            assert status == 503, (status, headers, text)
            assert json.loads(text)["error"]["type"]
            report = (await a1.async_get_text("/api/admin/diagnostics"))
            assert f"{b_short} refused (not in this swarm)" in report

        async def wait_gone(node, short):
            peers = (await node.async_get_json("/api/admin/peers"))["peers"]
            return not any(p["short_id"] == short and p["state"] == "connected" for p in peers)
        run(go())
    finally:
        for p in procs:
            p.terminate()


def test_invite_and_join_through_the_cli_then_routed_through_across_a_restart(tmp_path):
    model = split_model(tmp_path)
    a = start_slice_node(tmp_path, "a", model, "0-2")
    join_test_swarm(tmp_path / "c", Swarm.create())  # c starts alone in a swarm of its own
    c = start_slice_node(tmp_path, "c", model, "3-5", bootstrap=[a.peer_port])
    try:
        a.wait_ready()
        c.wait_ready()
        out = _cli(a, "invite")
        code = out.split()[0]
        assert code.startswith("swarmllm1-")
        assert "joined swarm" in _cli(c, "join", code)
        secret = json.loads((a.data_dir / "swarm.json").read_text())["secret"]
        assert json.loads((c.data_dir / "swarm.json").read_text())["secret"] == secret

        async def routed():
            model_id = await wait_for_route(a, "split6")
            await wait_peers(a, 1)
            status, headers, text = await chat(a, model_id, "joined", max_tokens=6)
            assert status == 200 and headers["x-swarm-segments"] == "2", (status, headers, text)
            return text
        expected = llama_greedy(model, "joined", 6)
        assert run(routed()) == expected
        c.terminate()
        c.start()  # same data dir: swarm.json and peers.json, no join again
        c.wait_ready()
        assert run(routed()) == expected
        status_out = _cli(c, "swarm")
        assert "members connected: 1" in status_out
        for proc in (a, c):  # never the secret or a code in a report or a log
            for full in ("", "?full=1"):
                report = run(proc.async_get_text("/api/admin/diagnostics" + full))
                assert secret not in report and code not in report and code[10:40] not in report
            logs = proc.node_log() + proc.output()
            assert secret not in logs and code not in logs and code[10:40] not in logs
    finally:
        a.terminate()
        c.terminate()
