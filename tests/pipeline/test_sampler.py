"""Sampling on the output-head segment."""

import torch

from node.inference.pipeline.sampler import Sampler
from node.inference.sampling import SamplingParams


def test_greedy_picks_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert Sampler(SamplingParams(temperature=0.0)).sample(logits) == 1


def test_same_seed_same_draws_and_different_seed_differs():
    torch.manual_seed(0)
    rows = [torch.randn(50) for _ in range(20)]
    a = Sampler(SamplingParams(temperature=1.0, seed=11))
    b = Sampler(SamplingParams(temperature=1.0, seed=11))
    c = Sampler(SamplingParams(temperature=1.0, seed=12))
    ta, tb, tc = ([s.sample(r) for r in rows] for s in (a, b, c))
    assert ta == tb
    assert ta != tc


def test_top_k_one_is_greedy_and_min_p_cuts_tail():
    logits = torch.tensor([5.0, 1.0, 0.5, 0.0])
    s = Sampler(SamplingParams(temperature=1.5, top_k=1, seed=1))
    assert all(s.sample(logits) == 0 for _ in range(20))
    s = Sampler(SamplingParams(temperature=1.0, min_p=0.5, seed=1))
    assert all(s.sample(logits) == 0 for _ in range(20))  # p(1)/p(0) = e^-4 < 0.5


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.7, seed=3))
    seen = {s.sample(logits) for _ in range(200)}
    assert seen <= {0, 1} and seen == {0, 1}


def test_penalties_change_the_choice():
    logits = torch.tensor([2.0, 1.9, 0.0])
    s = Sampler(SamplingParams(temperature=0.0, repeat_penalty=1.5), history=(0,))
    assert s.sample(logits) == 1  # 2.0/1.5 < 1.9
    s = Sampler(SamplingParams(temperature=0.0, presence_penalty=0.5), history=(0,))
    assert s.sample(logits) == 1
    s = Sampler(SamplingParams(temperature=0.0, frequency_penalty=0.06), history=(0, 0))
    assert s.sample(logits) == 1  # 2.0 - 2 * 0.06 < 1.9


def test_a_history_outside_the_vocabulary_is_a_protocol_error():
    """A coordinator's token history with penalties: ids past the logits were an IndexError."""
    import pytest

    from node.errors import ProtocolError

    s = Sampler(SamplingParams(temperature=0.0, repeat_penalty=1.3), history=(1, 2, 10))
    with pytest.raises(ProtocolError, match="outside the vocabulary"):
        s.sample(torch.zeros(10))
    assert Sampler(SamplingParams(temperature=0.0, repeat_penalty=1.3), history=(1, 2, 9)).sample(torch.zeros(10)) in range(10)
