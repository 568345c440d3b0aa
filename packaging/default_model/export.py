"""Write the trained model as a llama.cpp ``llama`` GGUF with full SPM tokenizer metadata."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

from .config import MODEL_NAME, Config
from .model import Llama
from .tokenizer import IM_END, SPECIALS, Tokenizer

# The standard ChatML template (OpenHermes'); llama-cpp-python recognises this exact string and
# uses its built-in "chatml" formatter, which renders identically.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LICENSE = "MIT (weights); training text: Python standard library docstrings, PSF License"

_TYPE = gguf.GGMLQuantizationType


def _token_table(tok: Tokenizer) -> tuple[list[bytes], list[float], list[int]]:
    sp = tok.sp
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if sp.is_unknown(i):
            kind = gguf.TokenType.UNKNOWN
        elif sp.is_control(i) or piece in SPECIALS:
            kind = gguf.TokenType.CONTROL
        elif sp.is_byte(i):
            kind = gguf.TokenType.BYTE
        elif sp.is_unused(i):
            kind = gguf.TokenType.UNUSED
        else:
            kind = gguf.TokenType.NORMAL
        tokens.append(piece.encode("utf-8"))
        scores.append(float(sp.get_score(i)))
        types.append(int(kind))
    return tokens, scores, types


def _tensors(model: Llama) -> list[tuple[str, np.ndarray]]:
    """(gguf name, float32 array in torch's (out, in) layout) for every tensor."""
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    out = [("token_embd.weight", sd["tok_embeddings.weight"])]
    for i in range(model.cfg.n_layers):
        p = f"layers.{i}."
        out += [
            (f"blk.{i}.attn_norm.weight", sd[p + "attention_norm.weight"]),
            (f"blk.{i}.attn_q.weight", sd[p + "attention.wq.weight"]),  # no permute: RoPE is already
            (f"blk.{i}.attn_k.weight", sd[p + "attention.wk.weight"]),  # on adjacent pairs
            (f"blk.{i}.attn_v.weight", sd[p + "attention.wv.weight"]),
            (f"blk.{i}.attn_output.weight", sd[p + "attention.wo.weight"]),
            (f"blk.{i}.ffn_norm.weight", sd[p + "ffn_norm.weight"]),
            (f"blk.{i}.ffn_gate.weight", sd[p + "feed_forward.w1.weight"]),
            (f"blk.{i}.ffn_up.weight", sd[p + "feed_forward.w3.weight"]),
            (f"blk.{i}.ffn_down.weight", sd[p + "feed_forward.w2.weight"]),
        ]
    out.append(("output_norm.weight", sd["norm.weight"]))
    if not model.cfg.tie_embeddings:
        out.append(("output.weight", sd["output.weight"]))
    return out


def write_gguf(model: Llama, tok: Tokenizer, cfg: Config, path: Path, qtype: str, description: str) -> Path:
    """Export to ``path``; ``qtype`` is "F32" or "Q8_0" (1-D norm weights always stay F32)."""
    m = cfg.model
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(MODEL_NAME)
    w.add_license(LICENSE)
    w.add_description(description)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "Q8_0" else gguf.LlamaFileType.ALL_F32)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(m.context_length)
    w.add_embedding_length(m.dim)
    w.add_block_count(m.n_layers)
    w.add_feed_forward_length(m.ffn_dim)
    w.add_head_count(m.n_heads)
    w.add_head_count_kv(m.n_kv_heads)
    w.add_rope_dimension_count(m.head_dim)
    w.add_rope_freq_base(m.rope_theta)
    w.add_layer_norm_rms_eps(m.norm_eps)
    w.add_vocab_size(m.vocab_size)
    # The training configuration, so tools can check the file against the code that made it.
    w.add_string("swarmllm.train_config", json.dumps(cfg.to_dict(), sort_keys=True))

    tokens, scores, types = _token_table(tok)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(tok.bos_id)
    w.add_eos_token_id(tok.im_end_id)
    w.add_eot_token_id(tok.im_end_id)
    w.add_unk_token_id(tok.unk_id)
    w.add_pad_token_id(tok.pad_id)
    w.add_add_bos_token(False)  # trained without BOS, see tokenizer.encode_sample
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHATML_TEMPLATE)
    assert tok.sp.id_to_piece(tok.im_end_id) == IM_END

    for name, arr in _tensors(model):
        if qtype == "Q8_0" and arr.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(arr, _TYPE.Q8_0), raw_dtype=_TYPE.Q8_0)
        else:
            w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


