"""Architecture families of the slice engine: one module each, shared pieces in `common`.

A family module exposes `ARCH`, `config(GgufFile) -> ModelConfig` and
`load_layer(GgufFile, ModelConfig, i) -> LayerWeights`; the forward itself is shared
(`arch.block`), because every supported family is a pre-norm RMSNorm/GQA/SwiGLU decoder once its
tensors are in canonical form.
"""

from __future__ import annotations

from types import ModuleType

from node.errors import UnsupportedArchitecture
from node.inference.arch import llama, phi3, qwen2, qwen3

FAMILIES: dict[str, ModuleType] = {m.ARCH: m for m in (llama, qwen2, qwen3, phi3)}


def family(arch: str) -> ModuleType:
    """The family module for a GGUF `general.architecture`, or UnsupportedArchitecture."""
    try:
        return FAMILIES[arch]
    except KeyError:
        raise UnsupportedArchitecture(f"unsupported architecture {arch or '(none)'}") from None
