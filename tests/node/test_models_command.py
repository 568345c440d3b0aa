"""`swarmllm models` on a node serving a slice (`--layers`): the admin API's slice rows carry no
file metadata (architecture, quantization, size), and the command died with a KeyError traceback
instead of listing them (found by driving a real `--model URL --layers 0-5` node, 2026-12-06)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io

from node.commands.client import models
from node.inference.synth import SynthSpec, write_gguf
from tests.support.nodes import node_config, running_node
from tests.support.waiting import wait_until

SPEC = SynthSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=128, name="cli")


async def test_models_lists_a_slice(tmp_path):
    path = write_gguf(tmp_path / "cli.gguf", SPEC)
    config = node_config(tmp_path / "data", path, layers="1-2", slice_dtype="f32", slice_kv_dtype="f32")
    async with running_node(config) as node:
        await wait_until(lambda: any(s.state == "loaded" for s in node.slice_host.slices.values()), 60.0, 0.05,
                         "the slice")
        args = argparse.Namespace(port=node.api.port, data_dir=str(config.data_dir), json=False)

        def run() -> tuple[int, str]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = models(args)
            return rc, out.getvalue()
        rc, text = await asyncio.get_running_loop().run_in_executor(None, run)
        assert rc == 0
        row = next(line for line in text.splitlines() if line.startswith("cli-"))
        assert "1-2/4" in row and "loaded" in row, text
