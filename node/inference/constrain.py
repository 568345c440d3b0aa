"""Constrained decoding: a grammar spec (node.inference.grammar) compiled against a model's
vocabulary, and the per-request constraint that masks the logits wherever sampling happens.

Engine: llguidance (chosen by measurement, bench/grammar_engines.py; see docs/ARCHITECTURE.md).
A spec becomes one Lark grammar (`%json {schema}` for JSON nodes, `<[id]>` for a literal that is
one special token of the vocabulary, a lazy regex for text up to a stop string); llguidance builds
its token trie from llama.cpp's vocabulary (`lltokenizer_from_vocab`, once per tokenizer) and
compiles each grammar once (an LRU per vocabulary; a request deep-copies the compiled matcher).

Per request, `TokenConstraint`:
  apply(logits)   logit_bias first (-100 bans), then the grammar's mask (a bias never breaks it);
                  once the grammar is complete only end-of-generation tokens stay allowed, so the
                  reply ends with finish_reason "stop"; ignore_eos (min_tokens: for that many
                  tokens) bans the end-of-generation tokens, as llama-server; a spent thinking budget
                  (node.inference.think_budget) leaves only its closing tag's next token;
  accept(token)   advances the matcher on the token that was sampled.
Building the tokenizer and compiling block (up to ~1 s for a 150k vocabulary): never on the loop.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import warnings
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from node.errors import EngineError, InvalidRequest, Unsupported
from node.inference import grammar as g
from node.inference.compile_threads import compile_on
from node.inference.number_runs import NumberRuns, digit_table, spec_has_our_json
from node.inference.sampling import SamplingParams
from node.inference.schema_bounds import UnholdableNumber, bounded_integers, bounded_seconds
from node.inference.schema_types import SUBSCHEMA_LISTS, SUBSCHEMA_MAPS, SUBSCHEMA_ONE, pydantic_types
from node.inference.think_budget import ThinkBudget

if TYPE_CHECKING:
    from node.inference.request import CompletionRequest
    from node.inference.tokenizer import ModelTokenizer

log = logging.getLogger(__name__)

MAX_COMPILED = 64  # compiled grammars kept per vocabulary
MAX_LOGIT_BIAS = 300  # entries, as OpenAI
BAN = -100.0  # a bias of -100 bans the token outright (OpenAI: "should result in a ban")
# JSON written compactly: no free whitespace, which a weak model could emit forever
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
# llguidance's compiler recurses once per level of a schema's $ref chain (compile_threads.py: the stack
# grammars compile on); a schema's $refs are bounded
MAX_SCHEMA_REFS = 10_000


def closed_objects(schema: Any, depth: int = 0) -> Any:
    """The schema with `additionalProperties: false` on every object schema that lists `properties`
    and says nothing about extra ones, as llama.cpp's json-schema-to-grammar does ("produces faster
    grammars and reduces hallucinations"): a weak model otherwise invents key after key and never
    closes the object. Replies stay valid against the client's schema (they are a subset)."""
    if not isinstance(schema, dict) or depth > 64:
        return schema
    out = dict(schema)
    if "properties" in out and not any(k in out for k in ("additionalProperties", "patternProperties",
                                                            "unevaluatedProperties")):
        out["additionalProperties"] = False
    for key in SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_objects(v, depth + 1) for k, v in out[key].items()}
    for key in SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(v, depth + 1) for v in out[key]]
    for key in SUBSCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key], depth + 1)
    return out


# --- the request's constraint (called once, in CompletionRun.prepare) -----------------------------

def request_grammar(request: CompletionRequest) -> g.Spec | None:
    """The grammar spec a request's output must match, or None (the one place that decides it)."""
    fmt = request.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return g.json_value(None)
    if fmt.type == "grammar":
        return g.gbnf(fmt.text)
    if fmt.type == "regex":
        return g.regex(fmt.text)
    if fmt.type == "choice":
        return g.alt(*(g.literal(c) for c in fmt.choices))
    return g.json_value(fmt.schema if fmt.schema is not None else {})


# --- vocabularies ---------------------------------------------------------------------------------

class Vocabulary:
    """llguidance's view of one llama.cpp vocabulary, its end-of-generation ids and compiled grammars."""

    def __init__(self, tok: ModelTokenizer):
        import llguidance.llamacpp

        self.n_vocab = tok.n_vocab
        with warnings.catch_warnings():  # it calls llama_token_get_attr (deprecated alias) once per token
            warnings.simplefilter("ignore", DeprecationWarning)
            self.tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(tok._vocab, n_vocab=tok.n_vocab)
        self.eog_ids = np.array(tok.eog_ids(), dtype=np.int64)
        self._tok = tok
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def special_token(self, text: str) -> int | None:
        """The id of the special (control) token written `text`, if the vocabulary has one."""
        ids = self._tok.tokenize(text, add_bos=False)
        if len(ids) == 1 and self.tokenizer.is_special_token(ids[0]):
            return ids[0]
        return None

    def matcher(self, spec: g.Spec, param: str = "response_format"):
        """A fresh matcher for `spec` (compiled once, then copied); raises Unsupported/InvalidRequest."""
        key = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        with self._lock:
            template = self._compiled.get(key)
            if template is not None:
                self._compiled.move_to_end(key)
                return template.deep_copy()
        template = compile_on(self._compile, spec, param)
        with self._lock:
            self._compiled[key] = template
            while len(self._compiled) > MAX_COMPILED:
                self._compiled.popitem(last=False)
            return template.deep_copy()

    def _compile(self, spec: g.Spec, param: str):
        """The matcher of `spec`, its first mask tried (on a compile thread: compile_threads.py)."""
        import llguidance
        import llguidance.numpy

        try:
            lark = to_lark(spec, self)
        except UnholdableNumber as exc:
            raise Unsupported(f"`{param}`: {exc}", param=param) from exc
        except g.GrammarUnreadable as exc:
            raise InvalidRequest(f"`{param}`: the GBNF grammar cannot be read: {exc}", param=param) from None
        except ValueError as exc:  # past the bound (g.MAX_NODES): many tools with big schemas (was a 500)
            raise InvalidRequest(f"`{param}`: the constrained-decoding grammar is too large ({exc}); offer fewer "
                                 "tools or smaller schemas", param=param) from exc
        template = llguidance.LLMatcher(self.tokenizer, llguidance.LLMatcher.grammar_from_lark(lark), log_level=0)
        if not template.is_error():
            # the first token's mask: a schema that admits no value at all (`{"$ref": "#"}`, a
            # reference loop) compiles, and fails only here
            probe = template.deep_copy()
            llguidance.numpy.fill_next_token_bitmask(probe, llguidance.numpy.allocate_token_bitmask(1, self.tokenizer.vocab_size))
            if probe.is_error():
                raise _grammar_error("no output can match it: the schema admits no value (a reference to "
                                     "itself, or a loop of references?)" if "json" in g.kinds(spec) else
                                     "no output can match it: the grammar admits no text (a rule that only "
                                     "refers to itself, or a regex no string matches?)", param)
        if template.is_error():
            raise _grammar_error(template.get_error(), param)
        return template


_vocab_lock = threading.Lock()


def vocabulary(tok: ModelTokenizer) -> Vocabulary:
    """The Vocabulary of a tokenizer (built once, blocking). It is kept on the tokenizer itself and
    dropped by its close(), so a reloaded model or a re-opened slice vocabulary leaves nothing behind
    (a cache keyed weakly by the tokenizer would never let go: the Vocabulary refers to it)."""
    with _vocab_lock:
        vocab = getattr(tok, "constraint_vocab", None)
        if vocab is None:
            vocab = Vocabulary(tok)
            tok.constraint_vocab = vocab
        return vocab


def _parser_error(message: str) -> str:
    """llguidance's runtime error without its parser-state dump (internal, and kilobytes long)."""
    text = message.split("<state>")[0].strip() or "parser error"
    if "Too many items" in text:
        return "the grammar's parser ran past its limits (a schema whose values must nest without end?)"
    return text[:200]


def _is_parser_limit(message: str) -> bool:
    """llguidance's parser ran past one of its limits on the request's own grammar: a schema whose values
    must nest without end ("Too many items"), or a rule with more alternatives than one Earley row
    holds ("Current row has 3003 items; max is 2000": a GBNF `root ::= "w0" | ... | "w2999"`, a 500 once)."""
    return "Too many items" in message or "Current row has" in message


def _grammar_error(message: str, param: str) -> InvalidRequest:
    text = message.replace("\n", " ")
    if m := re.search(r"Unimplemented keys: \[([^\]]*)\]", text):
        keys = ", ".join(k.strip().strip('"') for k in m.group(1).split(","))
        return Unsupported(f"`{param}`: the JSON schema uses {keys}, which constrained decoding does not support",
                           param=param)
    if m := re.search(r"error: ((?:(?!error: )[^|])*?not supported)", text):
        return Unsupported(f"`{param}`: the JSON schema's pattern uses a regex feature that constrained decoding "
                           f"does not support ({m.group(1).strip()})", param=param)
    if m := re.search(r"Unknown format: (\S+)", text):
        return Unsupported(f"`{param}`: the JSON schema uses format {m.group(1)!r}, which constrained decoding "
                           "does not support", param=param)
    if m := re.search(r"(Unimplemented [^|]*?)(?:\s+\d+ \||$)", text):
        return Unsupported(f"`{param}`: {m.group(1).strip()} is not supported by constrained decoding", param=param)
    detail = re.sub(r"\s+\d+ \|.*$", "", text).strip()
    return InvalidRequest(f"`{param}`: the output grammar cannot be compiled: {detail[:300]}", param=param)


# --- spec -> Lark ---------------------------------------------------------------------------------

def _regex_escape(text: str) -> str:
    """Text as a regex matching it literally (every non-alphanumeric ASCII character as \\x{..})."""
    return "".join(c if c.isalnum() or ord(c) > 127 else f"\\x{{{ord(c):x}}}" for c in text)


def _lark_regex(pattern: str) -> str:
    """A regex as the body of a Lark `/.../` terminal: `/` and line breaks escaped (as llguidance's
    own grammar_from_regex writes it)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(pattern[i:i + 2])
            i += 2
            continue
        out.append({"/": "\\/", "\n": "\\n", "\r": "\\r"}.get(c, c))
        i += 1
    return "".join(out)


def _gbnf_to_lark(text: str) -> str:
    """A GBNF grammar in llguidance's Lark dialect, by llguidance's own converter (Lark as it is)."""
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(text)
    except RecursionError:  # its parser recurses once per nested group: Python's "maximum recursion depth
        # exceeded" said nothing of the grammar (a 400 all the same)
        raise g.GrammarUnreadable("it nests too deeply (groups or rules inside one another, hundreds of "
                                  "levels)") from None
    except Exception as exc:  # noqa: BLE001 (it raises a bare Exception for a missing rule)
        raise g.GrammarUnreadable(str(exc)[:300]) from None


def to_lark(spec: g.Spec, vocab: Vocabulary) -> str:
    """The Lark grammar (llguidance's dialect) of a validated spec; one rule per node."""
    g.validate(spec)
    rules: list[str] = []

    def rule(body: str) -> str:
        name = f"r{len(rules)}"
        rules.append(f"{name}: {body}")
        return name

    def node(s: g.Spec) -> str:
        kind = s["type"]
        if kind == "json":
            schema = s.get("schema")
            schema = {"type": "object"} if schema is None else schema
            if isinstance(schema, bool):
                schema = {} if schema else {"not": {}}
            schema = pydantic_types(schema)  # set[str], Path, SecretStr, ...: was a 400 (2026-12-07)
            lenient = isinstance(schema, dict) and bool((schema.get("x-guidance") or {}).get("lenient"))
            schema = bounded_integers(schema, lenient=lenient)  # 19 digits: a weak model wrote digits forever
            schema = bounded_seconds(schema)  # a date-time's fraction of a second too (number_runs: numbers')
            text = json.dumps(schema)
            if text.count('"$ref"') > MAX_SCHEMA_REFS:  # (the compiler recurses along a chain of them)
                raise ValueError(f"a schema with more than {MAX_SCHEMA_REFS} $refs")
            if '"allOf"' not in text:  # allOf merges objects: closing each part would
                schema = closed_objects(schema)     # make the whole unsatisfiable
            schema = {**schema, "x-guidance": {**JSON_OPTIONS, **(schema.get("x-guidance") or {})}}
            return rule("%json " + json.dumps(schema, ensure_ascii=False))
        if kind == "literal":
            special = vocab.special_token(s["text"])
            return rule(f"<[{special}]>" if special is not None else json.dumps(s["text"], ensure_ascii=False))
        if kind == "text":
            stop = s.get("stop")
            if not stop:
                return rule("/(?s:.*)/")
            special = vocab.special_token(stop)
            if special is not None:  # a token only (a reasoning model's `</think>`): text cannot spell it
                return rule(f"/(?s:.*)/ <[{special}]>")
            name = f"r{len(rules)}"
            rules.append(f"{name}[lazy]: /(?s:.*){_regex_escape(stop)}/")
            return name
        if kind == "regex":
            return rule(f"/{_lark_regex(s['pattern'])}/")
        if kind == "gbnf":  # a whole grammar of its own (its `start`), nested
            return rule(f"%lark {{\n{_gbnf_to_lark(s['grammar'])}\n}}")
        if kind == "seq":
            return rule(" ".join(node(item) for item in s["items"]))
        if kind == "alt":
            return rule(" | ".join(node(item) for item in s["items"]))
        item = node(s["item"])
        sep = s.get("sep") or ""
        lo, hi = s.get("min", 1), s.get("max")
        tail = f"({json.dumps(sep, ensure_ascii=False)} {item})" if sep else item
        if hi is None:
            more = f"{tail}*"
        elif hi - 1 > 0:
            more = f"{tail}{{0,{hi - 1}}}"
        else:
            more = ""
        if lo <= 1:
            body = f"{item} {more}".strip()
            return rule(body if lo == 1 else f"({body})?")
        return rule(f"{item} {tail}{{{lo - 1},{'' if hi is None else hi - 1}}}")

    top = node(spec)
    return "\n".join([f"start: {top}", *rules])


# --- per request ----------------------------------------------------------------------------------

def check(tok: ModelTokenizer, params: SamplingParams, param: str = "response_format") -> None:
    """Validate a request's logit_bias against the vocabulary and compile its grammar (blocking:
    run in an executor). Raises the 400 a client must see before any response byte."""
    for token, _ in params.logit_bias:
        if not 0 <= token < tok.n_vocab:
            raise InvalidRequest(f"`logit_bias`: token id {token} is outside the model's vocabulary "
                                 f"(0..{tok.n_vocab - 1})", param="logit_bias")
    if params.grammar is not None:
        vocabulary(tok).matcher(params.grammar, param)


def constraint_for(tok: ModelTokenizer, params: SamplingParams, history: tuple[int, ...] | list[int] = ()
                   ) -> TokenConstraint | None:
    """The constraint of one generation, or None when it has neither grammar, logit_bias nor
    thinking budget (blocking; on the thread that samples). `history`: tokens already generated (a session
    rebuilt after a failover), replayed through the matcher."""
    if not params.constrained:
        return None
    constraint = TokenConstraint(tok, params)
    for token in history:
        constraint.accept(token)
    return constraint


class TokenConstraint:
    """Masks one generation's logits (bias, then grammar) and follows the sampled tokens."""

    def __init__(self, tok: ModelTokenizer, params: SamplingParams):
        self.n_vocab = tok.n_vocab
        if any(not 0 <= t < tok.n_vocab for t, _ in params.logit_bias):
            raise InvalidRequest("`logit_bias` names a token id outside the model's vocabulary", param="logit_bias")
        self.bias_ids = np.array([t for t, _ in params.logit_bias], dtype=np.int64)
        self.bias = np.array([-np.inf if b <= BAN else b for _, b in params.logit_bias], dtype=np.float32)
        self.banned_ids = self.bias_ids[np.isneginf(self.bias)]
        self.matcher = None
        self.numbers = None  # JSON numbers' digit runs, bounded (node.inference.number_runs)
        self.eog_ids = np.zeros(0, dtype=np.int64)
        self._is_eog = tok.is_eog
        if params.grammar is not None:
            import llguidance.numpy

            vocab = vocabulary(tok)
            self.matcher = vocab.matcher(params.grammar)
            self.eog_ids = vocab.eog_ids
            self._bits = llguidance.numpy.allocate_token_bitmask(1, self.n_vocab)
            self._fill = llguidance.numpy.fill_next_token_bitmask
            if spec_has_our_json(params.grammar):
                self.numbers = NumberRuns(digit_table(vocab, tok), tok.piece, self.matcher.validate_tokens)
        self.budget = None if params.reasoning_budget is None else ThinkBudget(tok, params.reasoning_budget)
        # ignore_eos / min_tokens: the end-of-generation tokens banned (for the first min_tokens steps)
        self.eog_ban = np.array(tok.eog_ids(), dtype=np.int64) if params.ignore_eos or params.min_tokens else None
        self.ban_steps = None if params.ignore_eos else params.min_tokens
        self.steps = 0

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing but end-of-generation may follow."""
        return self.matcher is not None and self.matcher.is_stopped()

    def allowed(self) -> np.ndarray | None:
        """Boolean [n_vocab] of the tokens the grammar allows next (None: no grammar)."""
        matcher = self.matcher
        if matcher is None:
            return None
        if matcher.is_stopped():
            allowed = np.zeros(self.n_vocab, dtype=bool)
        else:
            self._fill(matcher, self._bits)
            if matcher.is_error():  # the request's grammar cannot go on: its fault, said once, not a 500
                raise InvalidRequest(f"the output grammar cannot be followed: {_parser_error(matcher.get_error())}")
            allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=self.n_vocab).view(bool)
        if matcher.is_accepting():
            allowed[self.eog_ids] = True
        if self.numbers is not None:
            if self._eog_banned():  # (an end the ban takes away is no way out of a number: its digits stay)
                allowed[self.eog_ids] = False
                allowed[self.eog_ban] = False
            if self.banned_ids.size:  # nor is a token logit_bias bans (-100: the end, to force long
                allowed[self.banned_ids] = False  # replies; past the bound all was -inf, a 500: review r57)
            self.numbers.limit(allowed)
        return allowed

    def _eog_banned(self) -> bool:
        """ignore_eos, or min_tokens not reached: end-of-generation is banned at this step."""
        return self.eog_ban is not None and (self.ban_steps is None or self.steps < self.ban_steps) \
            and not self.done  # (a grammar that is complete can only end)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """Mask `logits` in place (the first n_vocab entries; a strided view is fine) and return it."""
        view = logits[: self.n_vocab]
        if self.bias_ids.size:
            view[self.bias_ids] += self.bias
        allowed = self.allowed()
        if allowed is not None:
            np.copyto(view, -np.inf, where=~allowed)
            if len(logits) > self.n_vocab:  # a padded output head: the padding is never a token
                logits[self.n_vocab:] = -np.inf
        if self._eog_banned():
            view[self.eog_ban] = -np.inf
        if self.budget is not None:  # its thinking budget spent: the closing tag, whatever else says
            self.budget.apply(logits)
        return logits

    def accept(self, token: int) -> None:
        """Advance on the sampled token (an end-of-generation token ends the reply: not consumed)."""
        self.steps += 1
        if self.budget is not None:
            self.budget.accept(token)
        if self.numbers is not None:
            self.numbers.accept(token)
        matcher = self.matcher
        if matcher is None or (self._is_eog(token) and matcher.is_accepting()):
            return
        if not matcher.consume_token(token):
            error = matcher.get_error()
            if _is_parser_limit(error):  # the grammar's parser hit its limits: the request's grammar or schema
                raise InvalidRequest(f"the output grammar cannot be followed: {_parser_error(error)}")
            raise EngineError(f"constrained decoding: token {token} was sampled outside the grammar "
                              f"({_parser_error(error)})")
