"""Remote-generate messages: GENERATE, TOKENS, GENERATE_CANCEL (frozen, validated on decode).

A coordinator whose chain is one node holding the model whole sends it GENERATE: the prompt's
token ids (on a failover the prompt plus every token already streamed) as int32 payload, the
sampling parameters and how many new tokens it may produce. The holder runs llama.cpp and answers
with TOKENS frames: token ids as the engine hands them over, numbered (`first` = index of the batch's
first token in this generation, so a gap or a repeat is detected), an empty one as a keepalive
while there is nothing to send, and a last one with `end` (eog | length | cancelled | error, with
a code and message). GENERATE_CANCEL stops the holder's generation at its next token.

When the sampling parameters ask for logprobs, a TOKENS batch also carries each token's (header
`lp` = k, the number of top tokens each; payload after the ids: n f32 chosen logprobs, n×k int32
top ids, n×k f32 top logprobs). Absent otherwise, so a coordinator that never asks never sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from node import const
from node.errors import ProtocolError
from node.inference.handoff import TokenScores
from node.inference.pipeline.wire import _sampling_from_wire, _sampling_to_wire, encode_tokens
from node.inference.sampling import MAX_TOP_LOGPROBS, SamplingParams
from node.values import is_sha256

END_REASONS = ("eog", "length", "cancelled", "error")
MAX_SID_CHARS = 200
MAX_NEW_TOKENS = 1 << 20
MAX_PROMPT_TOKENS = min(1 << 24, const.MAX_FRAME_BYTES // 4)  # the payload is 4 bytes a token, one frame


def _sid(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_SID_CHARS or not value.isprintable():
        raise ProtocolError(f"bad session id {str(value)[:40]!r}")
    return value


def _int(value: Any, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:  # bool is not a count
        raise ProtocolError(f"bad {what} {str(value)[:40]!r} (an integer in [{low}, {high}])")
    return value


def _hex64(value: Any, what: str) -> str:
    if not is_sha256(value):
        raise ProtocolError(f"bad {what} {str(value)[:80]!r} (64 lowercase hex digits)")
    return value


def _token_array(payload: bytes, n: int, what: str) -> np.ndarray:
    """The payload as n int32 token ids, without a copy or a Python object per token (read-only)."""
    if len(payload) != 4 * n:
        raise ProtocolError(f"{what} says {n} tokens but carries {len(payload)} bytes (4 a token)")
    return np.frombuffer(payload, dtype="<i4")


def sid_of(header: Any) -> str | None:
    """The session id of a frame header when it is a valid one (to address an error reply)."""
    try:
        return _sid(header.get("sid")) if isinstance(header, dict) else None
    except ProtocolError:
        return None


@dataclass(frozen=True, eq=False)
class Generate:
    """Run `prompt` through the model held whole and stream up to `max_new_tokens` back.

    The prompt is a read-only int32 array (decoded from a frame it is a view of the payload): a
    holder checks its length against the model's context before it touches a token, checks the ids
    vectorised, and makes a list of them only for a generation it runs (`tokens()`)."""

    sid: str  # request id + attempt: TOKENS and GENERATE_CANCEL name it
    model: str  # sha256 of the GGUF
    prompt: np.ndarray  # prompt + every token already streamed (failover); the payload
    sampling: SamplingParams
    max_new_tokens: int
    coordinator: str  # node id the TOKENS go to: must be the sender
    # how many of the prompt's last tokens the reply already holds (a failover): an output grammar
    # replays them instead of starting over (absent on the wire when 0)
    n_generated: int = 0

    def __post_init__(self) -> None:
        prompt = np.asarray(self.prompt, dtype="<i4").reshape(-1)
        if prompt.flags.writeable:
            prompt = prompt.copy()
            prompt.flags.writeable = False
        object.__setattr__(self, "prompt", prompt)

    def tokens(self) -> list[int]:
        """The prompt as Python ints (for the engine)."""
        return self.prompt.tolist()

    def outside_vocabulary(self, n_vocab: int | None) -> int | None:
        """The first token id below 0 or at least `n_vocab` (when given), else None; vectorised."""
        bad = self.prompt < 0
        if n_vocab is not None:
            bad |= self.prompt >= n_vocab
        return int(self.prompt[int(bad.argmax())]) if bad.any() else None

    def to_header(self) -> dict[str, Any]:
        header = {"sid": self.sid, "model": self.model, "n": len(self.prompt),
                  "sampling": _sampling_to_wire(self.sampling), "max_new": self.max_new_tokens,
                  "coord": self.coordinator}
        if self.n_generated:
            header["gen"] = self.n_generated
        return header

    def generated(self) -> tuple[int, ...]:
        """The tokens of the reply so far (the prompt's tail after a failover)."""
        return tuple(self.prompt[len(self.prompt) - self.n_generated:].tolist()) if self.n_generated else ()

    def payload(self) -> bytes:
        return self.prompt.tobytes()

    @classmethod
    def from_frame(cls, h: Any, payload: bytes, n_vocab: int | None = None, *, check_ids: bool = True) -> Generate:
        """Decode and validate (ProtocolError naming the bad field). The payload's length is checked
        against the header's `n` (itself bounded by one frame) before anything is decoded; with
        `check_ids=False` the token ids are left for the caller to check (`outside_vocabulary`),
        e.g. once it knows the prompt fits the model's context."""
        if not isinstance(h, dict):
            raise ProtocolError("GENERATE header is not an object")
        sid = _sid(h.get("sid"))
        model = _hex64(h.get("model"), "model sha256")
        coordinator = _hex64(h.get("coord"), "coordinator node id")
        n = _int(h.get("n"), "prompt length", 1, MAX_PROMPT_TOKENS)
        max_new = _int(h.get("max_new"), "max new tokens", 1, MAX_NEW_TOKENS)
        if not isinstance(h.get("sampling"), dict):
            raise ProtocolError("GENERATE carries no sampling parameters")
        sampling = _sampling_from_wire(h["sampling"])
        n_generated = _int(h.get("gen", 0), "generated token count", 0, n - 1)
        gen = cls(sid, model, _token_array(payload, n, "GENERATE"), sampling, max_new, coordinator, n_generated)
        if check_ids and (bad := gen.outside_vocabulary(n_vocab)) is not None:
            raise ProtocolError(f"GENERATE carries token id {bad} outside the vocabulary")
        return gen


@dataclass(frozen=True)
class Tokens:
    """Holder → coordinator: a batch of token ids, a keepalive (no tokens, no end), or the end."""

    sid: str
    first: int  # index of tokens[0] in this generation (= tokens sent before this frame)
    tokens: tuple[int, ...] = ()
    eval_us: int = 0  # holder's time producing this batch (the first one includes prefill)
    end: str | None = None  # eog | length | cancelled | error: the generation is over
    error_code: str | None = None
    error: str | None = None
    scores: tuple[TokenScores, ...] = ()  # one per token when the request asked for logprobs

    def __post_init__(self) -> None:
        if self.scores and (len(self.scores) != len(self.tokens)
                            or len({len(s.top_ids) for s in self.scores}) != 1):
            raise ValueError("TOKENS scores: one per token, each with the same number of top tokens")

    def to_header(self) -> dict[str, Any]:
        header: dict[str, Any] = {"sid": self.sid, "first": self.first, "n": len(self.tokens)}
        if self.scores:
            header["lp"] = len(self.scores[0].top_ids)
        if self.eval_us:
            header["eval_us"] = self.eval_us
        if self.end is not None:
            header["end"] = self.end
        if self.error_code is not None or self.error is not None:
            header["error"] = {"code": self.error_code, "message": self.error}
        return header

    def payload(self) -> bytes:
        data = encode_tokens(list(self.tokens)) if self.tokens else b""
        if self.scores:
            data += b"".join((
                np.asarray([s.logprob for s in self.scores], dtype="<f4").tobytes(),
                np.asarray([s.top_ids for s in self.scores], dtype="<i4").tobytes(),
                np.asarray([s.top_logprobs for s in self.scores], dtype="<f4").tobytes()))
        return data

    @classmethod
    def from_frame(cls, h: Any, payload: bytes) -> Tokens:
        """Decode and validate (ProtocolError naming the bad field)."""
        if not isinstance(h, dict):
            raise ProtocolError("TOKENS header is not an object")
        sid = _sid(h.get("sid"))
        first = _int(h.get("first"), "first token index", 0, MAX_NEW_TOKENS)
        n = _int(h.get("n", 0), "token count", 0, MAX_NEW_TOKENS)
        eval_us = _int(h.get("eval_us", 0), "eval_us", 0, 1 << 62)
        k = None if h.get("lp") is None else _int(h.get("lp"), "logprobs top count", 0, MAX_TOP_LOGPROBS)
        scores: tuple[TokenScores, ...] = ()
        if k is not None and n:
            payload, scores = _scores(payload, n, k)
        ids = _token_array(payload, n, "TOKENS")
        if (ids < 0).any():
            raise ProtocolError("TOKENS carries a negative token id")
        tokens = ids.tolist()
        end = h.get("end")
        if end is not None and end not in END_REASONS:
            raise ProtocolError(f"bad TOKENS end {str(end)[:40]!r}")
        err = h.get("error")
        code = message = None
        if err is not None:
            if not isinstance(err, dict):
                raise ProtocolError("TOKENS error is not an object")
            code, message = err.get("code"), err.get("message")
            if not isinstance(code, str | None) or not isinstance(message, str | None):
                raise ProtocolError("TOKENS error code and message must be strings")
        if end == "error" and code is None:
            raise ProtocolError("a TOKENS error end carries no code")
        return cls(sid, first, tuple(tokens), eval_us, end, code, message, scores)


def _scores(payload: bytes, n: int, k: int) -> tuple[bytes, tuple[TokenScores, ...]]:
    """Split a TOKENS payload with logprobs into the ids' bytes and the scores of each token."""
    size = 4 * n * (2 + 2 * k)
    if len(payload) != size:
        raise ProtocolError(f"TOKENS with logprobs says {n} tokens, top {k}, but carries {len(payload)} bytes "
                            f"({size} expected)")
    at = 4 * n
    chosen = np.frombuffer(payload, dtype="<f4", count=n, offset=at).tolist()
    top_ids = np.frombuffer(payload, dtype="<i4", count=n * k, offset=at + 4 * n).reshape(n, k)
    if (top_ids < 0).any():
        raise ProtocolError("TOKENS carries a negative top token id")
    top = np.frombuffer(payload, dtype="<f4", count=n * k, offset=at + 4 * n * (1 + k)).reshape(n, k).tolist()
    ids = top_ids.tolist()
    return payload[:at], tuple(TokenScores(chosen[i], tuple(ids[i]), tuple(top[i])) for i in range(n))


@dataclass(frozen=True)
class GenerateCancel:
    """Coordinator → holder: stop this generation (the client went away, or the text is complete)."""

    sid: str

    def to_header(self) -> dict[str, Any]:
        return {"sid": self.sid}

    @classmethod
    def from_header(cls, h: Any) -> GenerateCancel:
        if not isinstance(h, dict):
            raise ProtocolError("GENERATE_CANCEL header is not an object")
        return cls(_sid(h.get("sid")))
