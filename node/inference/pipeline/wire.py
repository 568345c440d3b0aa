"""Pipeline messages (frozen dataclasses, validated on decode) and the activation codec.

WORK carries token ids (to the first segment) or hidden states (to the others) plus everything a
segment needs to act without asking anyone: the session, the position, the whole route (so it
can forward to the next hop) and the coordinator (so it can ACK and report). Telemetry of every
hop accumulates in the WORK header as it travels and reaches the coordinator in RESULT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import zstandard

from node import const
from node.errors import ProtocolError, SamplingUnsupported
from node.inference.handoff import TokenScores
from node.inference.sampling import MAX_TOP_LOGPROBS, SamplingParams

if TYPE_CHECKING:  # torch loads with the slice engine, not at start (node/inference/torchload.py)
    import torch

ZSTD_MIN_BYTES = 64 * 1024  # compress activation payloads at least this large (prefill)
ZSTD_LEVEL = 1
_DTYPES = {"f32": np.float32, "f16": np.float16, "i8": np.int8}


# --- activation codec ---------------------------------------------------------------------------


def encode_activations(hidden: torch.Tensor, bits: int) -> tuple[dict[str, Any], bytes]:
    """Hidden states [T, H] → (meta, payload): f32, f16, or int8 with one f32 scale per row."""
    import torch  # the slice engine's executor has loaded it (torchload.py)

    if hidden.dim() != 2:
        raise ValueError(f"hidden states must be [T, H], got {tuple(hidden.shape)}")
    if hidden.dtype is not torch.float32 or not hidden.is_contiguous() or hidden.requires_grad:
        hidden = hidden.detach().to(torch.float32).contiguous()
    x = hidden.numpy()
    rows, cols = x.shape
    if bits == 32:
        meta, data = {"dtype": "f32"}, x.tobytes()
    elif bits == 16:
        meta, data = {"dtype": "f16"}, np.clip(x, -65504, 65504).astype(np.float16).tobytes()
    elif bits == 8:
        scale = np.abs(x).max(axis=1) / 127.0
        scale[scale == 0] = 1.0
        q = np.clip(np.rint(x / scale[:, None]), -127, 127).astype(np.int8)
        meta, data = {"dtype": "i8"}, scale.astype(np.float32).tobytes() + q.tobytes()
    else:
        raise ValueError(f"activation bits must be 32, 16 or 8, not {bits}")
    meta["shape"] = [rows, cols]
    if len(data) >= ZSTD_MIN_BYTES:
        packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
        if len(packed) < len(data):
            meta["zstd"] = len(data)
            data = packed
    return meta, data


def decode_activations(meta: dict[str, Any], payload: bytes) -> torch.Tensor:
    """The inverse of encode_activations; a malformed payload is a ProtocolError."""
    import torch  # the slice engine's executor has loaded it (torchload.py)

    try:
        kind = meta["dtype"]
        rows, cols = (_int(v) for v in meta["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"bad activation metadata: {str(meta)[:200]}") from exc
    if kind not in _DTYPES or rows <= 0 or cols <= 0:
        raise ProtocolError(f"bad activation metadata: {str(meta)[:200]}")
    expected = rows * 4 + rows * cols if kind == "i8" else rows * cols * np.dtype(_DTYPES[kind]).itemsize
    if expected > const.MAX_FRAME_BYTES:
        raise ProtocolError(f"activations of {rows}x{cols} {kind} are larger than a frame may carry")
    data = payload
    if meta.get("zstd"):
        data = _decompress(payload, expected)
    if kind == "i8":
        if len(data) != expected:
            raise ProtocolError(f"activation payload is {len(data)} bytes, expected {expected}")
        scale = np.frombuffer(data[: rows * 4], dtype=np.float32)
        q = np.frombuffer(data[rows * 4:], dtype=np.int8).reshape(rows, cols)
        return torch.from_numpy(q.astype(np.float32) * scale[:, None])
    dtype = _DTYPES[kind]
    if len(data) != expected:
        raise ProtocolError(f"activation payload is {len(data)} bytes, expected {expected}")
    return torch.from_numpy(np.frombuffer(data, dtype=dtype).reshape(rows, cols).astype(np.float32))


def _decompress(payload: bytes, expected: int) -> bytes:
    """A zstd payload that must expand to exactly `expected` bytes, never to more: the frame's own
    content size is checked first, and the stream is read no further than one byte past it
    (python-zstandard's `max_output_size` bounds nothing when the frame states its size: a 64 KiB
    payload of zeros once expanded to 2 GiB before its length was checked)."""
    try:
        declared = zstandard.frame_content_size(payload)
        if declared >= 0 and declared != expected:
            raise ProtocolError(f"activation payload expands to {declared} bytes, expected {expected}")
        with zstandard.ZstdDecompressor().stream_reader(payload) as reader:
            data = reader.read(expected + 1)
    except zstandard.ZstdError as exc:
        raise ProtocolError(f"activation payload failed to decompress: {exc}") from exc
    if len(data) != expected:
        raise ProtocolError(f"activation payload expands to {len(data)}{'+' if len(data) > expected else ''} bytes, "
                            f"expected {expected}")
    return data


def encode_tokens(tokens: list[int]) -> bytes:
    """Token ids as little-endian int32."""
    return np.asarray(tokens, dtype="<i4").tobytes()


def decode_tokens(payload: bytes) -> list[int]:
    """Inverse of encode_tokens."""
    if len(payload) % 4:
        raise ProtocolError("token payload length is not a multiple of 4")
    return np.frombuffer(payload, dtype="<i4").tolist()


# --- messages -----------------------------------------------------------------------------------


def _int(value: Any) -> int:
    """A JSON integer, nothing else: `int()` would take true, 2.7, "2" and raise OverflowError on
    Infinity (which Python's json reads)."""
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__} {value!r:.40}")
    return value


@dataclass(frozen=True)
class Hop:
    """One segment of a route: who runs layers [start, end)."""

    node_id: str
    start: int
    end: int

    def as_wire(self) -> dict[str, Any]:
        return {"node": self.node_id, "start": self.start, "end": self.end}

    @classmethod
    def from_wire(cls, data: Any) -> Hop:
        try:
            hop = cls(str(data["node"]), _int(data["start"]), _int(data["end"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"bad route hop: {data!r}") from exc
        if not 0 <= hop.start < hop.end:
            raise ProtocolError(f"bad route hop range: {data!r}")
        return hop


def _sampling_to_wire(p: SamplingParams) -> dict[str, Any]:
    return p.to_wire()


def _sampling_from_wire(data: Any) -> SamplingParams:
    """The sampling parameters a peer sent. A value this version refuses (out of its bounds, of
    another type) is, like a field it lacks, SamplingUnsupported: the sender validated it against
    its own version's rules, and a refusal tells it to try another node; a worker used to drop such a
    WORK unanswered and its coordinator charged it as silent after the ACK deadline (2026-12-07)."""
    if not isinstance(data, dict):
        raise ProtocolError("bad sampling parameters: not an object")
    try:
        return SamplingParams.from_wire(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SamplingUnsupported(f"refuses the sampling parameters it was sent ({str(exc)[:200]}): "
                                  "it runs another version", field="sampling") from exc


@dataclass(frozen=True)
class Work:
    """One step for one session: a prefill chunk or one decode token, at a hop of the route."""

    sid: str  # KV session id (request id + attempt)
    model: str  # sha256 of the GGUF: models are matched by content, never by name
    seq: int  # step number within the session
    index_pos: int  # rotary position of the first token of this step
    n_tokens: int
    route: tuple[Hop, ...]
    hop: int  # index in route of the segment receiving this WORK
    coordinator: str  # node id to ACK and to send RESULT to
    sample: bool  # the last segment samples a token after this step
    activation_bits: int = 16
    sampling: SamplingParams | None = None  # sent with the first step of a session; decoded by the last hop
    # ... a hop before the last one's: the sampling dict as it came, carried on undecoded (only the
    # segment that samples refuses a field its version lacks: SamplingUnsupported)
    passed_sampling: dict[str, Any] | None = field(default=None, compare=False)
    history: tuple[int, ...] = ()  # tokens already generated (penalties; re-sent on failover)
    telemetry: tuple[dict[str, Any], ...] = ()
    act: dict[str, Any] | None = None  # activation metadata (hops > 0)
    # n-gram speculation: the step's last len(draft) tokens are these drafted ids (the last segment
    # sees hidden states, not ids); it samples every row and answers the tokens up to the first
    # one that differs from the draft
    draft: tuple[int, ...] = ()
    # positions >= index_pos in the session are rejected draft tokens of an earlier step: forget them
    rewind: bool = False
    # prefix reuse: this session starts as that kept session of the same coordinator, cut to
    # index_pos positions (the prompt's common prefix with the kept one's tokens)
    resume: str | None = None
    # ... as a copy of that prefix: the kept session stays kept, whole (another conversation with
    # the same system prompt); an older segment ignores the key and resumes (renames) it
    resume_copy: bool = False
    # the step's first prompt_rows rows are prompt tokens, the rest generated ones (the slice engine
    # computes each row as it would in a step of any size: see SliceModel.forward); an older
    # coordinator sends none, and its steps are computed as before
    prompt_rows: int | None = None
    # the step that opens a session: the positions its attempt prefills (prompt + tokens generated
    # before a failover), what the segment's KV admission reserves for (kvbudget.py); an older
    # coordinator sends none (the step's own end is reserved for)
    expect: int | None = None

    @property
    def target(self) -> Hop:
        return self.route[self.hop]

    def to_header(self) -> dict[str, Any]:
        header: dict[str, Any] = {
            "sid": self.sid, "model": self.model, "seq": self.seq, "index_pos": self.index_pos,
            "n": self.n_tokens, "route": [h.as_wire() for h in self.route], "hop": self.hop,
            "coord": self.coordinator, "sample": self.sample, "bits": self.activation_bits,
            "telemetry": list(self.telemetry),
        }
        if self.sampling is not None:
            header["sampling"] = _sampling_to_wire(self.sampling)
        elif self.passed_sampling is not None:
            header["sampling"] = self.passed_sampling
        if self.history:
            header["history"] = list(self.history)
        if self.act is not None:
            header["act"] = self.act
        if self.draft:
            header["draft"] = list(self.draft)
        if self.rewind:
            header["rewind"] = True
        if self.resume is not None:
            header["resume"] = self.resume
            if self.resume_copy:
                header["resume_copy"] = True
        if self.prompt_rows is not None:
            header["prompt_rows"] = self.prompt_rows
        if self.expect is not None:
            header["expect"] = self.expect
        return header

    def forward_header(self, hop: int, act: dict[str, Any], telemetry: dict[str, Any]) -> dict[str, Any]:
        """The header of this step's WORK for route[hop]: these activations, one more telemetry
        entry (what `dataclasses.replace(...).to_header()` gives, without rebuilding a Work)."""
        header = self.to_header()
        header["hop"] = hop
        header["act"] = act
        header["telemetry"].append(telemetry)
        return header

    @classmethod
    def from_header(cls, h: Any) -> Work:
        try:
            route = tuple(Hop.from_wire(x) for x in h["route"])
            raw, hop = h.get("sampling"), _int(h["hop"])
            samples_here = hop == len(route) - 1  # (a hop past the route fails the checks below)
            work = cls(
                sid=str(h["sid"]), model=str(h["model"]), seq=_int(h["seq"]), index_pos=_int(h["index_pos"]),
                n_tokens=_int(h["n"]), route=route, hop=_int(h["hop"]), coordinator=str(h["coord"]),
                sample=bool(h["sample"]), activation_bits=_int(h.get("bits", 16)),
                sampling=_sampling_from_wire(raw) if raw is not None and samples_here else None,
                passed_sampling=dict(raw) if raw is not None and not samples_here else None,
                history=tuple(_int(t) for t in h.get("history") or ()),
                telemetry=tuple(dict(t) for t in h.get("telemetry") or ()),
                act=dict(h["act"]) if h.get("act") is not None else None,
                draft=tuple(_int(t) for t in h.get("draft") or ()), rewind=bool(h.get("rewind", False)),
                resume=str(h["resume"]) if h.get("resume") is not None else None,
                resume_copy=bool(h.get("resume_copy", False)),
                prompt_rows=_int(h["prompt_rows"]) if h.get("prompt_rows") is not None else None,
                expect=_int(h["expect"]) if h.get("expect") is not None else None)
        except ProtocolError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed WORK header: {exc}") from exc
        if not route or not 0 <= work.hop < len(route) or work.index_pos < 0 or work.n_tokens <= 0:
            raise ProtocolError(f"malformed WORK: hop={work.hop} route_len={len(route)} "
                                f"index_pos={work.index_pos} n={work.n_tokens}")
        if len(work.draft) >= work.n_tokens or (work.draft and not work.sample):
            raise ProtocolError(f"malformed WORK: draft={work.draft} n={work.n_tokens} sample={work.sample}")
        if work.activation_bits not in (8, 16, 32):
            raise ProtocolError(f"unsupported activation bits {work.activation_bits}")
        if work.resume is not None and (work.index_pos == 0 or work.resume == work.sid):
            raise ProtocolError(f"malformed WORK: resume={work.resume!r} at index_pos={work.index_pos}")
        if work.resume_copy and work.resume is None:
            raise ProtocolError("malformed WORK: resume_copy without resume")
        if work.prompt_rows is not None and not 0 <= work.prompt_rows <= work.n_tokens - len(work.draft):
            raise ProtocolError(f"malformed WORK: prompt_rows={work.prompt_rows} n={work.n_tokens} "
                                f"draft={len(work.draft)}")
        if work.expect is not None and work.expect < work.index_pos + work.n_tokens - len(work.draft):
            raise ProtocolError(f"malformed WORK: expect={work.expect} below index_pos={work.index_pos} "
                                f"+ n={work.n_tokens}")
        return work


def scores_to_wire(s: TokenScores) -> dict[str, Any]:
    """A token's logprobs in a RESULT header: {"lp", "ids", "top"}."""
    return {"lp": s.logprob, "ids": list(s.top_ids), "top": list(s.top_logprobs)}


def scores_from_wire(data: Any) -> TokenScores:
    """The inverse of scores_to_wire; ProtocolError on a malformed one."""
    try:
        ids = tuple(_int(i) for i in data.get("ids") or ())
        top = tuple(float(v) for v in data.get("top") or ())
        scores = TokenScores(float(data["lp"]), ids, top)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed logprobs: {exc}") from exc
    if len(ids) != len(top) or len(ids) > MAX_TOP_LOGPROBS or any(i < 0 for i in ids):
        raise ProtocolError(f"malformed logprobs: {len(ids)} ids, {len(top)} values")
    return scores


@dataclass(frozen=True)
class Result:
    """From the last segment (or a failing one) to the coordinator."""

    sid: str
    seq: int
    token: int | None = None
    telemetry: tuple[dict[str, Any], ...] = ()
    error: str | None = None  # message when a segment failed this step
    error_code: str | None = None
    failed_node: str | None = None
    scores: TokenScores | None = None  # the token's logprobs, only when the request asked for them
    # a speculative step's verified tokens (the accepted draft, then the model's own token);
    # `token` is the first of them
    tokens: tuple[int, ...] = ()

    def to_header(self) -> dict[str, Any]:
        header: dict[str, Any] = {"sid": self.sid, "seq": self.seq, "telemetry": list(self.telemetry)}
        if self.token is not None:
            header["token"] = self.token
        if self.tokens:
            header["tokens"] = list(self.tokens)
        if self.scores is not None:  # absent unless asked: older coordinators never see it
            header["logprobs"] = scores_to_wire(self.scores)
        if self.error is not None:
            header["error"] = {"message": self.error, "code": self.error_code, "node": self.failed_node}
        return header

    @classmethod
    def from_header(cls, h: Any) -> Result:
        try:
            err = h.get("error") or {}
            if not isinstance(err, dict) or not all(v is None or isinstance(v, str) for v in
                                                    (err.get("message"), err.get("code"), err.get("node"))):
                raise ProtocolError(f"malformed RESULT error: {str(err)[:200]}")
            scores = h.get("logprobs")
            return cls(sid=str(h["sid"]), seq=_int(h["seq"]),
                       token=None if h.get("token") is None else _int(h["token"]),
                       telemetry=tuple(dict(t) for t in h.get("telemetry") or ()),
                       error=err.get("message"), error_code=err.get("code"), failed_node=err.get("node"),
                       scores=None if scores is None else scores_from_wire(scores),
                       tokens=tuple(_int(t) for t in h.get("tokens") or ()))
        except ProtocolError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed RESULT header: {exc}") from exc


@dataclass(frozen=True)
class Ack:
    """A segment received a WORK step: sent with the step's output (`done`), or ACK_HOLD_S after
    receipt while it still computes."""

    sid: str
    seq: int
    hop: int
    node_id: str
    held_us: int = 0  # receipt → ACK sent: the coordinator takes it out of its RTT sample
    done: bool = False  # the step's output left with this ACK: the next hop's clock starts now

    def to_header(self) -> dict[str, Any]:
        h = {"sid": self.sid, "seq": self.seq, "hop": self.hop, "node": self.node_id, "held_us": self.held_us}
        if self.done:
            h["done"] = True
        return h

    @classmethod
    def from_header(cls, h: Any) -> Ack:
        try:
            return cls(str(h["sid"]), _int(h["seq"]), _int(h["hop"]), str(h["node"]), max(0, _int(h.get("held_us", 0))),
                       h.get("done") is True)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed ACK header: {exc}") from exc


@dataclass(frozen=True)
class SessionControl:
    """CANCEL or SESSION_END for a session on one model; `keep` (SESSION_END): hold its KV for
    the coordinator's next request on this chain (prefix reuse) instead of freeing it."""

    sid: str
    model: str
    reason: str = "end"
    keep: bool = False

    def to_header(self) -> dict[str, Any]:
        header: dict[str, Any] = {"sid": self.sid, "model": self.model, "reason": self.reason}
        if self.keep:
            header["keep"] = True
        return header

    @classmethod
    def from_header(cls, h: Any) -> SessionControl:
        try:
            return cls(str(h["sid"]), str(h["model"]), str(h.get("reason", "end")), bool(h.get("keep", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed session control header: {exc}") from exc


@dataclass
class HopTelemetry:
    """What one segment measured for one step (microseconds, bytes)."""

    node: str
    start: int
    end: int
    eval_us: int = 0  # compute: the layers' forward (and sampling on the last segment)
    wait_us: int = 0  # receipt → the slice's thread starts the step (queue + thread hand-off)
    codec_us: int = 0  # input decode + session lookup + output encode (executor thread)
    send_us: int = 0  # the executor's hand-back to the loop before the next frame is built and sent
    bytes_in: int = 0
    bytes_out: int = 0
    kv_len: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_wire(self) -> dict[str, Any]:
        return {"node": self.node, "start": self.start, "end": self.end, "eval_us": self.eval_us,
                "wait_us": self.wait_us, "codec_us": self.codec_us, "send_us": self.send_us, "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out, "kv_len": self.kv_len, **self.extra}
