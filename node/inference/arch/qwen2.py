"""qwen2 (Qwen2, Qwen2.5): like llama but with q/k/v biases and NeoX (half-split) RoPE."""

from __future__ import annotations

from node.errors import ModelLoadError
from node.inference.arch.common import LayerWeights, ModelConfig
from node.inference.arch.config import read_config
from node.inference.arch.tensors import read_layer
from node.inference.weights.gguf_file import GgufFile

ARCH = "qwen2"


def config(f: GgufFile) -> ModelConfig:
    """Model hyper-parameters."""
    return read_config(f)


def load_layer(f: GgufFile, cfg: ModelConfig, i: int) -> LayerWeights:
    """Decoder block i (its q/k/v biases are required, as llama.cpp requires them)."""
    layer = read_layer(f, cfg, i, adjacent_pairs=False)
    if layer.qkv_bias is None:
        raise ModelLoadError(f"{f.path.name}: qwen2 block {i} has no q/k/v bias")
    return layer
