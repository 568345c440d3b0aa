"""The memory a whole model takes, told before it loads: the KV cache as llama.cpp lays it out
(MLA's latent cache) and the part that lies on a GPU rather than in RAM.

Seen: a DeepSeek V2/V3 GGUF's KV read as one head of K (kv_lora_rank + rope) plus a V of
kv_lora_rank per layer, nearly twice what llama.cpp allocates; a model loaded on a GPU read as
all of it in RAM, so the Models tab's fit check compared VRAM-resident bytes with free RAM.
"""

from __future__ import annotations

import dataclasses

from node.inference.memory_estimate import KV_ELEMENT_BYTES, estimate_whole, kv_bytes_per_token
from node.inference.synth import SynthSpec, write_gguf
from node.models.gguf_meta import read_header

SPEC = SynthSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=300)


def _header(tmp_path, **metadata):
    header = read_header(write_gguf(tmp_path / "m.gguf", SPEC))
    return dataclasses.replace(header, metadata={**header.metadata, **metadata})


def test_an_mla_model_caches_the_latent_and_the_rope_part_only(tmp_path):
    # DeepSeek V3 as convert_hf_to_gguf writes it for llama.cpp's MLA: one KV "head" whose K is the
    # latent plus the rope dimensions (576) and whose V is the latent (512)
    header = _header(tmp_path, **{"llama.attention.kv_lora_rank": 512, "llama.rope.dimension_count": 64,
                                  "llama.attention.key_length_mla": 192, "llama.attention.value_length_mla": 128,
                                  "llama.attention.head_count_kv": 1, "llama.attention.key_length": 576,
                                  "llama.attention.value_length": 512})
    assert kv_bytes_per_token(header) == SPEC.n_layers * (512 + 64) * KV_ELEMENT_BYTES


def test_an_old_deepseek_conversion_without_mla_keys_keeps_its_full_cache(tmp_path):
    # no key_length_mla: llama.cpp runs it without MLA, K and V per head as the header says
    header = _header(tmp_path, **{"llama.attention.kv_lora_rank": 512, "llama.attention.head_count_kv": 4,
                                  "llama.attention.key_length": 192, "llama.attention.value_length": 128})
    assert kv_bytes_per_token(header) == SPEC.n_layers * 4 * (192 + 128) * KV_ELEMENT_BYTES


def test_sliding_window_layers_count_the_full_context(tmp_path):
    # the node's llama.cpp contexts keep swa_full (the default): a full-size cache on those layers too
    plain = _header(tmp_path)
    windowed = _header(tmp_path, **{"llama.attention.sliding_window": 128})
    assert kv_bytes_per_token(windowed) == kv_bytes_per_token(plain) > 0


def test_what_a_gpu_holds_takes_no_ram(tmp_path):
    header = _header(tmp_path)
    size = header.data_end()
    on_cpu = estimate_whole(header, size, 1000)
    assert on_cpu.gpu_bytes == 0 and on_cpu.ram_bytes == on_cpu.total_bytes == size + on_cpu.kv_bytes

    embeddings = sum(t.n_bytes for t in header.tensors if t.name.startswith("token_embd"))
    all_on_gpu = estimate_whole(header, size, 1000, n_gpu_layers=-1)
    assert all_on_gpu.total_bytes == on_cpu.total_bytes
    # the token embeddings stay in RAM (llama.cpp keeps them on the CPU); blocks, head and cache go
    assert all_on_gpu.ram_bytes == embeddings + (size - sum(t.n_bytes for t in header.tensors))
    assert all_on_gpu.gpu_bytes == on_cpu.total_bytes - all_on_gpu.ram_bytes

    half = estimate_whole(header, size, 1000, n_gpu_layers=2)  # the last two blocks and their cache
    blocks_2_3 = sum(t.n_bytes for t in header.tensors if t.name.startswith(("blk.2.", "blk.3.")))
    assert half.gpu_bytes == blocks_2_3 + on_cpu.kv_bytes // 2
    assert half.as_dict()["ram_bytes"] == half.total_bytes - half.gpu_bytes
