"""llama-server's `grammar` (GBNF, converted to Lark), vLLM's regex and choice, and ignore_eos /
min_tokens, constraining replies on the tiny synth vocabulary (node.inference.constrain)."""

from __future__ import annotations

import numpy as np
import pytest

from node.errors import InvalidRequest
from node.inference import constrain
from node.inference import grammar as g
from node.inference.sampling import SamplingParams
from tests.inference.constraining import text_of, walk

pytestmark = pytest.mark.llama


def _gbnf(text: str) -> g.Spec:
    return g.gbnf(text)


@pytest.mark.parametrize(("spec", "ok"), [
    (_gbnf('root ::= "yes" | "no"'), lambda t: t in ("yes", "no")),
    (_gbnf('root ::= word " " num\nword ::= [a-z]+\nnum ::= [0-9]{1,3}'),
     lambda t: __import__("re").fullmatch(r"[a-z]+ [0-9]{1,3}", t) is not None),
    (g.regex(r"[0-9]{3}/[a-c]{2}"), lambda t: __import__("re").fullmatch(r"[0-9]{3}/[a-c]{2}", t) is not None),
    (g.alt(g.literal("red}"), g.literal("green")), lambda t: t in ("red}", "green")),
], ids=["gbnf-choice", "gbnf-rules", "regex-with-slash", "choice"])
def test_grammar_regex_and_choice_replies_match_and_end(tiny_tok, spec, ok):
    for seed in range(4):
        ids, c = walk(tiny_tok, spec, seed)
        assert ids is not None and ok(text_of(tiny_tok, ids)), text_of(tiny_tok, ids or [])
        assert c.matcher.is_accepting()


def test_a_lark_grammar_nests_inside_the_reasoning_wrapper(tiny_tok):
    """A reasoning model's reply grammar is free thoughts, then the request's: the nested grammar
    keeps its own `start` beside the wrapper's rules."""
    spec = g.seq(g.literal("ok:"), _gbnf('root ::= "yes" | "no"'))
    ids, _ = walk(tiny_tok, spec, 1)
    assert text_of(tiny_tok, ids) in ("ok:yes", "ok:no")


def test_a_grammar_llguidance_cannot_compile_is_a_400_naming_the_field(tiny_tok):
    with pytest.raises(InvalidRequest) as info:
        constrain.check(tiny_tok, SamplingParams(grammar=g.regex("[a-")), "guided_regex")
    assert info.value.param == "guided_regex"
    with pytest.raises(InvalidRequest) as info:
        constrain.check(tiny_tok, SamplingParams(grammar=g.gbnf("root ::= item")), "grammar")
    assert info.value.param == "grammar" and "Rule 'item' not found" in info.value.message
    with pytest.raises(InvalidRequest, match="too large"):  # (a peer's spec: bounded before converting)
        constrain.check(tiny_tok, SamplingParams(grammar=g.gbnf("root ::= " + '"a" ' * 20000)), "grammar")


def test_ignore_eos_bans_every_end_token_and_min_tokens_only_at_first(tiny_tok):
    eog = set(tiny_tok.eog_ids())
    assert eog and eog == {i for i in range(tiny_tok.n_vocab) if tiny_tok.is_eog(i)}
    ignore = constrain.constraint_for(tiny_tok, SamplingParams(ignore_eos=True))
    least = constrain.constraint_for(tiny_tok, SamplingParams(min_tokens=2))
    for step in range(4):
        for c in (ignore, least):
            logits = np.zeros(tiny_tok.n_vocab, dtype=np.float32)
            c.apply(logits)
            banned = {int(i) for i in np.flatnonzero(np.isneginf(logits))}
            assert banned == (eog if c is ignore or step < 2 else set()), (step, c is ignore)
            c.accept(0)
    # a grammar that is complete can only end: its end tokens stay allowed
    ids, done = walk(tiny_tok, None, params=SamplingParams(grammar=g.literal("yes"), ignore_eos=True))
    assert text_of(tiny_tok, ids) == "yes" and done.done


def test_sampling_params_carry_ignore_eos_over_the_wire():
    p = SamplingParams(max_tokens=8, ignore_eos=True, min_tokens=3)
    assert SamplingParams.from_wire(p.to_wire()) == p
    old_peer = {k: v for k, v in p.to_wire().items() if k not in ("ignore_eos", "min_tokens")}
    assert SamplingParams.from_wire(old_peer) == SamplingParams(max_tokens=8)
    with pytest.raises(ValueError):
        SamplingParams.from_wire({**p.to_wire(), "ignore_eos": "yes"})
