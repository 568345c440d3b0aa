"""A `--model URL --layers` node restarted after the file at its URL changed (same header and size,
a new ETag: the same model id) must serve the new bytes. It refetched them, but its weight cache
still held the old version's int8 conversions under the same id, and the slice loaded those
(`weight_cache=hit`): the node computed with weights that are no longer at the origin (found by
driving real nodes against a local origin, 2026-12-06)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from node.inference.slice.model import SliceModel
from node.inference.synth import SynthSpec, write_gguf
from tests.support.nodes import node_config, running_node
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until

SPEC = SynthSpec(n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, ffn=256, vocab=512, n_ctx=128, name="ver")


def _loaded(node):
    return next((s for s in node.slice_host.slices.values() if s.state == "loaded"), None)


async def test_a_node_restarted_after_the_origin_changed_serves_the_new_weights(tmp_path):
    loop = asyncio.get_running_loop()
    v1 = write_gguf(tmp_path / "v1.gguf", SPEC).read_bytes()
    v2_path = write_gguf(tmp_path / "v2.gguf", SPEC.replace(seed=1))
    v2 = v2_path.read_bytes()
    assert len(v1) == len(v2) and v1 != v2
    config = node_config(tmp_path / "data", layers="0-1", slice_dtype="int8", slice_kv_dtype="f32")
    with ThreadedOrigin(v1) as origin:
        config.models = [origin.url]
        async with running_node(config) as node:
            await wait_until(lambda: _loaded(node) is not None, 60.0, 0.05, "the slice of v1")
            model_id = _loaded(node).entry.id
        origin.data, origin.etag = v2, '"v2"'  # a new version of the file at the same URL
        async with running_node(config) as node:
            await wait_until(lambda: _loaded(node) is not None, 60.0, 0.05, "the slice after the change")
            served = _loaded(node)
            assert served.entry.id == model_id  # the same header and size: the same id
            tokens = torch.tensor([1, 5, 9, 42, 7])

            def logits() -> tuple[torch.Tensor, torch.Tensor]:
                fresh = SliceModel.load(v2_path, 0, 2, dtype="int8", kernel=served.model.kernel, kv_dtype="f32")
                return (served.model.forward(served.model.new_session("a"), tokens, 0),
                        fresh.forward(fresh.new_session("b"), tokens, 0))
            got, want = await loop.run_in_executor(None, logits)
            assert served.model.weight_cache != "hit", "the old version's cached conversions were used"
            assert torch.equal(got, want)


pytestmark = pytest.mark.asyncio
