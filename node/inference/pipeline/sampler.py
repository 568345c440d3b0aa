"""Token sampling in torch, on the segment that holds the output head.

Semantics follow llama.cpp's sampler chain as llama-cpp-python builds it: penalties (repeat,
frequency, presence over the last 64 generated tokens), then greedy when temperature is 0, else
top-k → top-p → min-p → temperature → a draw from a generator seeded per session (the same seed
gives the same text on this path; the random stream differs from llama.cpp's).

A request's logit_bias and output grammar (node.inference.constrain) come first, as on the local
route: the constraint masks the raw logits before the penalties, and follows each sampled token.

`scores` gives the logprobs a request asked for: of the model's distribution (the log-softmax of
the raw logits, before any of the steps above), as llama.cpp's route reports them
(node.inference.logprobs).
"""

from __future__ import annotations

import random
from collections import Counter

import torch

from node.const import PENALTY_LAST_N_TOKENS
from node.errors import ProtocolError
from node.inference import constrain
from node.inference.handoff import TokenScores
from node.inference.sampling import SamplingParams

PENALTY_LAST_N = PENALTY_LAST_N_TOKENS


class Sampler:
    """Per-session sampler state: the parameters, the RNG and the generated history."""

    def __init__(self, params: SamplingParams, history: tuple[int, ...] = (), vocab=None):
        """`vocab`: the model's ModelTokenizer, needed when params carry a grammar, a logit_bias or a
        thinking budget (the grammar is compiled here, blocking, and replays `history`)."""
        self.params = params
        self.history: list[int] = list(history)
        self.constraint = None
        if params.constrained:
            if vocab is None:
                raise ValueError("a constrained sampler needs the model's vocabulary")
            self.constraint = constrain.constraint_for(vocab, params, self.history)
        self.generator = torch.Generator()
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        # A session rebuilt after a failover starts with history: derive its stream from the seed
        # and the position, so a seeded request stays reproducible (greedy text is unaffected).
        self.generator.manual_seed((seed + 1_000_003 * len(self.history)) % 2**63)

    def _penalize(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        if not self.history or (p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0):
            return logits
        counts = Counter(self.history[-PENALTY_LAST_N:])
        ids = torch.tensor(list(counts), dtype=torch.long)
        if int(ids.min()) < 0 or int(ids.max()) >= logits.shape[-1]:  # a coordinator's history, never ours
            raise ProtocolError(f"the step's token history holds ids outside the vocabulary (0..{logits.shape[-1] - 1})")
        freq = torch.tensor(list(counts.values()), dtype=logits.dtype)
        vals = logits[ids]
        if p.repeat_penalty != 1.0:
            vals = torch.where(vals <= 0, vals * p.repeat_penalty, vals / p.repeat_penalty)
        vals = vals - freq * p.frequency_penalty - p.presence_penalty
        logits = logits.clone()
        logits[ids] = vals
        return logits

    def sample(self, logits: torch.Tensor) -> int:
        """Pick the next token from one row of logits [V]; records it in the history."""
        p = self.params
        if self.constraint is not None:  # on a copy: the mask is written in place
            logits = logits.to(device="cpu", dtype=torch.float32, copy=True).contiguous()
            self.constraint.apply(logits.numpy())
        else:
            logits = logits.to(torch.float32)
        logits = self._penalize(logits)
        if p.greedy:
            token = int(torch.argmax(logits))
        else:
            token = self._draw(logits)
        if self.constraint is not None:
            self.constraint.accept(token)
        self.history.append(token)
        return token

    def scores(self, logits: torch.Tensor, token: int) -> TokenScores | None:
        """The chosen token's logprob and the most likely `params.logprobs` tokens of one row of raw
        logits [V]; None when the request asked for no logprobs."""
        n_top = self.params.logprobs
        if n_top is None:
            return None
        logprobs = torch.log_softmax(logits.to(torch.float64), dim=-1)
        chosen = float(logprobs[token])
        if n_top <= 0:
            return TokenScores(chosen)
        values, ids = torch.topk(logprobs, min(n_top, logprobs.numel()))
        return TokenScores(chosen, tuple(ids.tolist()), tuple(values.tolist()))

    def _draw(self, logits: torch.Tensor) -> int:
        p = self.params
        if p.top_k and 0 < p.top_k < logits.numel():
            values, indices = torch.topk(logits, p.top_k)
        else:
            values, indices = torch.sort(logits, descending=True)
        probs = torch.softmax(values, dim=-1)
        keep = values.numel()
        if p.top_p < 1.0:
            cum = torch.cumsum(probs, dim=-1)
            keep = min(keep, int(torch.searchsorted(cum, torch.tensor(p.top_p))) + 1)
        if p.min_p > 0.0:
            keep = min(keep, max(1, int((probs >= p.min_p * probs[0]).sum())))
        values, indices = values[:keep], indices[:keep]
        probs = torch.softmax(values / max(p.temperature, 1e-6), dim=-1)
        choice = int(torch.multinomial(probs, 1, generator=self.generator))
        return int(indices[choice])
