"""What a whole model costs in memory once llama.cpp loads it, told before it loads.

The file's bytes (the weights are mmapped: they count against RAM or VRAM as they are read) plus
its KV cache: the tokens `kv_sequences` gives it (every sequence at the served context) times K and
V per layer at F16, llama.cpp's default cache type, from the GGUF header alone (no torch, no file
read). Split by where it lies: llama.cpp offloads the last `n_gpu_layers` blocks (all of them and
the output head at -1) with their KV cache (`offload_kqv`); the token embeddings and the rest stay
in RAM. An MLA model's cache (DeepSeek V2/V3 converted with `key_length_mla`) holds the compressed
latent: kv_lora_rank + the rope dimensions, one "head", no V. Sliding-window layers are counted at
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
    much of both lies on a GPU (`gpu_bytes`) rather than in RAM."""

    weights_bytes: int
    kv_bytes: int
    kv_tokens: int
    gpu_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes

    @property
    def ram_bytes(self) -> int:
        return self.total_bytes - self.gpu_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"weights_bytes": self.weights_bytes, "kv_bytes": self.kv_bytes, "kv_tokens": self.kv_tokens,
                "total_bytes": self.total_bytes, "ram_bytes": self.ram_bytes, "gpu_bytes": self.gpu_bytes}


def _per_layer(value: Any, n_layers: int) -> list[int]:
    """A header value given once or per layer (some models vary the KV heads by layer)."""
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value][:n_layers]
    return [int(value or 0)] * n_layers


def kv_layer_bytes_per_token(header: GgufHeader) -> list[int]:
    """K and V of one token in each layer, at F16 (zeros when the header does not say)."""
    n_layers = header.n_layers
    if header.arch_get("attention.key_length_mla") and header.arch_get("attention.kv_lora_rank"):
        # MLA as llama.cpp runs it: the cache holds the latent c_kv and the rope part of K, no V
        latent = int(header.arch_get("attention.kv_lora_rank")) + int(header.arch_get("rope.dimension_count", 0) or 0)
        return [latent * KV_ELEMENT_BYTES] * n_layers
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


def _offloaded_weights(header: GgufHeader, first_gpu_layer: int, head_too: bool) -> int:
    """Bytes of the tensors llama.cpp puts on the GPU: blocks from `first_gpu_layer` on, and the
    output norm and head when every block is there (the token embeddings stay in RAM)."""
    total = 0
    for t in header.tensors:
        block = _BLOCK.match(t.name)
        on_gpu = int(block.group(1)) >= first_gpu_layer if block else head_too and t.name.startswith("output")
        if on_gpu:
            try:
                total += t.n_bytes
            except (KeyError, ValueError):  # a type this gguf package does not know
                pass
    return total


def estimate_whole(header: GgufHeader, size_bytes: int, kv_tokens: int, n_gpu_layers: int = 0) -> MemoryEstimate:
    """The estimate for a whole model of `size_bytes` serving `kv_tokens` tokens of KV, with
    `n_gpu_layers` of its blocks offloaded as llama.cpp does (-1: all of them and the head)."""
    per_layer = kv_layer_bytes_per_token(header)
    n_layers = len(per_layer)
    on_gpu = n_layers if n_gpu_layers < 0 else min(n_gpu_layers, n_layers)
    first = n_layers - on_gpu
    gpu = 0
    if on_gpu:
        gpu = min(size_bytes, _offloaded_weights(header, first, n_gpu_layers < 0 or n_gpu_layers > n_layers))
        gpu += sum(per_layer[first:]) * kv_tokens
    return MemoryEstimate(size_bytes, sum(per_layer) * kv_tokens, kv_tokens, gpu)
