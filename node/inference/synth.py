"""Random-weight GGUF writer: small (or 1B-shaped) models llama.cpp loads, for tests and benches.

`write_gguf(path, SynthSpec(...))` writes a complete model file for one of the architectures the
slice engine supports (llama, qwen2, qwen3, phi3) with a synthesized SentencePiece-style ("llama")
vocabulary that llama.cpp accepts: control tokens, the 256 byte-fallback tokens, single characters
and word pieces reachable by merges. Weight scales keep activations near unit RMS and make the
logits informative (a clear top-1, not all-equal), so greedy decoding is a meaningful comparison.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from node.inference.weights import dequant

ARCHS = ("llama", "qwen2", "qwen3", "phi3")

# token types of the llama vocabulary (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_BYTE = 1, 2, 3, 4, 6
SPACE = "\u2581"  # SentencePiece's word-boundary mark
_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an not which "
    "but have his they one all were had there can their has more if will would when what been "
    "who about so out up into some them other time could only then these two may first new "
    "def return self import class none true false print value list data model layer token node "
    "peer swarm python function string number file error test name type hello world"
).split()


@dataclass(frozen=True)
class SynthSpec:
    """Shape, metadata and storage type of a synthesized model (defaults: a tiny GQA llama)."""

    arch: str = "llama"
    n_layers: int = 2
    hidden: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int | None = None  # default hidden // n_heads (qwen3 may differ)
    ffn: int = 128
    vocab: int = 512  # >= 259: 3 control tokens + 256 byte tokens
    n_ctx: int = 256
    rope_base: float = 10000.0
    rope_scaling: str | None = None  # None | "linear" | "llama3" | "yarn"
    rope_scaling_factor: float = 1.0
    rope_orig_ctx: int | None = None  # original context for llama3/yarn scaling
    rms_eps: float = 1e-5
    tied: bool = False  # omit output.weight: the head reuses token_embd.weight
    qtype: str = "F32"  # storage of 2-D weights: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K
    seed: int = 0
    scale: float = 1.0  # multiplies every weight's standard deviation
    # log-normal spread of output-row norms: like token frequency in a trained head, it makes the
    # top-1 logit stand out (i.i.d. rows give near-ties that no rounding scheme agrees on)
    head_row_sigma: float = 1.0
    # an untied head also gets a random bigram: row π(t) leans toward token t's embedding, which
    # the residual stream carries, so the next token is predicted with a margin (trained-like)
    bigram: float = 12.0
    tied_gain: float = 3.0  # tied: embedding rows scaled to norm ~tied_gain (logit std ~tied_gain)
    tensor_qtypes: tuple[tuple[str, str], ...] = ()  # (tensor name part, qtype) overrides
    fim: bool = False  # the last three tokens are fill-in-the-middle control tokens (FIM_TOKENS)
    # `<think>` and `</think>` as user-defined tokens (before the FIM ones), as Qwen3's vocabulary has them
    think: bool = False
    # gpt-oss's harmony tokens (HARMONY_TOKENS, before the think and FIM ones): `<|start|>` `<|channel|>`
    # `<|message|>` `<|constrain|>` shown as text, `<|end|>` a control token, `<|return|>` `<|call|>` end
    harmony: bool = False
    # more control tokens (before the harmony, think and FIM ones), written out where they are a tool
    # format's markers (DeepSeek R1's `<｜tool▁calls▁begin｜>`...: U+2581 in them stays as it is)
    control_tokens: tuple[str, ...] = ()
    # Gemma 4's tokens (GEMMA4_TOKENS, before control_tokens and the harmony, think, FIM ones): `<|"|>` text,
    # the others control tokens; llama.cpp ends the generation at `<turn|>` and `<|tool_response>`
    gemma4: bool = False
    chat_template: str | None = None  # tokenizer.chat_template (None: none, the node uses ChatML)
    chat_templates: tuple[tuple[str, str], ...] = ()  # (name, template): tokenizer.chat_template.<name> (tool_use, ...)
    # a reranker (qwen3 only, as Qwen3-Reranker's GGUF): `qwen3.pooling_type` RANK, two classifier
    # labels and a `cls.output.weight` head; llama.cpp scores a pair as softmax(head(last token))[0]
    rerank: bool = False
    rerank_template: str | None = None  # tokenizer.chat_template.rerank ({query}, {document})
    name: str = "synth"

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"synth: unsupported architecture {self.arch}")
        if self.vocab < 259:
            raise ValueError("synth: vocab must be >= 259 (control + byte tokens)")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("synth: n_heads must be a multiple of n_kv_heads")
        if (self.rerank or self.rerank_template is not None) and self.arch != "qwen3":
            raise ValueError("synth: a reranker is written as qwen3 only (llama.cpp's classifier head)")

    @property
    def hd(self) -> int:
        """Per-head dimension."""
        return self.head_dim or self.hidden // self.n_heads

    def replace(self, **changes) -> SynthSpec:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


LLAMA_1B = SynthSpec(
    arch="llama", n_layers=16, hidden=2048, n_heads=32, n_kv_heads=8, ffn=8192, vocab=128256,
    n_ctx=4096, rope_base=500000.0, rope_scaling="llama3", rope_scaling_factor=32.0,
    rope_orig_ctx=8192, tied=True, qtype="Q8_0", name="llama-3.2-1b-shaped",
)


FIM_TOKENS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
THINK_TOKENS = ("<think>", "</think>")
RERANK_LABELS = ("yes", "no")  # Qwen3-Reranker's: the score is the first one's probability
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|return|>", "<|call|>")
GEMMA4_TOKENS = ('<|"|>', "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>",
                 "<|tool_response>", "<tool_response|>", "<|tool>", "<tool|>", "<|think|>")


def synth_vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary of exactly `size` tokens: (tokens, scores, types)."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TOKEN_BYTE] * 256
    pieces: list[str] = []
    seen = set(tokens)

    def add(piece: str) -> None:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)

    for ch in SPACE + "etaoinshrdlucmfwypvbgkjqxz" + "ETAOINSHRDLUCMFWYPVBGKJQXZ0123456789":
        add(ch)
    for ch in ".,:;!?'\"()[]{}<>=+-*/_#@%&|\\^~`$":
        add(ch)
    for word in _WORDS:  # every prefix, so SentencePiece merges can reach the whole word
        full = SPACE + word
        for end in range(2, len(full) + 1):
            add(full[:end])
    letters = "etaoinshrdlucmfwypvbg"
    for a in letters:
        for b in letters:
            add(a + b)
    n = 0
    while len(pieces) < size - len(tokens):  # filler: unreachable but valid pieces
        add(f"{SPACE}w{n}")
        n += 1
    pieces = pieces[: size - len(tokens)]
    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
    return tokens + pieces, scores, types + [TOKEN_NORMAL] * len(pieces)


def llama3_rope_factors(spec: SynthSpec, low_freq_factor: float = 1.0, high_freq_factor: float = 4.0):
    """The `rope_freqs.weight` factors HF's llama3 rope scaling implies (as the converter writes)."""
    dim = spec.hd
    freqs = 1.0 / (spec.rope_base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    orig = spec.rope_orig_ctx or spec.n_ctx
    low_wavelen = orig / low_freq_factor
    high_wavelen = orig / high_freq_factor
    wavelen = 2 * np.pi / freqs
    smooth = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    factors = np.where(
        wavelen < high_wavelen,
        1.0,
        np.where(wavelen > low_wavelen, spec.rope_scaling_factor, 1.0 / ((1 - smooth) / spec.rope_scaling_factor + smooth)),
    )
    return factors.astype(np.float32)


class _Weights:
    """Seeded weight generator: std k/sqrt(fan_in) for matrices, ~1 for norms."""

    def __init__(self, spec: SynthSpec):
        self.rng = np.random.default_rng(spec.seed)
        self.scale = spec.scale

    def matrix(self, rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        std = gain * self.scale / np.sqrt(cols)
        return (self.rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std))

    def norm(self, n: int) -> np.ndarray:
        return (1.0 + 0.1 * self.rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def bias(self, n: int) -> np.ndarray:
        return (0.1 * self.scale * self.rng.standard_normal(n, dtype=np.float32)).astype(np.float32)


def _qtype_for(spec: SynthSpec, name: str) -> str:
    for part, qtype in spec.tensor_qtypes:
        if part in name.split("."):
            return qtype
    return spec.qtype


def _add_matrix(writer: gguf.GGUFWriter, name: str, w: np.ndarray, qtype: str) -> None:
    """Store a 2-D weight in `qtype` (rows whose length is not a block multiple stay F32)."""
    if qtype == "F32":
        writer.add_tensor(name, w)
        return
    if qtype == "F16":
        writer.add_tensor(name, w.astype(np.float16))
        return
    kind = gguf.GGMLQuantizationType[qtype]
    block, _ = gguf.GGML_QUANT_SIZES[kind]
    if w.shape[-1] % block:
        writer.add_tensor(name, w)
        return
    writer.add_tensor(name, dequant.quantize(w, kind), raw_dtype=kind)


def _write_metadata(writer: gguf.GGUFWriter, spec: SynthSpec) -> None:
    writer.add_name(spec.name)
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.hidden)
    writer.add_block_count(spec.n_layers)
    writer.add_feed_forward_length(spec.ffn)
    writer.add_head_count(spec.n_heads)
    writer.add_head_count_kv(spec.n_kv_heads)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    writer.add_rope_freq_base(spec.rope_base)
    writer.add_rope_dimension_count(spec.hd)
    if spec.head_dim is not None:
        writer.add_key_length(spec.hd)
        writer.add_value_length(spec.hd)
    if spec.rope_scaling == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(spec.rope_scaling_factor)
    elif spec.rope_scaling == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(spec.rope_scaling_factor)
        writer.add_rope_scaling_orig_ctx_len(spec.rope_orig_ctx or spec.n_ctx)
    ftype = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "BF16": 32}
    writer.add_file_type(ftype.get(spec.qtype, 0))
    tokens, scores, types = synth_vocab(spec.vocab)
    if spec.fim:  # a code model's fill-in-the-middle tokens, named in the metadata as converters do
        first = spec.vocab - len(FIM_TOKENS)
        tokens[first:], types[first:] = list(FIM_TOKENS), [TOKEN_CONTROL] * len(FIM_TOKENS)
        for key, token_id in zip((gguf.Keys.Tokenizer.FIM_PRE_ID, gguf.Keys.Tokenizer.FIM_SUF_ID,
                                  gguf.Keys.Tokenizer.FIM_MID_ID), range(first, spec.vocab), strict=True):
            writer.add_uint32(key, token_id)
    if spec.think:  # a reasoning model's thought tags, single tokens the text shows
        first = spec.vocab - len(THINK_TOKENS) - (len(FIM_TOKENS) if spec.fim else 0)
        tokens[first:first + 2], types[first:first + 2] = list(THINK_TOKENS), [TOKEN_USER_DEFINED] * 2
    if spec.harmony:
        first = spec.vocab - len(HARMONY_TOKENS) - (2 if spec.think else 0) - (len(FIM_TOKENS) if spec.fim else 0)
        tokens[first:first + len(HARMONY_TOKENS)] = list(HARMONY_TOKENS)
        types[first:first + len(HARMONY_TOKENS)] = [TOKEN_USER_DEFINED] * 4 + [TOKEN_CONTROL] * 3
    if spec.control_tokens:
        first = (spec.vocab - len(spec.control_tokens) - (len(HARMONY_TOKENS) if spec.harmony else 0)
                 - (2 if spec.think else 0) - (len(FIM_TOKENS) if spec.fim else 0))
        tokens[first:first + len(spec.control_tokens)] = list(spec.control_tokens)
        types[first:first + len(spec.control_tokens)] = [TOKEN_CONTROL] * len(spec.control_tokens)
    if spec.gemma4:
        first = (spec.vocab - len(GEMMA4_TOKENS) - len(spec.control_tokens) - (len(HARMONY_TOKENS) if spec.harmony else 0)
                 - (2 if spec.think else 0) - (len(FIM_TOKENS) if spec.fim else 0))
        tokens[first:first + len(GEMMA4_TOKENS)] = list(GEMMA4_TOKENS)
        types[first:first + len(GEMMA4_TOKENS)] = [TOKEN_USER_DEFINED] + [TOKEN_CONTROL] * (len(GEMMA4_TOKENS) - 1)
    if spec.chat_template is not None:
        writer.add_chat_template(spec.chat_template)
    for name, text in spec.chat_templates:
        writer.add_string(gguf.Keys.Tokenizer.CHAT_TEMPLATE_N.format(name=name), text)
    if spec.rerank:
        writer.add_pooling_type(gguf.PoolingType.RANK)
        writer.add_classifier_output_labels(list(RERANK_LABELS))
    if spec.rerank_template is not None:
        writer.add_string(gguf.Keys.Tokenizer.CHAT_TEMPLATE_N.format(name="rerank"), spec.rerank_template)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if spec.control_tokens:  # (text after a control token is not prefixed with a space: "function", not "▁function")
        writer.add_add_space_prefix(False)


def _write_layer(writer: gguf.GGUFWriter, spec: SynthSpec, w: _Weights, i: int) -> None:
    H, hd, q_out, kv_out = spec.hidden, spec.hd, spec.n_heads * spec.hd, spec.n_kv_heads * spec.hd
    p = f"blk.{i}."

    def matrix(name: str, rows: int, cols: int, gain: float = 1.0) -> None:
        _add_matrix(writer, p + name, w.matrix(rows, cols, gain), _qtype_for(spec, p + name))

    writer.add_tensor(p + "attn_norm.weight", w.norm(H))
    if spec.arch == "phi3":
        matrix("attn_qkv.weight", q_out + 2 * kv_out, H)
    else:
        matrix("attn_q.weight", q_out, H)
        matrix("attn_k.weight", kv_out, H)
        matrix("attn_v.weight", kv_out, H)
    if spec.arch == "qwen2":
        writer.add_tensor(p + "attn_q.bias", w.bias(q_out))
        writer.add_tensor(p + "attn_k.bias", w.bias(kv_out))
        writer.add_tensor(p + "attn_v.bias", w.bias(kv_out))
    if spec.arch == "qwen3":
        writer.add_tensor(p + "attn_q_norm.weight", w.norm(hd))
        writer.add_tensor(p + "attn_k_norm.weight", w.norm(hd))
    matrix("attn_output.weight", H, q_out, gain=0.7)
    writer.add_tensor(p + "ffn_norm.weight", w.norm(H))
    if spec.arch == "phi3":
        matrix("ffn_up.weight", 2 * spec.ffn, H)  # fused [gate; up]
    else:
        matrix("ffn_gate.weight", spec.ffn, H)
        matrix("ffn_up.weight", spec.ffn, H)
    matrix("ffn_down.weight", H, spec.ffn, gain=0.7)


def write_gguf(path: str | Path, spec: SynthSpec = SynthSpec()) -> Path:
    """Write a random-weight model described by `spec` to `path` and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), spec.arch)
    _write_metadata(writer, spec)
    w = _Weights(spec)
    # embeddings ~N(0,1) rows; the head has gain 3 (logit std ~3) and log-normal row norms
    embd = w.rng.standard_normal((spec.vocab, spec.hidden), dtype=np.float32)
    row_norms = np.exp(spec.head_row_sigma * w.rng.standard_normal((spec.vocab, 1))).astype(np.float32)
    row_norms /= np.sqrt(np.mean(row_norms**2))
    if spec.tied:
        embd *= np.float32(spec.tied_gain * spec.scale / np.sqrt(spec.hidden)) * row_norms
    _add_matrix(writer, "token_embd.weight", embd, _qtype_for(spec, "token_embd.weight"))
    if spec.rope_scaling == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(spec))
    for i in range(spec.n_layers):
        _write_layer(writer, spec, w, i)
    writer.add_tensor("output_norm.weight", w.norm(spec.hidden))
    if not spec.tied:
        head = w.matrix(spec.vocab, spec.hidden, gain=3.0) * row_norms
        successor = w.rng.permutation(spec.vocab)
        head[successor] += np.float32(3.0 * spec.bigram / spec.hidden) * embd
        _add_matrix(writer, "output.weight", head, _qtype_for(spec, "output.weight"))
    if spec.rerank:  # (labels x hidden): gain 3, so the two labels' softmax is not near 0.5 always
        writer.add_tensor("cls.output.weight", w.matrix(len(RERANK_LABELS), spec.hidden, gain=3.0))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
