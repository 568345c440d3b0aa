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



def test_a_partial_offload_puts_the_head_first_as_llama_cpp_does(tmp_path):
    """Found in review (2026-12-07): llama.cpp counts the output head as one layer after the blocks
    (i_gpu_start = n_layer + 1 - n_gpu_layers): two layers offloaded are the head and blk.3, not
    blk.2 and blk.3 without the head."""
    header = _header(tmp_path)
    size = header.data_end()
    kv_per_layer = estimate_whole(header, size, 1000).kv_bytes // SPEC.n_layers

    def on_gpu(*prefixes):
        return sum(t.n_bytes for t in header.tensors if t.name.startswith(prefixes))

    two = estimate_whole(header, size, 1000, n_gpu_layers=2)
    assert two.gpu_bytes == on_gpu("blk.3.", "output") + kv_per_layer
    assert two.as_dict()["ram_bytes"] == two.total_bytes - two.gpu_bytes
    head_only = estimate_whole(header, size, 1000, n_gpu_layers=1)
    assert head_only.gpu_bytes == on_gpu("output") > 0
    every_block = estimate_whole(header, size, 1000, n_gpu_layers=SPEC.n_layers + 1)
    assert every_block == estimate_whole(header, size, 1000, n_gpu_layers=-1)


def test_a_tied_head_on_the_gpu_counts_its_copy_of_the_embeddings(tmp_path):
    """No output.weight: llama.cpp loads token_embd again for the head's device (TENSOR_DUPLICATED);
    the copy on the GPU was not counted."""
    header = read_header(write_gguf(tmp_path / "tied.gguf", dataclasses.replace(SPEC, tied=True)))
    assert "output.weight" not in {t.name for t in header.tensors}
    size = header.data_end()
    embeddings = sum(t.n_bytes for t in header.tensors if t.name == "token_embd.weight")
    on_cpu = estimate_whole(header, size, 1000)
    on_gpu = estimate_whole(header, size, 1000, n_gpu_layers=-1)
    assert on_gpu.head_copy_bytes == embeddings > 0 and on_cpu.head_copy_bytes == 0
    assert on_gpu.total_bytes == on_cpu.total_bytes + embeddings
    # RAM keeps the embeddings (and the file's padding); the GPU holds the rest and the copy
    assert on_gpu.ram_bytes == embeddings + (size - sum(t.n_bytes for t in header.tensors))


def test_a_dsa_model_counts_its_indexer_key_cache(tmp_path):
    """DeepSeek V3.2 / GLM-DSA keep a lightning-indexer K cache beside the MLA latent
    (llama-kv-cache-dsa.cpp: one head of indexer key_length, no V), left out until 2026-12-07."""
    mla = {"llama.attention.kv_lora_rank": 512, "llama.rope.dimension_count": 64,
           "llama.attention.key_length_mla": 192, "llama.attention.head_count_kv": 1}
    dsa = _header(tmp_path, **mla, **{"llama.attention.indexer.key_length": 128,
                                      "llama.attention.indexer.head_count": 64})
    assert kv_bytes_per_token(dsa) == SPEC.n_layers * (512 + 64 + 128) * KV_ELEMENT_BYTES
    # GLM-DSA: only the layers its indexer types mark full keep indexer keys
    glm = _header(tmp_path, **mla, **{"llama.attention.indexer.key_length": 128,
                                      "llama.attention.indexer.types": [1, 0, 0, 1]})
    assert kv_bytes_per_token(glm) == (SPEC.n_layers * (512 + 64) + 2 * 128) * KV_ELEMENT_BYTES
