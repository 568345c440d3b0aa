"""llama (Llama 2/3, Mistral, SmolLM, TinyLlama): GQA, SwiGLU, optional rope_freqs (llama3 scaling).

llama.cpp applies RoPE to adjacent pairs (LLAMA_ROPE_TYPE_NORM) because the GGUF converter
permuted HF's Q/K rows; `read_layer(adjacent_pairs=True)` permutes them back to half-split.
Optional biases (attention output, q/k/v) are honoured when the file has them.
"""

from __future__ import annotations

from node.inference.arch.common import LayerWeights, ModelConfig
from node.inference.arch.config import read_config
from node.inference.arch.tensors import read_layer
from node.inference.weights.gguf_file import GgufFile

ARCH = "llama"


def config(f: GgufFile) -> ModelConfig:
    """Model hyper-parameters."""
    return read_config(f)


def load_layer(f: GgufFile, cfg: ModelConfig, i: int) -> LayerWeights:
    """Decoder block i."""
    return read_layer(f, cfg, i, adjacent_pairs=True)
