"""phi3 (Phi-3, Phi-3.5, Phi-4 mini): fused attn_qkv, fused ffn_up = [gate; up], NeoX RoPE.

Long-context variants carry `rope_factors_short`/`rope_factors_long`; llama.cpp picks the short
factors while the context stays within the original training context, and so do we (the slice
engine never runs past `rope.scaling.original_context_length` with them). Phi's sliding window
is disabled in llama.cpp too.
"""

from __future__ import annotations

from node.inference.arch.common import LayerWeights, ModelConfig
from node.inference.arch.config import read_config
from node.inference.arch.tensors import read_layer
from node.inference.weights.gguf_file import GgufFile

ARCH = "phi3"


def config(f: GgufFile) -> ModelConfig:
    """Model hyper-parameters; short rope factors when present."""
    factors = "rope_factors_short.weight" if f.has("rope_factors_short.weight") else "rope_freqs.weight"
    return read_config(f, rope_factors_tensor=factors)


def load_layer(f: GgufFile, cfg: ModelConfig, i: int) -> LayerWeights:
    """Decoder block i."""
    return read_layer(f, cfg, i, adjacent_pairs=False)
