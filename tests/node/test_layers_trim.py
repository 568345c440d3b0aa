"""`swarmllm run --model URL --layers` restarted with another range: the parts of the old range
stayed on disk for ever (nothing reads them; an automatic move's old parts go once its new slice
has loaded), so a node moved by hand across a model ended up holding all of it (found by driving
a real node, 2026-12-06: --layers 0-5 then 6-11 left every layer of the file on disk)."""

from __future__ import annotations

from node.inference.synth import SynthSpec, write_gguf
from tests.support.nodes import node_config, running_node
from tests.support.rangeserver import ThreadedOrigin

SPEC = SynthSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=128, name="trim")


async def test_a_new_layer_range_drops_the_old_ranges_parts(tmp_path):
    data = write_gguf(tmp_path / "trim.gguf", SPEC).read_bytes()
    with ThreadedOrigin(data, name="trim.gguf") as origin:
        for layers in ("0-1", "2-3"):
            config = node_config(tmp_path / "data", models=[origin.url], layers=layers, slice_dtype="f32",
                                 slice_kv_dtype="f32")
            async with running_node(config) as node:
                [hosted] = node.slice_host.slices.values()
                assert hosted.state == "loaded", hosted.error
                held = hosted.entry.partial.held_layers
        assert held == [2, 3]
        [partial] = (tmp_path / "data" / "models").glob("*.partial")
        assert sorted(p.name for p in (partial / "parts").glob("layer-*")) == ["layer-0002.bin", "layer-0003.bin"]
