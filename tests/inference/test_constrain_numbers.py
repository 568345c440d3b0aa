"""JSON numbers under a constraint (node.inference.constrain, schema_bounds): digits bounded as
llama.cpp bounds them, tiny numbers keep their significant digits, digits that are not a number's
left alone, date-times, and multipleOf steps llguidance cannot compile or that are not finite."""

from __future__ import annotations

import json

import numpy as np
import pytest

from node.errors import InvalidRequest, Unsupported
from node.inference import constrain
from node.inference import grammar as g
from node.inference.sampling import SamplingParams
from tests.inference.constraining import text_of

pytestmark = pytest.mark.llama


def _digit_walk(tok, spec, prefer: tuple[bytes, ...] = (b"3", b".", b"e"), steps=160, seed=0, **params):
    """A model that always prefers a digit (then `prefer`, in order) to whatever else the grammar
    allows: the text it writes, and whether it ended (an end-of-generation token) within `steps`."""
    c = constrain.constraint_for(tok, SamplingParams(grammar=spec, **params))
    pieces = [tok.piece(i) for i in range(tok.n_vocab)]
    bias = np.array([20.0 if p[:1].isdigit() else 0.0 for p in pieces], dtype=np.float32)
    for rank, lead in enumerate(prefer):
        bias += np.array([15.0 - 5 * rank if p == lead else 0.0 for p in pieces], dtype=np.float32)
    rng, out = np.random.default_rng(seed), []
    for _ in range(steps):
        logits = c.apply(rng.normal(size=tok.n_vocab).astype(np.float32) + bias)
        token = int(np.argmax(logits))
        if tok.is_eog(token):
            return text_of(tok, out), True
        out.append(token)
        c.accept(token)
    return text_of(tok, out), False


def _writes(tok, schema, text: str) -> bool:
    """Whether a generation under the schema's constraint (grammar and its masks) can write `text`
    (`schema`: a JSON schema, or a grammar spec)."""
    spec = schema if isinstance(schema, dict) and schema.get("type") in {"json", "seq", "alt"} else g.json_value(schema)
    c = constrain.constraint_for(tok, SamplingParams(grammar=spec))
    for token in constrain.vocabulary(tok).tokenizer.tokenize_str(text):
        if not c.allowed()[token]:
            return False
        c.accept(token)
    return bool(c.allowed()[c.eog_ids].any())


NUMBER_PARTS = r"-?([0-9]+)(?:\.([0-9]+))?(?:[eE][+-]?([0-9]+))?"


@pytest.mark.parametrize("vocab", ["tiny_tok", "tok"])
def test_a_json_number_ends_within_llama_cpps_digit_bounds(vocab, request):
    """A weak model that always prefers another digit wrote "3333…" or "0.3333…" until max_tokens: cut
    JSON no client parses. A number's integral part now ends by 19 digits (the integers' bound), its
    fraction by 16 (llama.cpp's) and its exponent by 3 (every double's) (2026-12-07)."""
    import re

    from node.inference.number_runs import EXPONENT_DIGITS, FRACTION_DIGITS, INTEGRAL_DIGITS

    tok = request.getfixturevalue(vocab)
    point = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": ["number", "null"]}},
             "required": ["x", "y"]}
    for schema in ({"type": "number"}, point, {"type": "array", "items": {"type": "number"}, "maxItems": 3}):
        for prefer in ((b".", b"e"), (b"e", b"-"), (b",",)):
            text, ended = _digit_walk(tok, g.json_value(schema), prefer)
            assert ended, (schema, prefer, text)
            json.loads(text)  # (3.3e351 reads as inf: still JSON)
            for integral, fraction, exponent in re.findall(NUMBER_PARTS, text):
                assert len(integral) <= INTEGRAL_DIGITS and len(fraction) <= FRACTION_DIGITS
                assert len(exponent) <= EXPONENT_DIGITS
    text, _ = _digit_walk(tok, g.json_value({"type": "number"}), (b"3", b".", b"e"))
    assert re.fullmatch(r"[1-9][0-9]{18}\.[0-9]{16}e[0-9]{3}", text), text  # every bound reached, none passed
    # ordinary numbers and every double stay writable; what is past a bound is not
    for ok in ("3.14", "-0.5", "1e-7", "12345", "0", "-1234567890123456789", "0.1234567890123456",
               "1.2345678901234567e-308", "1.7976931348623157E+308", "5e-324"):
        assert _writes(tok, {"type": "number"}, ok), ok
        assert _writes(tok, point, f'{{"x":{ok},"y":null}}'), ok
    for past in ("12345678901234567890", "0.12345678901234567", "1e1234", "1.5e-0001"):
        assert not _writes(tok, {"type": "number"}, past), past
    # a bound the schema gives is llguidance's, as before; a const or enum number is written whole
    assert _writes(tok, {"type": "number", "minimum": 0, "maximum": 1}, "0.25")
    assert _writes(tok, {"type": "number", "multipleOf": 1e-6}, "1.000001")
    assert _writes(tok, {"enum": [0.30000000000000004, 1]}, "0.30000000000000004")
    assert _writes(tok, {"const": 1e20}, json.dumps(1e20).replace("1e+20", "100000000000000000000"))


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"min_tokens": 60}])
def test_a_number_past_its_bound_while_the_end_is_banned_goes_on(tiny_tok, extra):
    """A top-level number with ignore_eos (or min_tokens not reached): past the bound the mask left
    only end-of-generation, the ban took that too, every logit was -inf and the token sampled was
    outside the grammar, a 500 mid-reply (review r55). The digits go on now while the end is banned,
    in the engine's matcher and in a peer's sampler (the split route) alike (2026-12-07)."""
    import re

    import torch

    from node.inference.pipeline.sampler import Sampler

    spec = g.json_value({"type": "number"})
    text, ended = _digit_walk(tiny_tok, spec, steps=60, **extra)
    assert not ended and re.fullmatch(r"3+\.3+[eE]3+", text) and len(text) > 40, text
    sampler = Sampler(SamplingParams(grammar=spec, temperature=0, **extra), vocab=tiny_tok)
    pieces = [tiny_tok.piece(i) for i in range(tiny_tok.n_vocab)]
    bias = torch.tensor([20.0 + 5 * (p == b"3") + 3 * (p in (b".", b"e")) if p[:1].isdigit() or p in (b".", b"e")
                         else 0.0 for p in pieces])
    out = b"".join(pieces[sampler.sample(bias.clone())] for _ in range(60))
    assert re.fullmatch(rb"3+\.3+e3+", out) and len(out) > 40, out
    if "min_tokens" in extra:  # the ban lifted, the bound holds again: the number ends
        text, ended = _digit_walk(tiny_tok, spec, steps=120, **extra)
        assert ended and re.fullmatch(r"3+\.3+[eE]3+", text), text


@pytest.mark.parametrize("vocab", ["tiny_tok", "tok"])
def test_a_tiny_number_under_a_range_keeps_its_significant_digits(vocab, request):
    """Under `minimum`/`maximum` llguidance allows no exponent, and the fraction's 16 digits counted
    its leading zeros: 0.00000000000000001 (1e-17) could not be written, nor 0.30000000000000004 (review
    r55). Below 1 the fraction counts 17 digits after its first 323 zeros (5e-324, the least double, is
    written whole), and a run of zeros still ends (2026-12-07)."""
    import re

    tok = request.getfixturevalue(vocab)
    for schema in ({"type": "number", "minimum": 0}, {"type": "number", "exclusiveMinimum": 0, "maximum": 1}):
        for ok in ("0.00000000000000001", "0.30000000000000004", "0.000000000000000012345678901234567",
                   "0." + "0" * 323 + "5", "0.5", "0.9999999999999999"):
            assert _writes(tok, schema, ok), (schema, ok)
        for past in ("0." + "0" * 340 + "1", "0.000000000000000012345678901234567" + "8", "1.00000000000000001"):
            # (where zeros cannot end the number, 0 not above exclusiveMinimum, nothing else is there to write)
            assert not _writes(tok, schema, past) or "exclusiveMinimum" in schema and "0" * 340 in past, past
    assert _writes(tok, {"type": "number", "maximum": 0}, "-0.00000000000000001")
    assert not _writes(tok, {"type": "number"}, "0.00000000000000001")  # (1e-17 is there: 16 digits as before)
    if vocab == "tiny_tok":
        text, ended = _digit_walk(tok, g.json_value({"type": "number", "minimum": 0, "maximum": 1}), (b"0", b"."),
                                  steps=400)
        assert ended and re.fullmatch(r"0\.[0-9]{1,340}", text), text


def test_digits_that_are_not_a_json_numbers_are_left_alone(tiny_tok):
    """A string's digits, and a client's own regex or GBNF grammar, keep what they allow (a
    pattern that bounds nothing runs as before)."""
    text, ended = _digit_walk(tiny_tok, g.json_value({"type": "string", "pattern": "^[0-9]+$"}), steps=40)
    assert not ended and text.startswith('"') and len(text) > 21 and text[1:].isdigit()
    for spec in (g.regex(r"-?[0-9]+(\.[0-9]+)?"), g.seq(g.json_value({"type": "number"}), g.regex("[0-9]*"))):
        text, ended = _digit_walk(tiny_tok, spec, steps=40)
        assert not ended and len(text) == 40 and "." in text or text.isdigit(), text
    assert _writes(tiny_tok, {"type": "string", "pattern": r"^[0-9]{25}$"}, '"' + "1" * 25 + '"')


@pytest.mark.parametrize("vocab", ["tiny_tok", "tok"])
def test_digits_in_a_pattern_a_key_an_enum_or_a_raw_value_are_not_cut(vocab, request):
    """Anything where no `"` or letter could follow was taken for a number, and its digits cut past 19
    (or 16 after a point): a string `pattern` such as a price, a percentage or a ratio, a
    patternProperties key, an enum whose longer member extends a shorter one, a raw string enum of
    an XML tool format (review r55). A number's digit is followed only by digits, `.`, `e`/`E`, `+`/`-`,
    `,`, `}`, `]`, whitespace or a closer, one of them ends it, and its run goes on (2026-12-07)."""
    tok = request.getfixturevalue(vocab)
    long = "123456789012345678901234"
    for schema, text in (
            ({"type": "string", "pattern": r"^[0-9]+\.[0-9]{2}$"}, f'"{long}.00"'),
            ({"type": "string", "pattern": "^[0-9]+%$"}, f'"{long}%"'),
            ({"type": "string", "pattern": "^[0-9]+/[0-9]+$"}, f'"{long}/1"'),
            ({"type": "object", "patternProperties": {"^[0-9]+_x$": {"type": "integer"}},
              "additionalProperties": False}, f'{{"{long}_x":1}}'),
            ({"enum": [0.12345678901234566, 0.1234567890123456]}, "0.12345678901234566"),
            ({"type": "array", "items": {"enum": [0.5, 0.1234567890123456, 0.12345678901234566]}},
             "[0.12345678901234566,0.5]"),
            (g.seq(g.alt(g.literal(long[:20]), g.literal(long)), g.literal("\n</parameter>"),
                   g.json_value({"type": "number"})), f"{long}\n</parameter>5")):
        assert _writes(tok, schema, text), (schema, text)
    for schema, past in (({"type": "number"}, "12345678901234567890"), ({"type": "number"}, "0.12345678901234567"),
                         ({"type": "array", "items": {"type": "number"}}, "[12345678901234567890]"),
                         ({"type": "number", "maximum": 1}, "1.00000000000000000")):
        assert not _writes(tok, schema, past), (schema, past)


def test_a_date_time_ends_within_nanoseconds(tiny_tok):
    """`format: date-time` (pydantic's datetime) allowed any number of digits after the seconds' point:
    a weak model wrote "…:33.3333…" until max_tokens. At most 9 now (nanoseconds; llama.cpp writes
    3); a pattern the client gave is theirs (2026-12-07)."""
    import re

    from node.inference.schema_bounds import bounded_seconds

    for fmt in ("date-time", "time"):
        schema = {"type": "object", "properties": {"at": {"type": "string", "format": fmt}}, "required": ["at"]}
        text, ended = _digit_walk(tiny_tok, g.json_value(schema))
        assert ended, text
        assert re.search(r"\.[0-9]{1,9}[zZ+-]", json.loads(text)["at"]), text
        assert _writes(tiny_tok, schema, '{"at":"' + ("2026-12-07T" if fmt == "date-time" else "") + '10:52:11.123456789Z"}')
        assert _writes(tiny_tok, schema, '{"at":"' + ("2026-12-07t" if fmt == "date-time" else "") + '10:52:11+01:00"}')
    theirs = {"type": "string", "format": "date-time", "pattern": "^2026"}
    assert bounded_seconds(theirs) == theirs


def test_a_multiple_of_llguidance_cannot_compile_is_named_and_dropped_from_a_tool(tiny_tok):
    """`multipleOf: 1e-12` (or 1e-11, 0.12345678912, 5e9) did not compile ("too many digits"): a 400
    for every request listing a tool that had one. A response format's is a 400 naming it; a tool's
    (lenient) loses it, its number bounded as any other (2026-12-07)."""
    from node.inference.schema_bounds import bounded_integers

    for step in (1e-11, 1e-12, 0.12345678912, 5e9):
        with pytest.raises(Unsupported, match="multipleOf"):
            constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"type": "number", "multipleOf": step})))
        tool = {"type": "object", "properties": {"x": {"type": "number", "multipleOf": step}}, "required": ["x"],
                "x-guidance": {"lenient": True}}
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(tool)), param="tools")
        text, ended = _digit_walk(tiny_tok, g.json_value(tool))
        assert ended and isinstance(json.loads(text)["x"], int | float), text
    for step in (1e-10, 0.01, 2.5, 4294967295):  # what it holds is kept
        held = {"type": "number", "multipleOf": step}
        assert bounded_integers(held) == held
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(held)))


@pytest.mark.parametrize("step", [float("nan"), float("inf")])
def test_a_multiple_of_that_is_not_finite_is_refused_not_spun_on(tiny_tok, step):
    """A peer's WORK frame may hold NaN or Infinity (frame headers are read by json.loads): the step check
    multiplied `nan % 1` by 10 for ever on the slice's one thread (review r55). Refused now, or dropped
    from a lenient tool schema."""
    import threading

    outcome = []

    def run():
        try:
            constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"type": "number", "multipleOf": step})))
            outcome.append("compiled")
        except (InvalidRequest, Unsupported) as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert outcome and isinstance(outcome[0], Unsupported) and "multipleOf" in outcome[0].message, outcome
    lenient = {"type": "number", "multipleOf": step, "x-guidance": {"lenient": True}}
    constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(lenient)))  # the step dropped
