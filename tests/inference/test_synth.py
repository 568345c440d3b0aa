"""synth.py writes GGUFs whose metadata, vocabulary and tensors read back as specified."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf import quants as gq

from node.inference.synth import SynthSpec, synth_vocab, write_gguf
from node.inference.weights import dequant


def _field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3"])
def test_written_file_reads_back(tmp_path, arch):
    spec = SynthSpec(arch=arch, n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=96, vocab=300)
    reader = GGUFReader(write_gguf(tmp_path / "m.gguf", spec))
    assert _field(reader, "general.architecture") == arch
    assert _field(reader, f"{arch}.block_count") == 2
    assert _field(reader, f"{arch}.attention.head_count_kv") == 2
    assert len(_field(reader, "tokenizer.ggml.tokens")) == 300
    names = {t.name for t in reader.tensors}
    assert "output.weight" in names
    assert "blk.1.ffn_down.weight" in names
    assert ("blk.0.attn_qkv.weight" in names) == (arch == "phi3")
    assert ("blk.0.attn_q.bias" in names) == (arch == "qwen2")
    assert ("blk.0.attn_k_norm.weight" in names) == (arch == "qwen3")


def test_tied_output_and_llama3_rope_factors(tmp_path):
    spec = SynthSpec(tied=True, rope_scaling="llama3", rope_scaling_factor=8.0, rope_orig_ctx=64)
    reader = GGUFReader(write_gguf(tmp_path / "m.gguf", spec))
    names = {t.name for t in reader.tensors}
    assert "output.weight" not in names
    freqs = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
    assert freqs.data.shape == (spec.hd // 2,)
    assert freqs.data.min() == 1.0
    assert freqs.data.max() == 8.0


def test_vocab_has_bytes_and_reachable_words():
    tokens, scores, types = synth_vocab(600)
    assert len(tokens) == len(scores) == len(types) == 600
    assert tokens[3 + 0x0A] == "<0x0A>"
    assert types[3 + 0x0A] == 6
    assert {"\u2581the", "\u2581th", "\u2581t"} <= set(tokens)
    assert len(set(tokens)) == 600


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "BF16"])
def test_quantizers_round_trip_through_reference_dequantizer(qtype):
    kind = GGMLQuantizationType[qtype]
    x = np.random.default_rng(1).standard_normal((8, 512)).astype(np.float32)
    raw = dequant.quantize(x, kind)
    ref = gq.dequantize(raw, kind).reshape(x.shape)
    ours = dequant.dequantize(raw, kind, x.shape)
    np.testing.assert_array_equal(ours, ref)
    rel = np.abs(ref - x).max() / np.abs(x).max()
    assert rel < {"Q4_0": 0.15, "Q4_K": 0.1, "Q5_K": 0.05, "Q6_K": 0.03}.get(qtype, 0.01)
