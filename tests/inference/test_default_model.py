"""The embedded default model (real weight statistics) through the slice engine.

Skipped until `resources/models/swarmllm-pydoc-q8_0.gguf` exists (another issue trains it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from node.cli import main
from node.inference.slice.chain import SliceChain
from tests.inference.conftest import needs_llama
from tests.inference.reference import (
    INT8_KERNELS,
    chain,
    llama_logits,
    needs_fbgemm,
    our_logits,
    top1_agreement,
)

MODEL = Path(__file__).resolve().parents[2] / "resources" / "models" / "swarmllm-pydoc-q8_0.gguf"
pytestmark = [
    pytest.mark.skipif(not MODEL.exists(), reason=f"default model not built yet ({MODEL.name} absent)"),
]

# held out: written for this test, so not among the standard-library docstrings it was trained on
HELD_OUT = """Return a new sorted list of the intervals in spans, merging any two that overlap.

Each interval is a pair (start, end) with start <= end.  Intervals that only touch at an
end point are merged as well.  The input is not modified.  If spans is empty, an empty
list is returned.  Raise ValueError if an interval has its end before its start.

Split the text into lines of at most width characters, breaking at spaces where possible.
Words longer than width are broken across lines.  Leading whitespace on each line is kept
unless strip is true, in which case it is removed before the line is measured."""


def _tokens() -> list[int]:
    from node.inference.llamacpp import load

    vocab = load().Llama(str(MODEL), vocab_only=True, verbose=False)
    return vocab.tokenize(HELD_OUT.encode(), add_bos=True)[:129]


def _perplexity(logits: np.ndarray, tokens: list[int]) -> float:
    loss = torch.nn.functional.cross_entropy(torch.from_numpy(logits[:-1]), torch.tensor(tokens[1:]))
    return float(torch.exp(loss))


@pytest.mark.llama
@needs_llama
def test_default_model_passes_test_split_in_three_slices(capsys):
    assert main(["test-split", str(MODEL), "--slices", "3", "--threads", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("max_abs_logit_diff=")
    assert last.endswith("greedy_match=32/32 slices=3")


@pytest.mark.llama
@needs_llama
@pytest.mark.parametrize("kernel", INT8_KERNELS)
def test_default_model_int8_agrees_with_llama_cpp(kernel):
    tokens = _tokens()
    ref = llama_logits(MODEL, tokens)
    ours = our_logits(chain(MODEL, slices=3, dtype="int8", kernel=kernel), tokens, decode_from=16)
    assert len(tokens) >= 128
    # llama.cpp quantizes activations to 8 bits for Q8_0 matmuls, so its logits carry noise of
    # ~1% of the logit scale against exact arithmetic (its kernels differ by CPU: AVX2 with weight
    # repacking, AVX-512 without). Measured on an AVX-512 machine: all 4 of 128 positions where we
    # differ (our f32 path: 3) had llama.cpp's two best logits within 0.3% of the scale (median gap
    # 6.6%). Those are ties in the reference; within them either token agrees.
    assert top1_agreement(ours[:128], ref[:128], tie=0.005) >= 0.98
    assert top1_agreement(ours[:128], ref[:128]) >= 0.95  # and strictly, nearly all of them


@pytest.mark.llama
@needs_llama
@pytest.mark.parametrize(("decode_from", "exact_prefill"), [
    (16, False),  # as generation runs: a prompt prefill, then one decode step per token (+0.13 %)
    (None, True),  # one prefill computing every position, how perplexity is evaluated (-0.06 %)
    (None, False),  # the same with the fast prefill (one 7-bit pass on most matrices: +0.69 %)
    # Measured on the 1024-context default model. With pair-safe weights (neighbouring columns'
    # |q0| + |q1| ≤ 128, so that those passes could take 8-bit activations) they were +1.0, -0.06
    # and +1.4 %: coarser weights cost more than a bit of activations, which the residual pass
    # buys back anyway.
])
@needs_fbgemm
def test_default_model_fbgemm_perplexity_within_one_percent_of_f32(decode_from, exact_prefill):
    """fbgemm: 7-bit activations, with the residual pass where it is asked for (exact_prefill)."""
    tokens = _tokens()
    f32 = _perplexity(our_logits(chain(MODEL, dtype="f32"), tokens), tokens)
    c = SliceChain.load(MODEL, 2, dtype="int8", max_ctx=512, exact_prefill=exact_prefill, kernel="fbgemm")
    int8 = _perplexity(our_logits(c, tokens, decode_from=decode_from), tokens)
    assert abs(int8 / f32 - 1) <= 0.01


@pytest.mark.llama
@needs_llama
@pytest.mark.skipif("qgemm" not in INT8_KERNELS, reason="the qgemm extension is not built")
@pytest.mark.parametrize("decode_from", [16, None])
def test_default_model_qgemm_perplexity_within_one_percent_of_f32_on_every_prefill(decode_from):
    """qgemm has one path for prefill and decode (activations on 13-15 bits): no exact_prefill."""
    tokens = _tokens()
    f32 = _perplexity(our_logits(chain(MODEL, dtype="f32"), tokens), tokens)
    c = SliceChain.load(MODEL, 2, dtype="int8", max_ctx=512, kernel="qgemm")
    int8 = _perplexity(our_logits(c, tokens, decode_from=decode_from), tokens)
    assert abs(int8 / f32 - 1) <= 0.01


@pytest.mark.llama
@needs_llama
@pytest.mark.parametrize("dtype", ["f32", "int8"])
def test_default_model_half_kv_cache_keeps_perplexity_and_agrees_with_llama_cpps(dtype):
    """The node's f16 KV caches (K and V rounded to half when written, read exactly): perplexity
    within 1% of the same weights on f32 caches, as generation runs (prefill, then decode); and
    top-1 agreement with llama.cpp on its own default f16 cache (which also rounds the queries and
    the attention weights to half)."""
    tokens = _tokens()
    f32_kv = _perplexity(our_logits(chain(MODEL, 2, dtype=dtype), tokens, decode_from=16), tokens)
    c = chain(MODEL, 2, dtype=dtype, kv_dtype="f16")
    assert all(s.kv_dtype == torch.float16 for s in c.slices)
    ours = our_logits(c, tokens, decode_from=16)
    assert abs(_perplexity(ours, tokens) / f32_kv - 1) <= 0.01
    ref = llama_logits(MODEL, tokens, kv_dtype="f16")
    assert top1_agreement(ours[:128], ref[:128], tie=0.005) >= 0.98
