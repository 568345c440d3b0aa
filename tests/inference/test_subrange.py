"""Sub-ranges of loaded slices (a chain entering a holder's range in the middle), against llama.cpp.

Three overlapping slices of one 6-layer file, [0, 4), [2, 6) and [0, 6), are cut at different
boundaries into chains of sub-range sessions; every chain gives llama.cpp's logits (f32, within
1e-3 of the logit scale, prefill and decode) and its greedy continuation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from node.errors import EngineError
from node.inference.slice import SliceModel
from node.inference.synth import SynthSpec
from tests.inference.conftest import needs_llama
from tests.inference.reference import (
    N_CTX,
    first_divergence_is_a_tie,
    llama_greedy_scored,
    llama_logits,
    relative_max_diff,
)

SPEC = SynthSpec(hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=320, n_layers=6, n_ctx=256)
TOL = 1e-3  # of the logit scale, as tests/inference/test_reference.py


@pytest.fixture(scope="module")
def slices(synth_model):
    path = synth_model(SPEC)
    loaded = {r: SliceModel.load(path, *r, dtype="f32", max_ctx=N_CTX) for r in ((0, 4), (2, 6), (0, 6))}
    return path, loaded


# (slice it runs on, sub-range) per hop: entries in the middle of a range, exits before its end
CHAINS = {
    "0-1|2-5": [((0, 4), 0, 2), ((2, 6), 2, 6)],
    "0-2|3-5": [((0, 4), 0, 3), ((2, 6), 3, 6)],
    "0-3|4-5": [((0, 4), 0, 4), ((2, 6), 4, 6)],
    "0|1-3|4|5": [((0, 6), 0, 1), ((0, 4), 1, 4), ((2, 6), 4, 5), ((0, 6), 5, 6)],
    "0-4|5": [((0, 6), 0, 5), ((2, 6), 5, 6)],
}


class SubChain:
    """Hops of (slice, a, b) run one after another under one session id per hop."""

    def __init__(self, loaded, hops):
        self.hops = [(loaded[r], a, b) for r, a, b in hops]

    def new_session(self, sid: str) -> None:
        for i, (m, a, b) in enumerate(self.hops):
            m.new_session(f"{sid}/{i}", a, b)

    def forward(self, sid: str, ids, pos: int, *, last_only: bool = False) -> torch.Tensor:
        x = torch.as_tensor(ids, dtype=torch.long)
        for i, (m, _a, _b) in enumerate(self.hops):
            x = m.forward(f"{sid}/{i}", x, pos, last_only=last_only)
        return x

    def free_session(self, sid: str) -> None:
        for i, (m, _a, _b) in enumerate(self.hops):
            m.free_session(f"{sid}/{i}")


def _tokens(n: int, seed: int = 1) -> list[int]:
    return [1] + [int(t) for t in np.random.default_rng(seed).integers(3, SPEC.vocab, n - 1)]


@needs_llama
@pytest.mark.llama
@pytest.mark.parametrize("cut", list(CHAINS))
def test_sub_range_chains_match_llama_cpp(slices, cut):
    path, loaded = slices
    c = SubChain(loaded, CHAINS[cut])
    tokens = _tokens(48)
    ref = llama_logits(path, tokens)
    c.new_session("t")
    rows = [c.forward("t", tokens[:32], 0)]
    rows += [c.forward("t", tokens[i:i + 1], i) for i in range(32, len(tokens))]
    c.free_session("t")
    assert relative_max_diff(torch.cat(rows).numpy(), ref) <= TOL
    prompt = _tokens(8, seed=2)
    expected, scores = llama_greedy_scored(path, prompt, 24)
    c.new_session("g")
    logits, got = c.forward("g", prompt, 0, last_only=True), []
    for pos in range(len(prompt), len(prompt) + 24):
        got.append(int(logits[-1].argmax()))
        logits = c.forward("g", [got[-1]], pos, last_only=True)
    c.free_session("g")
    assert first_divergence_is_a_tie(got, expected, scores, tie=0.005), (got, expected)


def test_sub_range_session_allocates_only_its_layers_and_ends_right(slices):
    _path, loaded = slices
    whole = loaded[(0, 6)]
    head_less = whole.new_session("mid", 0, 3)
    assert head_less.n_layers == 3 and (head_less.layer_start, head_less.layer_end) == (0, 3)
    hidden = whole.forward(head_less, torch.tensor(_tokens(5)), 0)
    assert hidden.shape == (5, SPEC.hidden)  # not the model's last layer: no head
    tail = whole.new_session("tail", 3, 6)
    assert tail.n_layers == 3
    logits = whole.forward(tail, hidden, 0, last_only=True)
    assert logits.shape == (1, SPEC.vocab)
    assert tail.k.shape[0] == 3  # KV for layers 3-5 only
    full = whole.new_session("full")
    np.testing.assert_allclose(whole.forward(full, torch.tensor(_tokens(5)), 0, last_only=True).numpy(),
                               logits.numpy(), atol=1e-5)
    for sid in ("mid", "tail", "full"):
        whole.free_session(sid)


def test_sub_range_errors_are_clear(slices):
    _path, loaded = slices
    upper = loaded[(2, 6)]
    with pytest.raises(EngineError, match="not within"):
        upper.new_session("x", 1, 4)
    with pytest.raises(EngineError, match="not within"):
        loaded[(0, 4)].new_session("x", 2, 5)
    with pytest.raises(EngineError, match="not within"):
        upper.new_session("x", 4, 4)
    sess = loaded[(0, 6)].new_session("y", 2, 4)  # starts past layer 0: hidden states, not ids
    with pytest.raises(EngineError, match="hidden states"):
        loaded[(0, 6)].forward(sess, torch.tensor([1, 2, 3]), 0)
    first = loaded[(0, 6)].new_session("z", 0, 2)
    with pytest.raises(EngineError, match="token ids"):
        loaded[(0, 6)].forward(first, torch.zeros(3, SPEC.hidden), 0)
    for sid in ("y", "z"):
        loaded[(0, 6)].free_session(sid)
