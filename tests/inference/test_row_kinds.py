"""A row's numbers on int8 (qgemm) slices depend on its kind, never on its step or batch: a prompt
row is the same whether its prompt went in one step, in several of any sizes, or was resumed a row
before its end; a generated row is the same decoded alone, verified among drafted rows, or batched
with other sessions' steps of either kind. (So speculation gives the text without it, and a prefix
hit whose cached rows were all prompt rows gives a miss's text, to the bit: the products are exact
integers per row, the prompt rows are attended in attend_rows, the generated ones in decode's
kernels, and the norms are row by row. A conversation's next turn resumes its previous reply's
rows as they were computed, generated rows, where a miss computes them as prompt rows: those two
can part at a near-tie; see ARCHITECTURE, "Row kinds".)"""

from __future__ import annotations

import pytest
import torch

from node.inference.slice import SliceModel
from node.inference.synth import SynthSpec
from node.inference.weights import qgemm

pytestmark = pytest.mark.skipif(not qgemm.available(), reason="the qgemm extension is not built")

SPEC = SynthSpec(hidden=128, n_heads=4, n_kv_heads=2, ffn=256, vocab=400, n_layers=3, n_ctx=256, qtype="Q8_0")
P = 45  # prompt tokens (steps of more and fewer than 32 rows below)
PROMPT = [1, *range(300, 300 + P - 1)]
NEXT = [17, 23, 29, 31]


@pytest.fixture(scope="module")
def model(synth_model):
    return SliceModel.load(synth_model(SPEC), dtype="int8", kernel="qgemm", max_ctx=128)


def _run(m, steps: list[list[int]], sid: str = "a") -> list[torch.Tensor]:
    """The steps in order on a new session, each marked with its prompt rows (as the node's WORK)."""
    s, outs, pos = m.new_session(sid), [], 0
    for toks in steps:
        outs.append(m.forward(s, torch.tensor(toks), pos, prompt_rows=max(0, min(len(toks), P - pos))))
        pos += len(toks)
    m.free_session(sid)
    return outs


def test_a_prompt_cut_into_any_steps_gives_the_same_bits(model):
    whole = _run(model, [PROMPT, NEXT[:1], NEXT[1:2]])
    for cuts in ([10, 1, 34], [44, 1], [1] * 5 + [40], [33, 12]):
        steps, a = [], 0
        for n in cuts:
            steps.append(PROMPT[a:a + n])
            a += n
        got = _run(model, [*steps, NEXT[:1], NEXT[1:2]])
        assert torch.equal(got[len(cuts) - 1][-1], whole[0][-1]), cuts  # the first token's logits
        assert torch.equal(got[-2], whole[1]) and torch.equal(got[-1], whole[2]), cuts  # then decode


def test_verified_rows_are_the_decode_steps_they_stand_for(model):
    decoded = _run(model, [PROMPT, NEXT[:1], NEXT[1:2], NEXT[2:3], NEXT[3:4]])
    verified = _run(model, [PROMPT, NEXT[:1], NEXT[1:4]])
    assert torch.equal(verified[2], torch.cat(decoded[2:5]))
    # and a step mixing the prompt's last rows with generated ones (a re-prefill after a failover)
    mixed = _run(model, [PROMPT[:40], PROMPT[40:] + NEXT[:3]])
    assert torch.equal(mixed[1][P - 40 - 1], decoded[0][-1])
    assert torch.equal(mixed[1][P - 40:], torch.cat(decoded[1:4]))


def test_a_step_gives_the_same_bits_alone_or_batched_with_steps_of_either_kind(model):
    alone = {"p": _run(model, [PROMPT[:20], PROMPT[20:]], "p")[1],
             "d": _run(model, [PROMPT, NEXT[:1]], "d")[1],
             "v": _run(model, [PROMPT, NEXT[:3]], "v")[1]}
    sessions = {k: model.new_session(k) for k in alone}
    model.forward(sessions["p"], torch.tensor(PROMPT[:20]), 0, prompt_rows=20)
    model.forward(sessions["d"], torch.tensor(PROMPT), 0, prompt_rows=P)
    model.forward(sessions["v"], torch.tensor(PROMPT), 0, prompt_rows=P)
    batched = model.forward_many([(sessions["p"], torch.tensor(PROMPT[20:]), 20, False, P - 20),
                                  (sessions["d"], torch.tensor(NEXT[:1]), P, False, 0),
                                  (sessions["v"], torch.tensor(NEXT[:3]), P, False, 0)])
    for k in alone:
        model.free_session(k)
    for key, out in zip(alone, batched, strict=True):
        assert torch.equal(out, alone[key]), key


def test_prompt_rows_beyond_the_step_are_refused(model):
    from node.errors import EngineError

    s = model.new_session("bad")
    with pytest.raises(EngineError, match="prompt_rows=3 for a step of 2 rows"):
        model.forward(s, torch.tensor([1, 2]), 0, prompt_rows=3)
    model.free_session("bad")


def test_a_step_that_does_not_say_its_kinds_runs_as_before_alone_or_beside_one_that_does(model):
    """An older coordinator's step (prompt_rows None) batched with a newer one's: the same bits as
    it gets alone (one row decoded, several attended together, 8 bits past 32 rows)."""
    s = model.new_session("old")
    alone = model.forward(s, torch.tensor(PROMPT), 0)
    model.free_session("old")
    new = _run(model, [PROMPT[:10]], "n")  # (just to have a session of the other kind below)
    old, other = model.new_session("old"), model.new_session("new")
    batched = model.forward_many([(old, torch.tensor(PROMPT), 0, False, None),
                                  (other, torch.tensor(PROMPT[:10]), 0, False, 10)])
    model.free_session("old")
    model.free_session("new")
    assert torch.equal(batched[0], alone) and torch.equal(batched[1], new[0])


def test_older_coordinators_steps_batched_past_32_rows_keep_the_bits_they_get_alone(model):
    """Twelve 3-row steps that do not say their kinds (36 rows in one forward): each takes the
    products it takes alone (13-15 bits under 32 rows), not 8 bits for the batch's size."""
    def session(sid):
        s = model.new_session(sid)
        model.forward(s, torch.tensor(PROMPT[:20]), 0)
        return s

    alone = []
    for i in range(12):
        alone.append(model.forward(session("a"), torch.tensor([5 + i, 6, 7]), 20))
        model.free_session("a")
    sessions = [session(f"s{i}") for i in range(12)]
    batched = model.forward_many([(s, torch.tensor([5 + i, 6, 7]), 20, False) for i, s in enumerate(sessions)])
    for i in range(12):
        model.free_session(f"s{i}")
    for i, (got, want) in enumerate(zip(batched, alone, strict=True)):
        assert torch.equal(got, want), i
