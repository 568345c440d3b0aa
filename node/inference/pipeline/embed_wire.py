"""Remote-embeddings messages: EMBED, EMBEDDED, EMBED_CANCEL (frozen, validated on decode).

A node asked for embeddings of a model it does not hold whole sends EMBED to a peer that does:
the inputs' token ids (already tokenized and length-checked by the asker) back to back as int32
payload, each input's length in the header. The holder answers with EMBEDDED frames: empty ones as
keepalives while it waits for the model or computes, then one with `end`: `ok` and the vectors as
little-endian float32 (inputs x dim, in input order), or `error` with a code and message.
EMBED_CANCEL (the client went away) stops the holder's work at its next run of inputs.

Bounds (EMBED_REMOTE_MAX_*): inputs per EMBED, tokens per EMBED, bytes of a reply; the header's
counts are checked against the payload's length before anything is decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from node import const
from node.errors import ProtocolError
from node.inference.pipeline.remote_wire import _hex64, _int, _sid

END_REASONS = ("ok", "error")
MAX_DIM = 1 << 20


@dataclass(frozen=True, eq=False)
class Embed:
    """Embed each input (token ids) with the model held whole; `dimensions` as the client asked.

    The ids stay one int32 array (the payload's own bytes, not a Python int per token) with each
    input's length: a queued EMBED costs its payload, and the per-input lists are made run by run
    on the engine's executor (`input_ids`)."""

    sid: str  # request id + attempt: EMBEDDED and EMBED_CANCEL name it
    model: str  # sha256 of the GGUF
    ids: np.ndarray  # every input's token ids back to back (int32, read-only)
    lens: tuple[int, ...]  # each input's number of ids
    coordinator: str  # node id the EMBEDDED go to: must be the sender
    dimensions: int | None = None

    @classmethod
    def of(cls, sid: str, model: str, inputs: Sequence[Sequence[int]], coordinator: str,
           dimensions: int | None = None) -> Embed:
        ids = np.fromiter((t for i in inputs for t in i), dtype="<i4")
        return cls(sid, model, ids, tuple(len(i) for i in inputs), coordinator, dimensions)

    def to_header(self) -> dict[str, Any]:
        header: dict[str, Any] = {"sid": self.sid, "model": self.model, "coord": self.coordinator,
                                  "lens": list(self.lens)}
        if self.dimensions is not None:
            header["dims"] = self.dimensions
        return header

    def payload(self) -> bytes:
        return np.ascontiguousarray(self.ids, dtype="<i4").tobytes()

    @classmethod
    def from_frame(cls, h: Any, payload: bytes) -> Embed:
        """Decode and validate (ProtocolError naming the bad field); ids are checked non-negative
        here, against the model's vocabulary by the holder. Vectorised: no Python object per id."""
        if not isinstance(h, dict):
            raise ProtocolError("EMBED header is not an object")
        sid = _sid(h.get("sid"))
        model = _hex64(h.get("model"), "model sha256")
        coordinator = _hex64(h.get("coord"), "coordinator node id")
        lens = h.get("lens")
        if not isinstance(lens, list) or not 0 < len(lens) <= const.EMBED_REMOTE_MAX_INPUTS:
            raise ProtocolError(f"EMBED input lengths: a list of 1..{const.EMBED_REMOTE_MAX_INPUTS} counts")
        lens = [_int(n, "input length", 1, const.EMBED_REMOTE_MAX_TOKENS) for n in lens]
        total = sum(lens)
        if total > const.EMBED_REMOTE_MAX_TOKENS:
            raise ProtocolError(f"EMBED carries {total} tokens; at most {const.EMBED_REMOTE_MAX_TOKENS} at once")
        if len(payload) != 4 * total:
            raise ProtocolError(f"EMBED says {total} tokens but carries {len(payload)} bytes (4 a token)")
        dims = None if h.get("dims") is None else _int(h.get("dims"), "dimensions", 1, MAX_DIM)
        ids = np.frombuffer(payload, dtype="<i4")
        if (ids < 0).any():
            raise ProtocolError("EMBED carries a negative token id")
        return cls(sid, model, ids, tuple(lens), coordinator, dims)

    @property
    def n_inputs(self) -> int:
        return len(self.lens)

    def n_tokens(self) -> int:
        return int(self.ids.size)

    def input_ids(self) -> list[np.ndarray]:
        """Each input's ids: views of `ids`, no copy (cheap on the loop; `tolist` them off it)."""
        bounds = np.cumsum((0, *self.lens))
        return [self.ids[bounds[i]:bounds[i + 1]] for i in range(len(self.lens))]


@dataclass(frozen=True, eq=False)
class Embedded:
    """Holder → asker: a keepalive (no end), the vectors (end ok), or an error end."""

    sid: str
    end: str | None = None
    vectors: np.ndarray | None = None  # (n, dim) float32 when end == ok
    error_code: str | None = None
    error: str | None = None
    param: str | None = None  # the request's field a client error names (dimensions, input)
    eval_us: int = 0  # the holder's time embedding (without its queue)

    def to_header(self) -> dict[str, Any]:
        header: dict[str, Any] = {"sid": self.sid}
        if self.end is not None:
            header["end"] = self.end
        if self.vectors is not None:
            header["n"], header["dim"] = int(self.vectors.shape[0]), int(self.vectors.shape[1])
        if self.eval_us:
            header["eval_us"] = self.eval_us
        if self.error_code is not None:
            header["error"] = {"code": self.error_code, "message": self.error, "param": self.param}
        return header

    def payload(self) -> bytes:
        return np.ascontiguousarray(self.vectors, dtype="<f4").tobytes() if self.vectors is not None else b""

    @classmethod
    def from_frame(cls, h: Any, payload: bytes) -> Embedded:
        if not isinstance(h, dict):
            raise ProtocolError("EMBEDDED header is not an object")
        sid = _sid(h.get("sid"))
        end = h.get("end")
        if end is not None and end not in END_REASONS:
            raise ProtocolError(f"bad EMBEDDED end {str(end)[:40]!r}")
        eval_us = _int(h.get("eval_us", 0), "eval_us", 0, 1 << 62)
        vectors = None
        if end == "ok":
            n = _int(h.get("n"), "vector count", 1, const.EMBED_REMOTE_MAX_INPUTS)
            dim = _int(h.get("dim"), "vector dimensions", 1, MAX_DIM)
            if 4 * n * dim > const.EMBED_REMOTE_MAX_REPLY_BYTES:
                raise ProtocolError(f"EMBEDDED says {n} x {dim} floats: over "
                                    f"{const.EMBED_REMOTE_MAX_REPLY_BYTES} bytes in one reply")
            if len(payload) != 4 * n * dim:
                raise ProtocolError(f"EMBEDDED says {n} x {dim} floats but carries {len(payload)} bytes")
            vectors = np.frombuffer(payload, dtype="<f4").reshape(n, dim)
        elif payload:
            raise ProtocolError("EMBEDDED carries a payload without vectors")
        code = message = param = None
        err = h.get("error")
        if err is not None:
            if not isinstance(err, dict):
                raise ProtocolError("EMBEDDED error is not an object")
            code, message, param = err.get("code"), err.get("message"), err.get("param")
            if not all(isinstance(v, str | None) for v in (code, message, param)):
                raise ProtocolError("EMBEDDED error code, message and param must be strings")
        if end == "error" and code is None:
            raise ProtocolError("an EMBEDDED error end carries no code")
        return cls(sid, end, vectors, code, message, param, eval_us)


@dataclass(frozen=True)
class EmbedCancel:
    """Asker → holder: stop this request (the client went away)."""

    sid: str

    def to_header(self) -> dict[str, Any]:
        return {"sid": self.sid}

    @classmethod
    def from_header(cls, h: Any) -> EmbedCancel:
        if not isinstance(h, dict):
            raise ProtocolError("EMBED_CANCEL header is not an object")
        return cls(_sid(h.get("sid")))
