"""A split model (gguf-split's parts) is served whole on this node only, never as slices (2026-12-06).

Until then nothing stopped one from being taken for layers: `--layers` or `--serve auto` with part 1,
or "Help serve this model" (`POST /api/admin/contribute`). The slice engine read part 1 alone, whose
header gives plausible sizes though the tensors are in parts 2..N, so the slice failed late with an
error that did not say why. Now each of those refuses it at once, saying so."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import pytest
import pytest_asyncio

from node.errors import NodeError
from tests.node.test_model_file_kinds import rewrite
from tests.support.nodes import TINY, node_config, openai_client, running_node, tiny_model
from tests.support.ports import free_port
from tests.support.processes import REPO, hermetic_env

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

SAID = "a split model (3 parts) is served whole on this node only"


@pytest.fixture(scope="module")
def part1(tmp_path_factory):
    base = tmp_path_factory.mktemp("splitslices")
    rewrite(tiny_model(base, TINY, "src.gguf"), base / "big.gguf", split_max_tensors=8)
    return base / "big-00001-of-00003.gguf"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(part1, tmp_path_factory):
    async with running_node(node_config(tmp_path_factory.mktemp("holder") / "data", part1)) as n:
        yield n


@pytest.fixture(scope="module")
def client(node):
    return openai_client(node)  # (built off the loop: the SDK's models build on first use)


async def test_run_with_layers_of_a_split_model_stops_saying_why(part1, tmp_path):
    args = [sys.executable, "-m", "node.cli", "run", "-p", str(free_port()), "--data-dir", str(tmp_path / "d"),
            "--model", str(part1), "--no-default-model", "--layers", "0-1", "--no-mdns"]
    out = await asyncio.to_thread(subprocess.run, args, cwd=REPO, env=hermetic_env(), capture_output=True,
                                  text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert SAID in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("how", [{"layers": "0-1"}, {"serve": "auto"}], ids=["layers", "serve-auto"])
async def test_a_node_told_to_serve_layers_of_a_split_model_refuses_to_start(part1, tmp_path, how):
    with pytest.raises(NodeError) as refused:
        async with running_node(node_config(tmp_path / "data", part1, **how)):
            pass
    assert refused.value.code == "split_model_served_whole" and SAID in refused.value.message, refused.value


async def test_helping_serve_a_split_model_is_refused_and_it_still_answers_whole(node, client):
    (entry,) = [e for e in node.catalog.entries.values() if e.name == "big"]
    assert entry.split_count == 3
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {node.api_key}"}) as s:
        base = f"http://127.0.0.1:{node.api.port}"
        async with s.post(f"{base}/api/admin/contribute", json={"model": entry.id, "budget_mb": 0}) as r:
            status, body = r.status, json.loads(await r.text())
        assert status == 400, body
        assert body["error"]["code"] == "split_model_served_whole" and SAID in body["error"]["message"], body
        async with s.get(f"{base}/api/admin/contribute") as r:
            assert (await r.json())["models"] == []
        assert entry.id not in node.config.contribute_models and not node.slice_host.slices
        with pytest.raises(NodeError) as refused:  # the Swarm tab's "≈ N layers" of a budget
            await node.contributions.async_layer_cost(entry.id)
        assert SAID in refused.value.message, refused.value
    reply = await client.chat.completions.create(
        model=entry.id, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices[0].finish_reason in ("stop", "length")
