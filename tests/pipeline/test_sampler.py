"""Sampling on the output-head segment."""

import pytest
import torch

from node.inference.pipeline.sampler import Sampler
from node.inference.sampling import SamplingParams
from node.inference.synth import SynthSpec
from node.inference.think_budget import spec as budget_spec
from tests.support.nodes import tiny_model


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


@pytest.mark.llama
def test_a_thinking_budget_forces_the_closing_tag(tmp_path):
    """A chain's last segment samples with node.inference.pipeline.sampler: the budget travels in
    the sampling parameters (the wire form) and forces the closing tag there, as on the local route;
    a session rebuilt with its history (a failover) goes on from where it was."""
    from node.inference.tokenizer import ModelTokenizer  # (llama-cpp-python)

    tok = ModelTokenizer(tiny_model(tmp_path, SynthSpec(think=True), "thinker.gguf"))
    try:
        close = tok.tokenize("</think>", add_bos=False)[-1]
        word = tok.tokenize("I", add_bos=False)[-1]
        params = SamplingParams.from_wire(SamplingParams(temperature=0, reasoning_budget=budget_spec(
            3, "<think>", "</think>", inside=True)).to_wire())
        logits = torch.zeros(tok.n_vocab)
        logits[word] = 10.0
        sampler = Sampler(params, vocab=tok)
        assert [sampler.sample(logits) for _ in range(5)] == [word, word, word, close, word]
        resumed = Sampler(params, history=(word, word), vocab=tok)
        assert [resumed.sample(logits) for _ in range(2)] == [word, close]
    finally:
        tok.close()


@pytest.mark.llama
def test_a_thinking_budget_waits_for_a_whole_character(tmp_path):
    """A budget spent in the middle of a UTF-8 character forces the closing tag after the character's
    last byte, as llama-server's does (the thoughts never end with half a character)."""
    from node.inference.tokenizer import ModelTokenizer  # (llama-cpp-python)

    tok = ModelTokenizer(tiny_model(tmp_path, SynthSpec(think=True), "thinker.gguf"))
    try:
        close = tok.tokenize("</think>", add_bos=False)[-1]
        lead, cont = (next(t for t in range(tok.n_vocab) if tok.piece(t) == b) for b in (b"\xc3", b"\xa9"))
        params = SamplingParams(temperature=0, reasoning_budget=budget_spec(1, "<think>", "</think>", inside=True))
        sampler = Sampler(params, vocab=tok)

        def row(token: int) -> torch.Tensor:
            logits = torch.zeros(tok.n_vocab)
            logits[token] = 10.0
            return logits

        assert [sampler.sample(row(t)) for t in (lead, cont, cont)] == [lead, cont, close]
    finally:
        tok.close()


@pytest.mark.llama
def test_a_thinking_budget_rearms_on_each_gpt_oss_analysis_message(tmp_path):
    """gpt-oss's thoughts are every analysis message (`<|channel|>analysis<|message|>` … `<|end|>`);
    a model whose thoughts were cut starts another: the budget starts again there, as llama-server's
    does (found in review: only the first message was capped, a second one thought until
    max_tokens). Through the wire form, as on a chain's last segment."""
    from node.inference.reasoning import with_budget
    from node.inference.tokenizer import ModelTokenizer  # (llama-cpp-python)
    from node.inference.tools.harmony import TAGS, HarmonySplitter

    tok = ModelTokenizer(tiny_model(tmp_path, SynthSpec(harmony=True), "gptoss.gguf"))
    try:
        end = tok.tokenize("<|end|>", add_bos=False, special=True)
        assert len(end) == 1
        word = tok.tokenize("I", add_bos=False)[-1]
        pieces = {tok.piece(t): t for t in range(tok.n_vocab)}

        def spelt(*parts: str) -> list[int]:  # harmony tokens whole, words letter by letter (as
            return [pieces[p.encode()] for part in parts  # gpt-oss's BPE writes them, without the
                    for p in ([part] if part.startswith("<|") else part)]  # synth vocabulary's space prefix)

        first = spelt("<|channel|>", "analysis", "<|message|>")
        again = spelt("<|start|>", "assistant", "<|channel|>", "analysis", "<|message|>")
        assert "".join(tok.piece(t).decode() for t in again).endswith(TAGS.open)
        budgeted = with_budget(SamplingParams(temperature=0), HarmonySplitter(False), 2)
        params = SamplingParams.from_wire(budgeted.to_wire())
        sampler = Sampler(params, vocab=tok)

        def row(token: int) -> torch.Tensor:
            logits = torch.zeros(tok.n_vocab)
            logits[token] = 10.0
            return logits

        for message in (first, again):
            assert [sampler.sample(row(t)) for t in message] == message
            assert [sampler.sample(row(word)) for _ in range(3)] == [word, word, end[0]]
    finally:
        tok.close()
