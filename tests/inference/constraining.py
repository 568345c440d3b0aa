"""Helpers of the grammar tests (tests/inference/test_constrain*.py): a random model walking a
constraint, and the text of token ids."""

from __future__ import annotations

import numpy as np

from node.inference import constrain
from node.inference.sampling import SamplingParams


def walk(tok, spec, seed=0, steps=300, params=None):
    """Random logits, masked: the bytes produced until an end-of-generation token (or None)."""
    c = constrain.constraint_for(tok, params or SamplingParams(grammar=spec))
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        logits = rng.normal(size=tok.n_vocab).astype(np.float32) * 3
        c.apply(logits)
        token = int(np.argmax(logits))
        if tok.is_eog(token):
            return out, c
        out.append(token)
        c.accept(token)
    return None, c


def text_of(tok, ids):
    return b"".join(tok.piece(i) for i in ids).decode()
