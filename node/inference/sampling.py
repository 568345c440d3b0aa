"""Sampling parameters (validated once at the API) shared by every engine.

They travel as they are to wherever sampling happens: llama.cpp on this node, the last segment of
a chain, or a remote holder running the whole model (node.inference.pipeline.wire carries
`to_wire()`). Everything that changes which token is picked lives here: the sampler chain, the
logit bias, the output constraint (a grammar spec, node.inference.grammar) and the logprobs asked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from node.errors import SamplingUnsupported
from node.inference import grammar as g
from node.inference import think_budget

MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # entries, as OpenAI
MAX_GRAMMAR_BYTES = 1 << 20  # a grammar spec from a peer (the API's own bodies are smaller)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. Defaults follow the OpenAI API where it has one."""

    max_tokens: int | None = None  # None = up to the context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0  # llama.cpp-style multiplicative penalty; 1.0 = off
    stop: tuple[str, ...] = field(default_factory=tuple)
    # token id -> bias added to its logit before any other step (OpenAI: -100..100; -100 bans it)
    logit_bias: tuple[tuple[int, float], ...] = ()
    # None = no logprobs; 0 = the chosen token's logprob; n = also the n most likely tokens
    logprobs: int | None = None
    # what the output must match: a node.inference.grammar spec in its wire form (JSON-able), or None
    grammar: dict[str, Any] | None = field(default=None, hash=False, compare=True)
    # a reasoning model's thinking budget (node.inference.think_budget's dict), or None
    reasoning_budget: dict[str, Any] | None = field(default=None, hash=False, compare=True)
    # llama-server's and vLLM's ignore_eos: no end-of-generation token is sampled, the reply runs to
    # max_tokens (benchmark tools' fixed-length replies); min_tokens (vLLM): none before that many
    ignore_eos: bool = False
    min_tokens: int = 0

    @property
    def constrained(self) -> bool:
        """Whether sampling needs the vocabulary (node.inference.constrain's TokenConstraint)."""
        return (self.grammar is not None or bool(self.logit_bias) or self.reasoning_budget is not None
                or self.ignore_eos or self.min_tokens > 0)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def as_dict(self) -> dict:
        """For DIAG lines and traces (the grammar by kind only: a schema can be long)."""
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repeat_penalty": self.repeat_penalty,
            "stop": list(self.stop),
            "logit_bias": len(self.logit_bias),
            "logprobs": self.logprobs,
            "grammar": None if self.grammar is None else self.grammar.get("type"),
            "reasoning_budget": None if self.reasoning_budget is None else self.reasoning_budget["tokens"],
            "ignore_eos": self.ignore_eos,
            "min_tokens": self.min_tokens,
        }

    def to_wire(self) -> dict[str, Any]:
        """For the peer that samples (decoded by `from_wire`): the fields away from their defaults,
        and always those a receiver before 2026-12-07 requires (WIRE_REQUIRED), so that a request
        not using a newer field still runs on a peer that predates it."""
        full = self._wire_all()
        return {k: v for k, v in full.items() if k in WIRE_REQUIRED or v != _WIRE_DEFAULTS[k]}

    def features(self) -> frozenset[str]:
        """The sampling features the peers this request's sampling dict goes to must decode: its
        fields away from their defaults ("sampling:<field>") and its grammar's node types
        ("grammar:<type>"), as peers advertise them (FEATURES, HELLO's `sampling`)."""
        out = {f"sampling:{k}" for k in self.to_wire()}
        if self.grammar is not None:
            out |= {f"grammar:{kind}" for kind in g.kinds(self.grammar)}
        return frozenset(out)

    def _wire_all(self) -> dict[str, Any]:
        return {**self.as_dict(), "logit_bias": [[t, b] for t, b in self.logit_bias], "grammar": self.grammar,
                "reasoning_budget": self.reasoning_budget}

    @classmethod
    def from_wire(cls, data: Any) -> SamplingParams:
        """An absent field is its default. Raises SamplingUnsupported on a field (or grammar type)
        this version does not know — a newer sender's, refused rather than ignored: ignoring it
        would break what the client asked for — and KeyError / TypeError / ValueError /
        AttributeError on a malformed dict."""
        if not isinstance(data, dict):
            raise TypeError("sampling parameters must be an object")
        unknown = sorted(str(k)[:40] for k in data if k not in WIRE_FIELDS)
        if unknown:
            raise SamplingUnsupported(f"does not support the sampling field {unknown[0]!r} (its version is older): "
                                      "update it", field=unknown[0])
        grammar = data.get("grammar")
        if grammar is not None:  # a peer's: bounded before anything compiles it
            if not isinstance(grammar, dict):
                raise TypeError("grammar must be an object")
            if len(json.dumps(grammar)) > MAX_GRAMMAR_BYTES:
                raise ValueError(f"grammar spec larger than {MAX_GRAMMAR_BYTES} bytes")
            try:
                g.validate(grammar)
            except g.UnknownKind as exc:
                raise SamplingUnsupported(f"does not support the grammar type {exc.kind!r} (its version is older): "
                                          "update it", field="grammar") from None
            except ValueError:  # the compile where it samples refuses it, as the client's 400 (too large, ...)
                pass
        budget = data.get("reasoning_budget")  # (absent from an older peer's)
        if budget is not None:
            budget = think_budget.validate(budget)
        logprobs = data.get("logprobs")
        if logprobs is not None and (type(logprobs) is not int or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS}")
        bias = data.get("logit_bias") or ()
        if len(bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"more than {MAX_LOGIT_BIAS} logit_bias entries")
        for token, value in bias:
            if type(token) is not int or not -100.0 <= float(value) <= 100.0:  # NaN fails this too
                raise ValueError("logit_bias entries must be [token id, a number between -100 and 100]")
        def number(key: str, lo: float, hi: float) -> float:  # the API's own bounds; NaN fails them too
            value = data.get(key, _WIRE_DEFAULTS[key])
            if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
                raise ValueError(f"{key} must be a number between {lo:g} and {hi:g}, got {value!r}")
            return float(value)

        def integer(key: str) -> int | None:
            value = data.get(key, _WIRE_DEFAULTS[key])
            if value is not None and (type(value) is not int):
                raise ValueError(f"{key} must be an integer, got {value!r}")
            return value

        top_k = integer("top_k")
        if top_k is None or not 0 <= top_k <= 1 << 20:
            raise ValueError(f"top_k must be between 0 and {1 << 20}")
        max_tokens = integer("max_tokens")
        ignore_eos = data.get("ignore_eos", False)  # (absent from an older peer's)
        if not isinstance(ignore_eos, bool):
            raise ValueError("ignore_eos must be a boolean")
        min_tokens = integer("min_tokens") or 0
        if not 0 <= min_tokens <= 1 << 24:
            raise ValueError(f"min_tokens must be between 0 and {1 << 24}")
        return cls(
            max_tokens=max_tokens, temperature=number("temperature", 0.0, 2.0), top_p=number("top_p", 0.0, 1.0),
            top_k=top_k, min_p=number("min_p", 0.0, 1.0), seed=integer("seed"),
            presence_penalty=number("presence_penalty", -2.0, 2.0),
            frequency_penalty=number("frequency_penalty", -2.0, 2.0),
            repeat_penalty=number("repeat_penalty", 0.0, 10.0), stop=tuple(str(s) for s in data.get("stop") or ()),
            logit_bias=tuple((int(t), float(b)) for t, b in data.get("logit_bias") or ()),
            logprobs=None if logprobs is None else int(logprobs),
            grammar=grammar, reasoning_budget=budget, ignore_eos=ignore_eos, min_tokens=min_tokens)


# every field a sampling dict may hold: a key outside it is a newer sender's, refused (from_wire)
WIRE_FIELDS = frozenset(f.name for f in fields(SamplingParams))
# what a receiver before 2026-12-07 reads as data[key] (a KeyError when absent): sent even at its default
WIRE_REQUIRED = frozenset(("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                           "repeat_penalty"))
_WIRE_DEFAULTS = SamplingParams()._wire_all()
# What this version decodes, as its HELLO says (`sampling`): a coordinator sends a request to no
# node lacking one of the request's features (2026-12-07)
FEATURES = frozenset({f"sampling:{name}" for name in WIRE_FIELDS} | {f"grammar:{kind}" for kind in g.KINDS})
# A node whose HELLO says nothing (a version before 2026-12-07): the fields and grammar types every
# version since sampling went to peers (2026-12-02) decodes. Later ones (reasoning_budget 12-06;
# ignore_eos, min_tokens, the regex and gbnf grammars 12-07) such a node may ignore, answering
# a reply that breaks the request's constraint without an error, or drop mid-chain.
OLD_FEATURES = frozenset({f"sampling:{name}" for name in (
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
    "repeat_penalty", "stop", "logit_bias", "logprobs", "grammar")}
    | {f"grammar:{kind}" for kind in ("json", "literal", "text", "seq", "alt", "repeat")})


def lacking(needed: frozenset[str], advertised: frozenset[str] | None) -> tuple[str | None, str] | None:
    """The first of a request's features (`SamplingParams.features`) that a node advertising
    `advertised` (None: it says nothing, OLD_FEATURES) does not decode: (the request's parameter,
    its words: "the sampling field 'min_tokens'", "the grammar type 'gbnf'"); None if none."""
    missing = sorted(needed - (OLD_FEATURES if advertised is None else advertised))
    if not missing:
        return None
    kind, _, name = missing[0].partition(":")
    if kind == "grammar":
        return "grammar", f"the grammar type {name!r}"
    return _ASKED_AS.get(name, (name, f"the sampling field {name!r}"))


# fields a request names otherwise: (the parameter, its words) as the 503 says them (2026-12-07: it
# said "the sampling field 'reasoning_budget'", which no API has)
# (no one parameter: the words name each way a request asks for it, review r75)
_ASKED_AS = {"reasoning_budget": (None, "a reasoning budget (reasoning_budget_tokens or reasoning_effort; "
                                  "Anthropic's thinking.budget_tokens)")}
