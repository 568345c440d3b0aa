"""The grammar compiler and per-request matcher (node.inference.constrain) on real vocabularies:
the default model's (ChatML special tokens) and a tiny synth one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from node.errors import InvalidRequest, Unsupported
from node.inference import constrain
from node.inference import grammar as g
from node.inference.sampling import SamplingParams
from node.inference.tokenizer import ModelTokenizer
from tests.inference.constraining import text_of, walk
from tests.support.nodes import tiny_model

pytestmark = pytest.mark.llama


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

