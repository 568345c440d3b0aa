"""The grammar compiler and per-request matcher (node.inference.constrain) on real vocabularies:
the default model's (ChatML special tokens) and a tiny synth one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from node.errors import InvalidRequest, Unsupported
from node.inference import compile_threads, constrain
from node.inference import grammar as g
from node.inference.sampling import SamplingParams
from node.inference.tokenizer import ModelTokenizer
from tests.support.nodes import tiny_model

pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def tiny_tok(tmp_path_factory):
    t = ModelTokenizer(tiny_model(tmp_path_factory.mktemp("vocab")))
    yield t
    t.close()


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


def test_json_schema_replies_are_valid_and_end_with_eog(tiny_tok):
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "b": {"enum": ["x", "y"]}},
              "required": ["a", "b"], "additionalProperties": False}
    for seed in range(5):
        ids, c = walk(tiny_tok, g.json_value(schema), seed)
        value = json.loads(text_of(tiny_tok, ids))
        assert set(value) == {"a", "b"} and 0 <= value["a"] <= 9 and value["b"] in ("x", "y")
        assert c.done
        allowed = c.allowed()
        assert set(np.flatnonzero(allowed)) == {i for i in range(tiny_tok.n_vocab) if tiny_tok.is_eog(i)}


def test_special_token_literal_seq_alt_repeat(tok):
    spec = g.seq(g.literal("<|im_start|>"), g.repeat(g.literal("ab"), 2, 3, sep=","),
                 g.alt(g.literal("X"), g.literal("Y")))
    vocab = constrain.vocabulary(tok)
    im_start = tok.tokenize("<|im_start|>", add_bos=False)[0]
    assert f"<[{im_start}]>" in constrain.to_lark(spec, vocab)
    ids, c = walk(tok, spec)
    assert ids[0] == im_start  # the special token itself, not its text spelled out
    rest = text_of(tok, ids[1:])
    assert rest in ("ab,abX", "ab,abY", "ab,ab,abX", "ab,ab,abY")
    assert c.done


def test_text_up_to_a_stop_and_free_text(tok):
    vocab = constrain.vocabulary(tok)
    assert "[lazy]" in constrain.to_lark(g.free_text("END."), vocab)
    c = constrain.constraint_for(tok, SamplingParams(grammar=g.seq(g.free_text("END"), g.literal("!"))))
    for token in tok.tokenize("the END", add_bos=False):
        c.accept(token)
    assert not c.done
    c.accept(tok.tokenize("!", add_bos=False)[-1])
    assert c.done
    free = constrain.constraint_for(tok, SamplingParams(grammar=g.free_text()))
    allowed = free.allowed()  # free text: any text token, and end-of-generation; no other control token
    special = constrain.vocabulary(tok).tokenizer.is_special_token
    spelled = set()  # llguidance allows one token of several with the same bytes (byte tokens)
    for i in range(tok.n_vocab):
        if tok.is_eog(i):
            assert allowed[i]
        elif special(i):
            assert not allowed[i], i
        elif allowed[i]:
            spelled.add(tok.piece(i))
    def whole_text(piece: bytes) -> bool:  # a lone UTF-8 continuation byte cannot start text
        try:
            return bool(piece.decode("utf-8"))
        except UnicodeDecodeError:
            return False

    assert {p for p in spelled if whole_text(p)} == {
        tok.piece(i) for i in range(tok.n_vocab) if not special(i) and whole_text(tok.piece(i))}


def test_repeat_min_zero_and_unbounded(tok):
    vocab = constrain.vocabulary(tok)
    assert "*" in constrain.to_lark(g.repeat(g.literal("a"), 1, None), vocab)
    c = constrain.constraint_for(tok, SamplingParams(grammar=g.seq(g.repeat(g.literal("a"), 0, 2),
                                                                          g.literal("b"))))
    c.accept(tok.tokenize("b", add_bos=False)[-1])
    assert c.done


def test_logit_bias_bans_and_forces_and_the_grammar_wins(tiny_tok):
    logits = np.zeros(tiny_tok.n_vocab, dtype=np.float32)
    c = constrain.constraint_for(tiny_tok, SamplingParams(logit_bias=((7, -100.0), (9, 100.0), (11, 2.5))))
    c.apply(logits)
    assert logits[7] == -np.inf and logits[9] == 100 and logits[11] == 2.5 and int(np.argmax(logits)) == 9
    brace = tiny_tok.tokenize("{", add_bos=False)[-1]
    c = constrain.constraint_for(tiny_tok, SamplingParams(grammar=g.json_value(None), logit_bias=((9, 100.0),)))
    logits = np.zeros(tiny_tok.n_vocab, dtype=np.float32)
    c.apply(logits)
    assert logits[9] == -np.inf and np.isfinite(logits[brace])


def test_strided_and_padded_logits(tiny_tok):
    c = constrain.constraint_for(tiny_tok, SamplingParams(grammar=g.literal("the")))
    rows = np.zeros((tiny_tok.n_vocab + 8, 3), dtype=np.float32)
    c.apply(rows[:, 1])  # a strided view, longer than the vocabulary
    allowed = np.isfinite(rows[:, 1])
    assert allowed[: tiny_tok.n_vocab].any() and not allowed[tiny_tok.n_vocab:].any()
    assert (rows[:, 0] == 0).all()


def test_history_is_replayed(tok):
    spec = g.seq(g.literal("ab"), g.literal("c"))
    history = tok.tokenize("ab", add_bos=False)
    c = constrain.constraint_for(tok, SamplingParams(grammar=spec), history)
    allowed = np.flatnonzero(c.allowed())
    assert [tok.piece(int(i)) for i in allowed] == [b"c"] * len(allowed)


@pytest.mark.parametrize(("schema", "error", "words"), [
    ({"type": "object", "not": {}}, Unsupported, "not"),
    ({"type": "string", "pattern": "(?<=a)b"}, Unsupported, "look-around"),
    ({"type": "string", "format": "zip-code"}, Unsupported, "zip-code"),
    ({"type": "wat"}, InvalidRequest, "wat"),
    ({"$ref": "#/definitions/missing"}, InvalidRequest, "missing"),
])
def test_schema_errors_are_400s_naming_the_problem(tiny_tok, schema, error, words):
    with pytest.raises(error) as caught:
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(schema)))
    assert caught.value.param == "response_format" and words in caught.value.message


def test_pydantic_standard_types_compile_and_replies_validate(tiny_tok):
    """uniqueItems (set, frozenset) and pydantic's own formats (Path, bytes, SecretStr, UUID4,
    IPvAnyAddress, Base64Bytes) were 400s (2026-12-07); now every reply is a value pydantic takes
    (strings bounded here so that random logits end them). FilePath and DirectoryPath stay a 400:
    pydantic checks the client's disk (review r44)."""
    import pathlib

    import pydantic

    class Model(pydantic.BaseModel):
        tags: set[str]
        ids: frozenset[int]
        path: pathlib.Path
        blob: bytes
        secret: pydantic.SecretStr
        uid: pydantic.UUID4
        host: pydantic.IPvAnyAddress
        b64: pydantic.Base64Bytes  # (Base64Str also wants the bytes to be UTF-8: no grammar says so)

    schema = Model.model_json_schema()
    for prop in schema["properties"].values():
        for sub in (prop, prop.get("items", {})):
            if sub.get("type") == "string" and sub.get("format") not in ("uuid4", "ipvanyaddress"):
                sub["maxLength"] = 8
        if prop.get("type") == "array":
            prop["maxItems"] = 3
    for seed in range(5):
        ids, _ = walk(tiny_tok, g.json_value(schema), seed, steps=600)
        Model.model_validate_json(text_of(tiny_tok, ids))
    # a format pydantic does not write, or one no grammar can check, is still the 400 naming it
    for fmt in ("ipvanynetwork", "file-path", "directory-path"):
        with pytest.raises(Unsupported, match=fmt):
            constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"type": "string", "format": fmt})))


def _accepts(tok, schema, text: str) -> bool:
    """Whether the schema's grammar takes exactly these bytes."""
    matcher = constrain.vocabulary(tok).matcher(g.json_value(schema))
    ids = constrain.vocabulary(tok).tokenizer.tokenize_str(text)
    if matcher.validate_tokens(ids) != len(ids):
        return False
    matcher.consume_tokens(ids)
    return matcher.is_accepting()


def test_integers_get_19_digits_on_the_sides_the_schema_leaves_open(tiny_tok):
    from node.inference.schema_bounds import MAX_INTEGER, bounded_integers

    schema = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": ["integer", "null"], "exclusiveMaximum": 5},
                        {"type": "number"}]}
    assert bounded_integers(schema)["anyOf"] == [{"type": "integer", "minimum": 0, "maximum": MAX_INTEGER},
                                                 {"type": ["integer", "null"], "exclusiveMaximum": 5,
                                                  "minimum": -MAX_INTEGER},
                                                 {"type": "number"}]
    for seed in range(5):  # random logits: a run of digits ends by the 19th
        ids, _ = walk(tiny_tok, g.json_value({"type": "integer"}), seed, steps=40)
        assert abs(json.loads(text_of(tiny_tok, ids))) <= MAX_INTEGER
    # review r44: a 19-digit id (a Discord/Twitter snowflake) is writable (16 digits cut it), and no
    # bound is added against one the client gave, nor to a const or an enum
    snowflake = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    assert _accepts(tiny_tok, snowflake, '{"id":1234567890123456789}')
    for given in ({"type": "integer", "const": 12}, {"type": "integer", "enum": [2**53, 1]}):
        assert bounded_integers(given) == given, given
    # review r45: each compiles (a client bound past the cap, a minimum below what llguidance holds,
    # int64's own bounds as protobuf/Go schemas write them)
    for given in ({"type": "integer", "minimum": 10**17}, {"type": "integer", "minimum": 9_200_000_000_000_000_000},
                  {"type": "integer", "exclusiveMinimum": 9e18}, {"type": "integer", "const": 12},
                  {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}, {"type": "integer", "enum": [2**53, 1]}):
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(given)))
    assert _accepts(tiny_tok, {"type": "integer", "minimum": 9_200_000_000_000_000_000}, "9200000000000000001")
    # what it cannot hold is a 400 naming it, never a number silently another
    for given in ({"const": 2**53 + 1}, {"type": "integer", "enum": [1, 12345678901234567890123]},
                  {"type": "integer", "maximum": -9_100_000_000_000_000_000}):
        with pytest.raises(Unsupported, match="constrained decoding"):
            constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(given)))
    # ... but in a tool's schema (lenient) the values it cannot hold are dropped: one tool with a
    # snowflake-id enum made every request listing it a 400 (review r47)
    tool = {"type": "object", "properties": {"channel": {"type": "integer", "enum": [1234567890123456789, 7]},
                                             "id": {"const": 2**60}},
            "required": ["channel"], "x-guidance": {"lenient": True}}
    constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(tool)), param="tools")
    assert _accepts(tiny_tok, tool, '{"channel":7}')
    # review r48: what a lenient schema loses keeps it as narrow as it can be held (it became `{}`, any
    # value), and a bound llguidance cannot compile is dropped there, a 400 naming it in a strict one
    import jsonschema

    for lenient_schema in ({"type": "object", "properties": {"id": {"const": 2**60}}, "required": ["id"]},
                           {"type": "object", "properties": {"id": {"anyOf": [{"const": 2**60}, {"const": 5}]}},
                            "required": ["id"]},
                           {"type": "object", "properties": {"id": {"type": "integer", "enum": [2**60, 2**61]}},
                            "required": ["id"]},
                           {"type": "object", "properties": {"id": {"type": "integer", "maximum": -9.5e18}},
                            "required": ["id"]}):
        marked = {**lenient_schema, "x-guidance": {"lenient": True}}
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(marked)), param="tools")
        for seed in range(6):
            ids, _ = walk(tiny_tok, g.json_value(marked), seed, steps=60)
            value = json.loads(text_of(tiny_tok, ids))["id"]
            assert isinstance(value, int) and not isinstance(value, bool), (lenient_schema, value)
            if "anyOf" in lenient_schema["properties"]["id"]:
                assert value == 5  # the branch it can hold
    for strict in ({"type": "integer", "const": 1e20}, {"type": "integer", "enum": [1e20, 3e19]},
                   {"type": "integer", "minimum": 1e19}):
        with pytest.raises(Unsupported, match="constrained decoding"):
            constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(strict)))
    number_const = {"type": "object", "properties": {"x": {"const": 1e20}}, "required": ["x"]}
    ids, _ = walk(tiny_tok, g.json_value(number_const), 0, steps=60)  # (a number's double: held as it is)
    jsonschema.validate(json.loads(text_of(tiny_tok, ids)), number_const)
    # review r49: the 400 names the number as sent (through a float, 2**53 + 1 read 2**53); an optional
    # big id in a tool is not left only null; a maximum of exactly -9e18 compiles
    with pytest.raises(Unsupported, match=str(2**53 + 1)):
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"type": "integer", "const": 2**53 + 1})))
    optional = {"anyOf": [{"type": "integer", "enum": [2**60, 2**61]}, {"type": "null"}]}
    assert bounded_integers(optional, lenient=True)["anyOf"][0]["type"] == "integer"
    constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"type": "integer", "maximum": -MAX_INTEGER})))
    # review r50: an exclusive bound at the limit is still the 400 (a tool's: dropped), and an optional
    # big id written as an enum with null is not left only null
    from node.inference.schema_bounds import INT64_MAX

    for edge in ({"type": "integer", "exclusiveMaximum": -MAX_INTEGER}, {"type": "integer", "exclusiveMinimum": INT64_MAX}):
        with pytest.raises(Unsupported, match="constrained decoding holds"):
            constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(edge)))
        tool_edge = {"type": "object", "properties": {"x": edge}, "required": ["x"], "x-guidance": {"lenient": True}}
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(tool_edge)), param="tools")
    nullable = bounded_integers({"type": ["integer", "null"], "enum": [2**60, 2**61, None]}, lenient=True)
    assert "enum" not in nullable and nullable["type"] == ["integer", "null"], nullable
    original = {"type": "integer"}
    bounded_integers(original)
    assert original == {"type": "integer"}  # (the caller's schema is not changed in place)
    # a bound narrowed where llguidance cannot compile it leaves the client's other bound in force
    both = {"type": "integer", "minimum": -(2**63), "exclusiveMinimum": 5}
    assert bounded_integers(both) == {"type": "integer", "exclusiveMinimum": 5, "maximum": MAX_INTEGER}
    assert not _accepts(tiny_tok, both, "0") and _accepts(tiny_tok, both, "6")


def test_logit_bias_outside_the_vocabulary(tiny_tok):
    with pytest.raises(InvalidRequest) as caught:
        constrain.check(tiny_tok, SamplingParams(logit_bias=((tiny_tok.n_vocab, 1.0),)))
    assert caught.value.param == "logit_bias"


def test_compiled_grammars_are_cached_per_vocabulary(tiny_tok):
    vocab = constrain.vocabulary(tiny_tok)
    assert constrain.vocabulary(tiny_tok) is vocab
    spec = g.json_value({"type": "object", "properties": {"k": {"type": "boolean"}}})
    vocab.matcher(spec)
    key_count = len(vocab._compiled)
    vocab.matcher(spec)
    assert len(vocab._compiled) == key_count
    for i in range(constrain.MAX_COMPILED + 5):
        vocab.matcher(g.literal(f"x{i}"))
    assert len(vocab._compiled) == constrain.MAX_COMPILED


def test_request_grammar():
    from node.inference.request import CompletionRequest, ResponseFormat

    def req(fmt):
        return CompletionRequest("chat", "m", False, False, SamplingParams(), messages=(), response_format=fmt)

    assert constrain.request_grammar(req(None)) is None
    assert constrain.request_grammar(req(ResponseFormat("json_object"))) == g.json_value(None)
    schema = {"type": "object"}
    assert constrain.request_grammar(req(ResponseFormat("json_schema", schema=schema))) == g.json_value(schema)


def test_objects_with_properties_are_closed_unless_the_schema_says_otherwise(tiny_tok):
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}},
                                               "c": {"type": "array", "items": {"properties": {"d": {}}}}},
              "$defs": {"x": {"properties": {"y": {}}}}}
    closed = constrain.closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["c"]["items"]["additionalProperties"] is False
    assert closed["$defs"]["x"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the client's schema is not changed
    kept = {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}}
    assert constrain.closed_objects(kept)["additionalProperties"] == {"type": "integer"}
    assert "additionalProperties" not in constrain.closed_objects({"type": "object"})  # json_object: any object
    # random logits never add a key the schema did not list
    for seed in range(8):
        ids, _ = walk(tiny_tok, g.json_value({"type": "object", "properties": {"n": {"type": "integer",
                                                                                  "maximum": 99}}}), seed)
        assert ids is not None
        assert set(json.loads(text_of(tiny_tok, ids))) <= {"n"}


def test_allof_schemas_are_left_open_so_they_stay_satisfiable(tiny_tok):
    """Closing each part of an allOf would forbid the other parts' properties (OpenAPI inheritance)."""
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "maximum": 9}}, "required": ["a"]},
                        {"properties": {"b": {"enum": [1, 2]}}, "required": ["b"]}]}
    constrain.check(tiny_tok, SamplingParams(grammar=g.json_value(schema)))


def test_sampling_from_a_peer_is_bounded():
    good = SamplingParams(logit_bias=((1, 5.0),), logprobs=3, grammar=g.json_value({"type": "object"}))
    assert SamplingParams.from_wire(good.to_wire()) == good
    for bad in ({"logprobs": 10_000}, {"logit_bias": [[1, float("nan")]]}, {"logit_bias": [[i, 1] for i in range(301)]},
                {"grammar": g.literal("x" * (2 << 20))},
                # the API's bounds hold for a peer's numbers too (a NaN temperature was a RuntimeError mid-step)
                {"temperature": float("nan")}, {"temperature": 3.0}, {"top_p": -1}, {"min_p": float("inf")},
                {"repeat_penalty": 11}, {"presence_penalty": "1"}, {"top_k": 1.5}, {"top_k": -1}, {"seed": 1.5},
                {"max_tokens": True}, {"logprobs": float("inf")}, {"logprobs": True}, {"logit_bias": [[1.5, 1]]}):
        with pytest.raises(ValueError):
            SamplingParams.from_wire({**good.to_wire(), **bad})
    wide = g.alt(*[g.literal(str(i)) for i in range(5000)])
    with pytest.raises(ValueError, match="nodes"):
        g.validate(wide)


def test_a_token_id_outside_the_vocabulary_is_a_protocol_error_not_an_abort(tiny_tok):
    """llama.cpp aborts the process on such an id (a C++ out_of_range): a peer's ids are checked."""
    from node.errors import ProtocolError

    for bad in (tiny_tok.n_vocab, tiny_tok.n_vocab + 5, 999_999, -1):
        with pytest.raises(ProtocolError):
            tiny_tok.piece(bad)
        with pytest.raises(ProtocolError):
            tiny_tok.is_eog(bad)


def test_the_grammar_vocabulary_lives_and_dies_with_its_tokenizer(tmp_path):
    t = ModelTokenizer(tiny_model(tmp_path))
    vocab = constrain.vocabulary(t)
    assert constrain.vocabulary(t) is vocab
    t.close()
    assert t.constraint_vocab is None


def test_a_constraint_built_with_history_continues_where_the_reply_was(tok):
    """A failover's new holder replays the reply so far: the grammar continues, never starts over."""
    spec = g.json_value({"type": "object", "properties": {"a": {"enum": ["xy"]}}, "required": ["a"]})
    head = tok.tokenize('{"a":"x', add_bos=False)
    c = constrain.constraint_for(tok, SamplingParams(grammar=spec), head)
    allowed = {tok.piece(int(i)) for i in np.flatnonzero(c.allowed())}
    assert allowed and all(b"y".startswith(p) or p.startswith(b"y") for p in allowed if p)


# --- llama-server's `grammar` (GBNF, converted to Lark), vLLM's regex and choice; ignore_eos --------

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


def test_a_long_chain_of_rules_or_refs_compiles_instead_of_crashing_the_node():
    """llguidance's compiler recurses once per level of a rule chain: ~3,000 levels (a 25 KB `grammar`,
    inside the 64 KiB bound) overflowed a thread's 8 MiB stack and the node died of a segfault — one
    request, or one peer's WORK frame (review r53). Run in a child process: without the fix it is the
    child that dies."""
    import subprocess
    import sys
    from pathlib import Path

    script = """
import string, sys, threading
from pathlib import Path
from node.inference import constrain, grammar as g
from node.inference.sampling import SamplingParams
from node.inference.tokenizer import ModelTokenizer
from tests.support.nodes import tiny_model
import tempfile
tok = ModelTokenizer(tiny_model(Path(tempfile.mkdtemp())))
a = string.ascii_lowercase
names = [x + y + z for x in a for y in a for z in a][:5000]
chain = "\\n".join([f"root::={names[0]}"] + [f"{names[i]}::={names[i + 1]}" for i in range(4999)] + [f'{names[-1]}::="x"'])
assert len(chain) <= g.MAX_GRAMMAR_CHARS
refs = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(9000)}
refs["a9000"] = {"type": "string"}
def run():  # (an executor's thread, as the node compiles)
    constrain.check(tok, SamplingParams(grammar=g.gbnf(chain)), "grammar")
    constrain.check(tok, SamplingParams(grammar=g.json_value({"$defs": refs, "$ref": "#/$defs/a0"})))
    print("compiled", flush=True)
t = threading.Thread(target=run)
t.start()
t.join()
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_a_schema_with_more_refs_than_the_bound_is_a_400(tiny_tok):
    refs = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(constrain.MAX_SCHEMA_REFS + 1)}
    refs[f"a{constrain.MAX_SCHEMA_REFS + 1}"] = {"type": "string"}
    with pytest.raises(InvalidRequest, match="more than 10000 \\$refs"):
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"$defs": refs, "$ref": "#/$defs/a0"})))


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


@pytest.mark.parametrize("limit", [0x10000000, 0, -1])
def test_grammars_compile_where_the_platform_limits_thread_stacks(tiny_tok, monkeypatch, limit):
    """Windows' CPython takes thread stacks below 256 MiB only (`THREAD_MAX_STACKSIZE`, a ValueError
    past it): 512 MiB made every constrained request a 500 there (review r55). Under that rule, under one
    that refuses any size (the default stack then), and where the OS cannot map the big stack (a
    virtual-memory limit: the thread does not start, review r57), a grammar still compiles."""
    import threading

    real, real_start, current = threading.stack_size, threading.Thread.start, [0]

    def stack_size(size=0):
        if size and limit >= 0 and (limit == 0 or size >= limit):
            raise ValueError(f"size not valid: {size} bytes")
        old, current[0] = current[0], size
        real(size)
        return old

    def start(self):
        if limit == -1 and current[0] == compile_threads.COMPILE_STACK_BYTES:
            raise RuntimeError("can't start new thread")
        return real_start(self)

    monkeypatch.setattr(threading, "stack_size", stack_size)
    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(compile_threads, "_compile_pool", None)  # the compile threads made again, under these rules
    constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"type": "object", "properties": {
        "limit": {"type": "integer", "minimum": limit}}})))


def test_the_big_stack_is_set_once_not_per_compile(tiny_tok, monkeypatch):
    """threading.stack_size is process-wide: a thread per compile set it each time, and any thread another
    request started in that window got a 255 MiB stack too (review r58). The process's compile threads
    are made once; later compiles leave the process's stack size alone."""
    import threading

    compile_threads.compile_pool()  # (started at the session's start)
    real, calls = threading.stack_size, []
    monkeypatch.setattr(threading, "stack_size", lambda *a: calls.append(a) or real(*a))
    for i in range(3):
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"type": "integer", "minimum": 1000 + i})))
    assert calls == []
