"""`ModelConfig` from GGUF metadata, the way llama.cpp's loader reads the same keys."""

from __future__ import annotations

from node.errors import ModelLoadError
from node.inference.arch.common import ModelConfig, RopeConfig
from node.inference.weights.gguf_file import GgufFile


def read_config(f: GgufFile, *, rope_factors_tensor: str | None = "rope_freqs.weight") -> ModelConfig:
    """Hyper-parameters of the model in `f` (shared by every family)."""
    try:
        n_heads = int(f.arch_field("attention.head_count"))
        hidden = int(f.arch_field("embedding_length"))
        n_layers = int(f.arch_field("block_count"))
        ffn = int(f.arch_field("feed_forward_length"))
    except TypeError as exc:
        raise ModelLoadError(f"{f.path.name}: incomplete {f.arch} metadata ({exc})") from exc
    n_kv = f.arch_field("attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):
        raise ModelLoadError(f"{f.path.name}: per-layer head_count_kv is not supported")
    head_dim = int(f.arch_field("attention.key_length", hidden // n_heads))
    vocab = f.shape("token_embd.weight")[0] if f.has("token_embd.weight") else f.array_length("tokenizer.ggml.tokens")
    n_ctx_train = int(f.arch_field("context_length", 2048))
    return ModelConfig(
        arch=f.arch,
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=int(n_kv),
        head_dim=head_dim,
        ffn=ffn,
        vocab=int(vocab),
        n_ctx_train=n_ctx_train,
        rms_eps=float(f.arch_field("attention.layer_norm_rms_epsilon", 1e-5)),
        rope=read_rope(f, head_dim, n_ctx_train, rope_factors_tensor),
    )


def read_rope(f: GgufFile, head_dim: int, n_ctx_train: int, factors_tensor: str | None) -> RopeConfig:
    """Rotary parameters: base, linear/yarn scaling factor, llama3-style frequency factors."""
    scaling = str(f.arch_field("rope.scaling.type", "none"))
    factor = float(f.arch_field("rope.scaling.factor", 0.0) or f.arch_field("rope.scale_linear", 0.0) or 0.0)
    if scaling == "longrope" and f.arch != "phi3":
        raise ModelLoadError(f"{f.path.name}: longrope scaling is only supported for phi3")
    factors = None
    if factors_tensor and f.has(factors_tensor):
        factors = tuple(float(x) for x in f.f32(factors_tensor))
    yarn = scaling == "yarn"
    return RopeConfig(
        n_rot=int(f.arch_field("rope.dimension_count", head_dim)),
        base=float(f.arch_field("rope.freq_base", 10000.0)),
        freq_scale=1.0 / factor if factor else 1.0,
        freq_factors=factors,
        ext_factor=float(f.arch_field("rope.scaling.yarn_ext_factor", 1.0)) if yarn else 0.0,
        attn_factor=float(f.arch_field("rope.scaling.attn_factor", 1.0)),
        beta_fast=float(f.arch_field("rope.scaling.yarn_beta_fast", 32.0)),
        beta_slow=float(f.arch_field("rope.scaling.yarn_beta_slow", 1.0)),
        n_ctx_orig=int(f.arch_field("rope.scaling.original_context_length", n_ctx_train)),
    )
