"""`read_layer` gives its matrices as lazy row sources: any block of rows equals the same rows of the
matrix built whole (splits of a fused qkv, head permutations and [gate; up] stacks crossing blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from node.inference.arch import family
from node.inference.arch.common import neox_row_order, permute_heads
from node.inference.arch.tensors import StackedRows, TakenRows
from node.inference.synth import SynthSpec
from node.inference.weights.gguf_file import GgufFile
from node.inference.weights.linear import ArraySource


def _eager(f: GgufFile, cfg, i: int, arch: str) -> dict[str, np.ndarray]:
    """The canonical matrices built whole, as read_layer built them before it was lazy."""
    p = f"blk.{i}."
    if f.has(p + "attn_qkv.weight"):
        q, k, v = np.split(f.f32(p + "attn_qkv.weight"), [cfg.q_dim, cfg.q_dim + cfg.kv_dim])
    else:
        q, k, v = (f.f32(p + f"attn_{n}.weight") for n in "qkv")
    if arch == "llama":
        order = neox_row_order(cfg.head_dim, cfg.rope.n_rot)
        q, k = permute_heads(q, cfg.n_heads, order), permute_heads(k, cfg.n_kv_heads, order)
    gate_up = (np.concatenate([f.f32(p + "ffn_gate.weight"), f.f32(p + "ffn_up.weight")])
               if f.has(p + "ffn_gate.weight") else f.f32(p + "ffn_up.weight"))
    return {"qkv": np.concatenate([q, k, v]), "out": f.f32(p + "attn_output.weight"), "gate_up": gate_up,
            "down": f.f32(p + "ffn_down.weight")}


@pytest.mark.parametrize("arch", ["llama", "phi3", "qwen3"])
def test_every_block_of_rows_equals_the_whole_matrix(synth_model, arch):
    path = synth_model(SynthSpec(arch=arch, qtype="Q8_0", hidden=64, n_heads=4, n_kv_heads=2, ffn=96))
    f = GgufFile(path)
    fam = family(f.arch)
    cfg = fam.config(f)
    lazy = fam.load_layer(f, cfg, 1)
    rng = np.random.default_rng(0)
    for name, whole in _eager(f, cfg, 1, arch).items():
        src = getattr(lazy, name)
        assert not isinstance(src, np.ndarray), name  # read a block at a time, never whole
        assert tuple(src.shape) == whole.shape, name
        np.testing.assert_array_equal(src.rows(0, whole.shape[0]), whole, err_msg=name)
        for _ in range(20):  # blocks that start and end anywhere: across q/k/v, heads, gate/up
            a, b = sorted(int(x) for x in rng.integers(0, whole.shape[0] + 1, 2))
            np.testing.assert_array_equal(src.rows(a, b), whole[a:b], err_msg=f"{name}[{a}:{b}]")


def test_row_maps_refuse_what_does_not_fit():
    a = ArraySource(np.arange(12, dtype=np.float32).reshape(4, 3))
    with pytest.raises(ValueError, match="outside"):
        TakenRows(a, np.array([0, 4]))
    with pytest.raises(ValueError, match="widths"):
        StackedRows([a, ArraySource(np.zeros((2, 5), dtype=np.float32))])
    stacked = StackedRows([a, TakenRows(a, np.array([3, 1]))])
    np.testing.assert_array_equal(stacked.rows(2, 6), np.stack([a.array[2], a.array[3], a.array[3], a.array[1]]))
    assert stacked.rows(3, 3).shape == (0, 3)


def test_embedding_rows_read_with_pread_equal_the_mapped_rows(synth_model):
    """`lookup` (what a first slice embeds with) gives the rows the mapping holds, negative ids
    counted from the end, and refuses ids outside the table; dropping pages loses nothing."""
    f = GgufFile(synth_model(SynthSpec(qtype="Q8_0")))
    ids = np.array([0, 5, 511, -1, 5, 300])
    np.testing.assert_array_equal(f.lookup("token_embd.weight", ids), f.rows("token_embd.weight", ids))
    f.release_rows("token_embd.weight", 0, 512)
    np.testing.assert_array_equal(f.lookup("token_embd.weight", ids[:3]), f.f32("token_embd.weight")[[0, 5, 511]])
    with pytest.raises(IndexError):
        f.lookup("token_embd.weight", np.array([512]))
