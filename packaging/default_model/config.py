"""The one place every hyper-parameter of the default model lives (torch training and GGUF export)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

GGUF_NAME = "swarmllm-pydoc-q8_0.gguf"
MODEL_NAME = "SwarmLLM pydoc"


@dataclass(frozen=True)
class ModelConfig:
    """Llama architecture: RMSNorm, RoPE on adjacent pairs (llama.cpp's ``llama``), SwiGLU, GQA."""

    vocab_size: int = 4096
    dim: int = 256
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 4
    ffn_dim: int = 704  # a multiple of 32 (Q8_0 blocks) near 8/3 * dim
    context_length: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


@dataclass(frozen=True)
class CorpusConfig:
    """How docstrings become samples."""

    answer_chars: int = 450  # chat answers are cut at a sentence end before this
    text_chars: int = 1500  # plain-text samples are cut at a sentence end before this
    val_fraction: float = 0.04  # items (not samples) held out for validation
    chats_per_item: int = 2  # chat samples per item, each with its own phrasing


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; ``steps`` x ``batch_size`` x ``context_length`` = tokens seen."""

    seed: int = 1234
    steps: int = 3000
    batch_size: int = 2
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_batches: int = 8  # intermediate evals score this many batches; the final one all of them
    threads: int = 2  # fixed so float reductions happen in the same order every run


@dataclass(frozen=True)
class Config:
    """Everything one training run needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return asdict(self)
