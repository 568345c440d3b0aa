"""SamplingParams on the wire between versions: the sender leaves out the fields at their defaults
(except those a receiver before 2026-12-07 requires), the receiver reads an absent field as its
default and refuses a field or grammar type it does not know (SamplingUnsupported, naming it)
instead of ignoring it: an older peer ignoring `min_tokens` or a "gbnf" grammar answered a reply
that broke the request's constraint, without an error."""

from __future__ import annotations

import pytest

from node.errors import ProtocolError, SamplingUnsupported
from node.inference import grammar as g
from node.inference.pipeline.wire import Hop, Work
from node.inference.sampling import (
    FEATURES,
    OLD_FEATURES,
    WIRE_FIELDS,
    WIRE_REQUIRED,
    SamplingParams,
    lacking,
)

# what the receiver before 2026-12-07 read as data[key] (SamplingParams.from_wire on d294100)
REQUIRED_BEFORE = {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty"}

EVERY_FIELD = SamplingParams(
    max_tokens=9, temperature=0.3, top_p=0.9, top_k=5, min_p=0.1, seed=0, presence_penalty=0.5,
    frequency_penalty=-0.5, repeat_penalty=1.1, stop=("x", "y"), logit_bias=((3, -100.0), (4, 2.5)), logprobs=0,
    grammar=g.json_value({"type": "object"}), reasoning_budget=None, ignore_eos=True, min_tokens=2)


def test_a_plain_request_sends_only_what_an_older_receiver_requires():
    wire = SamplingParams().to_wire()
    assert set(wire) == REQUIRED_BEFORE == WIRE_REQUIRED
    assert SamplingParams.from_wire(wire) == SamplingParams()
    plain = SamplingParams(temperature=0.0, max_tokens=16)
    assert set(plain.to_wire()) == REQUIRED_BEFORE | {"max_tokens"}
    assert SamplingParams.from_wire(plain.to_wire()) == plain


def test_fields_away_from_their_default_are_sent_and_round_trip():
    wire = EVERY_FIELD.to_wire()
    assert set(wire) == WIRE_FIELDS - {"reasoning_budget"}  # seed=0 and logprobs=0 are not defaults
    assert SamplingParams.from_wire(wire) == EVERY_FIELD
    for name in ("ignore_eos", "min_tokens", "grammar", "stop", "logit_bias", "seed", "logprobs"):
        assert name not in SamplingParams(temperature=0.0).to_wire(), name


def test_an_absent_field_is_its_default():
    assert SamplingParams.from_wire({}) == SamplingParams()
    assert SamplingParams.from_wire({"min_tokens": 3}) == SamplingParams(min_tokens=3)


@pytest.mark.parametrize("extra", [{"typical_p": 0.5}, {"min_tokens": 1, "dry_multiplier": 0.8}])
def test_an_unknown_field_is_refused_naming_it(extra):
    with pytest.raises(SamplingUnsupported) as err:
        SamplingParams.from_wire({**SamplingParams().to_wire(), **extra})
    name = next(k for k in sorted(extra) if k not in WIRE_FIELDS)
    assert err.value.field == name and err.value.code == "sampling_unsupported"
    assert repr(name) in err.value.message and "update" in err.value.message


def test_an_unknown_grammar_type_is_refused_naming_it():
    spec = g.seq(g.literal("a"), {"type": "lark", "grammar": "start: /b/"})
    with pytest.raises(SamplingUnsupported) as err:
        SamplingParams.from_wire({**SamplingParams().to_wire(), "grammar": spec})
    assert err.value.field == "grammar" and "'lark'" in err.value.message
    # a malformed (not newer) spec is left for the compile where it samples, as before (its 400)
    assert SamplingParams.from_wire({"grammar": {"type": "literal", "text": ""}}).grammar is not None


def test_only_the_hop_that_samples_refuses_an_unknown_field():
    route = (Hop("a" * 64, 0, 3), Hop("b" * 64, 3, 6))
    header = Work(sid="s", model="m", seq=0, index_pos=0, n_tokens=2, route=route, hop=0, coordinator="c" * 64,
                  sample=True, sampling=SamplingParams(temperature=0.0, min_tokens=2)).to_header()
    header["sampling"]["future_knob"] = 1
    first = Work.from_header(header)  # a segment before the last carries it on as it came
    assert first.sampling is None and first.to_header()["sampling"] == header["sampling"]
    forwarded = first.forward_header(1, {"dtype": "f32"}, {"node": "a" * 64})
    with pytest.raises(SamplingUnsupported) as err:
        Work.from_header(forwarded)
    assert err.value.field == "future_knob"
    del forwarded["sampling"]["future_knob"]
    assert Work.from_header(forwarded).sampling == SamplingParams(temperature=0.0, min_tokens=2)
    with pytest.raises(ProtocolError):  # still checked where it samples
        Work.from_header({**forwarded, "sampling": {"temperature": "hot"}})


@pytest.mark.parametrize("value", [{"temperature": 5.0}, {"top_k": -1}, {"min_tokens": "2"}, {"stop": 3}])
def test_a_value_this_version_refuses_is_unsupported_not_a_dropped_step(value):
    """A newer sender's wider bounds (a temperature of 5, say) or another type: refused as this
    version's limit, so the worker answers and the coordinator tries another node. Until 2026-12-07
    the WORK was dropped as malformed, unanswered, and its coordinator charged the node as silent."""
    route = (Hop("a" * 64, 0, 6),)
    header = Work(sid="s", model="m", seq=0, index_pos=0, n_tokens=2, route=route, hop=0, coordinator="c" * 64,
                  sample=True, sampling=SamplingParams(temperature=0.0)).to_header()
    with pytest.raises(SamplingUnsupported) as err:
        Work.from_header({**header, "sampling": {**header["sampling"], **value}})
    assert err.value.code == "sampling_unsupported" and "another version" in err.value.message
    with pytest.raises(ProtocolError) as err:  # not an object at all: a malformed frame
        Work.from_header({**header, "sampling": [1, 2]})
    assert not isinstance(err.value, SamplingUnsupported)


def test_a_requests_features_and_what_a_node_listing_none_lacks():
    """2026-12-07: the coordinator sends a request to no node whose HELLO does not list one of its
    features; a node listing none (a version before) decodes the old set only."""
    plain = SamplingParams(temperature=0.0, max_tokens=16, stop=("x",), seed=3)
    assert plain.features() <= OLD_FEATURES and lacking(plain.features(), None) is None
    assert lacking(EVERY_FIELD.features(), FEATURES) is None and OLD_FEATURES < FEATURES
    assert lacking(SamplingParams(min_tokens=2).features(), None) == ("min_tokens", "the sampling field 'min_tokens'")
    assert lacking(SamplingParams(ignore_eos=True).features(), None)[0] == "ignore_eos"
    budget = SamplingParams(reasoning_budget={"tokens": 64, "start": [1], "end": [2]})
    param, words = lacking(budget.features(), OLD_FEATURES)
    assert param is None and "thinking.budget_tokens" in words and "reasoning_effort" in words, (param, words)
    nested = SamplingParams(grammar=g.seq(g.literal("a"), g.gbnf('root ::= "b"')))
    assert nested.features() >= {"sampling:grammar", "grammar:seq", "grammar:literal", "grammar:gbnf"}
    assert lacking(nested.features(), None) == ("grammar", "the grammar type 'gbnf'")
    assert lacking(SamplingParams(grammar=g.json_value(None)).features(), None) is None
    # a node listing features reads as what it lists, not the old set
    assert lacking(SamplingParams(min_tokens=2).features(), frozenset()) is not None
    assert lacking(SamplingParams(min_tokens=2).features(), OLD_FEATURES | {"sampling:min_tokens"}) is None
