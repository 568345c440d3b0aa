"""qwen3: llama-like with per-head RMSNorm on Q and K before RoPE, NeoX RoPE, no biases."""

from __future__ import annotations

from node.errors import ModelLoadError
from node.inference.arch.common import LayerWeights, ModelConfig
from node.inference.arch.config import read_config
from node.inference.arch.tensors import read_layer
from node.inference.weights.gguf_file import GgufFile

ARCH = "qwen3"


def config(f: GgufFile) -> ModelConfig:
    """Model hyper-parameters (head_dim may differ from hidden/heads: attention.key_length)."""
    return read_config(f)


def load_layer(f: GgufFile, cfg: ModelConfig, i: int) -> LayerWeights:
    """Decoder block i with its q/k norms."""
    layer = read_layer(f, cfg, i, adjacent_pairs=False)
    if layer.q_norm is None or layer.k_norm is None:
        raise ModelLoadError(f"{f.path.name}: qwen3 block {i} lacks attn_q_norm/attn_k_norm")
    return layer
