"""What a whole model costs in memory once llama.cpp loads it, told before it loads.

The file's bytes (the weights are mmapped: they count against RAM or VRAM as they are read) plus
its KV cache: the tokens `kv_sequences` gives it (every sequence at the served context) times K and
V per layer at F16, llama.cpp's default cache type, from the GGUF header alone (no torch, no file
read). Split by where it lies: llama.cpp counts the output head as one more layer after the
blocks and offloads the last `n_gpu_layers` of them (llama-model.cpp: i_gpu_start = n_layer + 1 -
n_gpu_layers), so the head goes first, then the last blocks, with their KV cache (`offload_kqv`);
a head tied to the token embeddings (no output.weight) gets a GPU copy of them, on top of the
file. The token embeddings and the rest stay in RAM. An MLA model's cache (DeepSeek V2/V3
converted with `key_length_mla`) holds the compressed latent: kv_lora_rank + the rope dimensions,
one "head", no V; DeepSeek V3.2 / GLM-DSA add their lightning indexer's key cache
(`attention.indexer.key_length` per token, one head, on the layers `attention.indexer.types`
marks full, every layer when absent). Sliding-window layers are counted at
the full context: the node's contexts keep llama.cpp's default `swa_full` (a full-size SWA cache,
which its prefix cache needs). Compute buffers are not counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from node.models.gguf_meta import GgufHeader

KV_ELEMENT_BYTES = 2  # llama.cpp's default KV cache type, F16
_BLOCK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a whole model takes once loaded: its weights (the file) and its KV cache, and how
    much of both lies on a GPU (`gpu_bytes`) rather than in RAM. `head_copy_bytes`: a tied head's
    GPU copy of the token embeddings (in `gpu_bytes` and the total, not in the file)."""

    weights_bytes: int
    kv_bytes: int
    kv_tokens: int
    gpu_bytes: int = 0
    head_copy_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.head_copy_bytes

    @property
    def ram_bytes(self) -> int:
        return self.total_bytes - self.gpu_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"weights_bytes": self.weights_bytes, "kv_bytes": self.kv_bytes, "kv_tokens": self.kv_tokens,
                "total_bytes": self.total_bytes, "ram_bytes": self.ram_bytes, "gpu_bytes": self.gpu_bytes,
                "head_copy_bytes": self.head_copy_bytes}


def _per_layer(value: Any, n_layers: int) -> list[int]:
    """A header value given once or per layer (some models vary the KV heads by layer)."""
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value][:n_layers]
    return [int(value or 0)] * n_layers


def _indexer_layer_bytes_per_token(header: GgufHeader) -> list[int]:
    """A DSA model's lightning-indexer key cache per token and layer (llama-kv-cache-dsa.cpp: one
    K head of indexer key_length, no V), on the layers its indexer types mark full."""
    n_layers = header.n_layers
    key_length = int(header.arch_get("attention.indexer.key_length", 0) or 0)
    types = header.arch_get("attention.indexer.types")
    full = _per_layer(types, n_layers) if isinstance(types, (list, tuple)) else [1] * n_layers
    return [key_length * KV_ELEMENT_BYTES if f else 0 for f in full] + [0] * (n_layers - len(full))


def kv_layer_bytes_per_token(header: GgufHeader) -> list[int]:
    """K and V of one token in each layer, at F16 (zeros when the header does not say)."""
    n_layers = header.n_layers
    if header.arch_get("attention.key_length_mla") and header.arch_get("attention.kv_lora_rank"):
        # MLA as llama.cpp runs it: the cache holds the latent c_kv and the rope part of K, no V
        latent = int(header.arch_get("attention.kv_lora_rank")) + int(header.arch_get("rope.dimension_count", 0) or 0)
        indexer = _indexer_layer_bytes_per_token(header)
        return [latent * KV_ELEMENT_BYTES + i for i in indexer]
    n_heads = header.arch_get("attention.head_count", 0)
    heads = _per_layer(n_heads, n_layers)
    kv_heads = _per_layer(header.arch_get("attention.head_count_kv", n_heads), n_layers)
    hidden = int(header.arch_get("embedding_length", 0) or 0)
    default_dim = hidden // max(1, max(heads, default=1))
    k_dim = int(header.arch_get("attention.key_length", 0) or default_dim)
    v_dim = int(header.arch_get("attention.value_length", 0) or k_dim)
    return [n * (k_dim + v_dim) * KV_ELEMENT_BYTES for n in kv_heads]


def kv_bytes_per_token(header: GgufHeader) -> int:
    """K and V of one token over every layer, at F16 (0 when the header does not say)."""
    return sum(kv_layer_bytes_per_token(header))


def _tensor_bytes(t: Any) -> int:
    try:
        return t.n_bytes
    except (KeyError, ValueError):  # a type this gguf package does not know
        return 0


def _offloaded_weights(header: GgufHeader, first_gpu_layer: int, head_too: bool) -> int:
    """Bytes of the tensors llama.cpp puts on the GPU: blocks from `first_gpu_layer` on, and the
    output norm and head when the head is offloaded (the token embeddings stay in RAM)."""
    total = 0
    for t in header.tensors:
        block = _BLOCK.match(t.name)
        if int(block.group(1)) >= first_gpu_layer if block else head_too and t.name.startswith("output"):
            total += _tensor_bytes(t)
    return total


def _tied_head_copy(header: GgufHeader) -> int:
    """A head tied to the token embeddings (no output.weight): llama.cpp loads token_embd once
    more for the head's device (TENSOR_DUPLICATED), a copy on the GPU when the head is there."""
    names = {t.name: t for t in header.tensors}
    if "output.weight" in names or "token_embd.weight" not in names:
        return 0
    return _tensor_bytes(names["token_embd.weight"])


def estimate_whole(header: GgufHeader, size_bytes: int, kv_tokens: int, n_gpu_layers: int = 0) -> MemoryEstimate:
    """The estimate for a whole model of `size_bytes` serving `kv_tokens` tokens of KV, with
    `n_gpu_layers` offloaded as llama.cpp does: the head counts as one layer after the blocks and
    goes first (1: the head alone; 2: the head and the last block; -1: everything)."""
    per_layer = kv_layer_bytes_per_token(header)
    n_layers = len(per_layer)
    n = n_layers + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n_layers + 1)
    gpu = copy = 0
    if n >= 1:  # the head is on the GPU
        first = n_layers + 1 - n
        copy = _tied_head_copy(header)
        gpu = min(size_bytes, _offloaded_weights(header, first, True)) + copy
        gpu += sum(per_layer[first:]) * kv_tokens
    return MemoryEstimate(size_bytes, sum(per_layer) * kv_tokens, kv_tokens, gpu, copy)
