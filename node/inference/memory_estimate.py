"""What a whole model costs in memory once llama.cpp loads it, told before it loads.

The file's bytes (the weights are mmapped: they count against RAM or VRAM as they are read) plus
its KV cache: the tokens `kv_sequences` gives it (every sequence at the served context) times K and
V per layer at F16, llama.cpp's default cache type, from the GGUF header alone (no torch, no file
read). Approximate: a sliding-window or MLA cache is smaller; compute buffers are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.models.gguf_meta import GgufHeader

KV_ELEMENT_BYTES = 2  # llama.cpp's default KV cache type, F16


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a whole model takes once loaded: its weights (the file) and its KV cache."""

    weights_bytes: int
    kv_bytes: int
    kv_tokens: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"weights_bytes": self.weights_bytes, "kv_bytes": self.kv_bytes, "kv_tokens": self.kv_tokens,
                "total_bytes": self.total_bytes}


def _per_layer(value: Any, n_layers: int) -> list[int]:
    """A header value given once or per layer (some models vary the KV heads by layer)."""
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value][:n_layers]
    return [int(value or 0)] * n_layers


def kv_bytes_per_token(header: GgufHeader) -> int:
    """K and V of one token over every layer, at F16 (0 when the header does not say)."""
    n_layers = header.n_layers
    n_heads = header.arch_get("attention.head_count", 0)
    heads = _per_layer(n_heads, n_layers)
    kv_heads = _per_layer(header.arch_get("attention.head_count_kv", n_heads), n_layers)
    hidden = int(header.arch_get("embedding_length", 0) or 0)
    default_dim = hidden // max(1, max(heads, default=1))
    k_dim = int(header.arch_get("attention.key_length", 0) or default_dim)
    v_dim = int(header.arch_get("attention.value_length", 0) or k_dim)
    return sum(n * (k_dim + v_dim) for n in kv_heads) * KV_ELEMENT_BYTES


def estimate_whole(header: GgufHeader, size_bytes: int, kv_tokens: int) -> MemoryEstimate:
    """The estimate for a whole model of `size_bytes` serving `kv_tokens` tokens of KV."""
    return MemoryEstimate(size_bytes, kv_bytes_per_token(header) * kv_tokens, kv_tokens)
