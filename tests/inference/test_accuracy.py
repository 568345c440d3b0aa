"""The fast formats against our own f32 path on random models (no reference engine needed).

Perplexity within 1% of f32, measured the way generation runs (a 16-token prompt prefill, then
one decode step per token) and as one 128-token prefill computing every position's logits (for
int8 the fast prefill path: on fbgemm one 7-bit pass on o, gate/up and the rotated ffn_down; on
qgemm 8 bits on o and gate/up).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from node.inference.synth import SynthSpec
from tests.inference.reference import chain, our_logits

_BASE = SynthSpec(hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab=320, n_layers=3)
SPECS = {
    "llama-q8_0": _BASE.replace(qtype="Q8_0"),
    "qwen2-q4_k": _BASE.replace(arch="qwen2", qtype="Q4_K"),
    "qwen3-f32": _BASE.replace(arch="qwen3"),
    "phi3-q8_0": _BASE.replace(arch="phi3", n_kv_heads=4, qtype="Q8_0"),
}


def _sample(c, n: int, seed: int) -> list[int]:
    """Held-out text for a random model: a temperature-1 sample from its own f32 distribution."""
    gen = torch.Generator().manual_seed(seed)
    c.new_session("sample")
    tokens = [1]
    logits = c.forward("sample", torch.tensor(tokens), 0)
    while len(tokens) < n:
        tok = int(torch.multinomial(torch.softmax(logits[-1], dim=-1), 1, generator=gen))
        tokens.append(tok)
        logits = c.forward("sample", torch.tensor([tok]), len(tokens) - 1)
    c.free_session("sample")
    return tokens


def _perplexity(logits: np.ndarray, tokens: list[int]) -> float:
    loss = torch.nn.functional.cross_entropy(torch.from_numpy(logits[:-1]), torch.tensor(tokens[1:]))
    return float(torch.exp(loss))


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_fast_format_perplexity_within_one_percent_of_f32(synth_model, name, dtype):
    path = synth_model(SPECS[name])
    f32 = chain(path)
    tokens = _sample(f32, 128, seed=5)
    ppl_f32 = _perplexity(our_logits(f32, tokens), tokens)
    for decode_from in (16, None):  # generation; one long prefill
        fast = our_logits(chain(path, slices=2, dtype=dtype), tokens, decode_from=decode_from)
        assert abs(_perplexity(fast, tokens) / ppl_f32 - 1) <= 0.01
