"""Typed bodies of the network's own frames (HELLO, ERROR, PEX), validated on decode.

A frame's JSON header is untrusted input: every field is type- and size-checked here and a
violation raises `ProtocolError` (the link that sent it is closed, nothing else).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from node.const import REGION_MAX_CHARS
from node.errors import ProtocolError
from node.values import is_int, is_sha256

from ._frames import Frame, FrameType
from ._identity import is_node_id
from ._membership import MAX_EPOCH, NONCE_HEX, OPEN

PROTOCOL_NAME = "swarmllm"
PROTOCOL_VERSION = 2  # 2: admission (swarm membership) on every link

# HELLO feature bits
FEATURE_PEX = 1 << 0  # exchanges peer addresses
FEATURE_RELAY = 1 << 1  # accepts relay clients on its peer port
FEATURE_PIPELINE = 1 << 2  # serves WORK for the distributed pipeline (contributing)

_MAX_ADDRS = 32
_MAX_MODELS = 256
_MAX_FILES = 256  # whole files a HELLO may list as held (senders list at most ADVERT_FILES_MAX)
_MAX_TEXT = 256
_MAX_PEX = 256
_MAX_SAMPLING = 512  # sampling feature names a HELLO may list (this version has ~25)
_MAX_TIME = 1e11  # unix seconds (year 5138): a HELLO `time` beyond is not a time


class NotSwarmPeer(ProtocolError):
    """The other end does not speak our protocol (wrong magic, protocol name or version)."""

    code = "not_swarm_peer"

    def __init__(self, message: str, *, protocol_version: object = None, agent: object = None):
        super().__init__(message)
        self.protocol_version = protocol_version
        self.agent = agent


def _text(h: Mapping[str, Any], key: str, *, optional: bool = False, limit: int = _MAX_TEXT) -> str | None:
    value = h.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolError(f"field {key!r} must be a string of at most {limit} chars")
    return value


def _int(h: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = h.get(key)
    if not is_int(value) or not lo <= value <= hi:
        raise ProtocolError(f"field {key!r} must be an integer in [{lo}, {hi}]")
    return value


def _addr_list(h: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = h.get(key, [])
    if not isinstance(value, list) or len(value) > _MAX_ADDRS:
        raise ProtocolError(f"field {key!r} must be a list of at most {_MAX_ADDRS} addresses")
    out = []
    for item in value:
        if not isinstance(item, str) or len(item) > _MAX_TEXT or ":" not in item:
            raise ProtocolError(f"field {key!r} holds a malformed address")
        out.append(item)
    return tuple(out)


def _hex(h: Mapping[str, Any], key: str, n: int) -> str:
    value = h.get(key)
    if not isinstance(value, str) or len(value) != n or any(c not in "0123456789abcdef" for c in value):
        raise ProtocolError(f"field {key!r} must be {n} lower-case hex digits")
    return value


def _swarm_id(h: Mapping[str, Any]) -> str:
    value = h.get("swarm")
    if value == OPEN:
        return value
    return _hex(h, "swarm", 8)


def _time(h: Mapping[str, Any]) -> float | None:
    value = h.get("time")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < _MAX_TIME:
        raise ProtocolError("field 'time' must be a unix time")
    return float(value)


def _files(h: Mapping[str, Any]) -> tuple[str, ...]:
    files = h.get("files", [])
    if not isinstance(files, list) or len(files) > _MAX_FILES or not all(
            is_sha256(f) for f in files):
        raise ProtocolError(f"field 'files' must be a list of at most {_MAX_FILES} sha256 hex strings")
    return tuple(dict.fromkeys(files))


def _sampling(h: Mapping[str, Any]) -> frozenset[str] | None:
    value = h.get("sampling")
    if value is None:  # a version before 2026-12-07 says nothing: the old set (sampling.OLD_FEATURES)
        return None
    if not isinstance(value, list) or len(value) > _MAX_SAMPLING or not all(
            isinstance(v, str) and len(v) <= 64 for v in value):
        raise ProtocolError(f"field 'sampling' must be a list of at most {_MAX_SAMPLING} names")
    return frozenset(value)


def _node_id(h: Mapping[str, Any], key: str) -> str:
    value = h.get(key)
    if not is_node_id(value):
        raise ProtocolError(f"field {key!r} is not a node id")
    return value


@dataclass(frozen=True)
class Hello:
    """What a node says about itself when a link opens (and again when it changes)."""

    node_id: str
    boot_id: str  # random per process start: tells a restarted peer from a duplicate link
    agent: str
    listen_port: int
    listen: tuple[str, ...] = ()  # "host:port" where the node accepts peers
    features: int = 0
    models: tuple[Mapping[str, Any], ...] = ()  # served models with layer ranges + content hash
    hardware: Mapping[str, Any] = field(default_factory=dict)
    # sha256 of the whole files it holds and hands out layers of (MODEL_PART), loaded or not; absent
    # (an older node, or one paused) means none
    files: tuple[str, ...] = ()
    region: str | None = None
    link_nonce: str | None = None  # the dialler's random nonce for this link (duplicate tie-break)
    swarm: str = ""  # the swarm's public id (a hash of its id; "open" for the open swarm)
    epoch: int = 0  # the swarm secret's generation
    member_nonce: str = ""  # fresh per link: both proofs of membership are bound to both nonces
    joining: bool = False  # the sender presents an invite instead of a membership proof
    time: float | None = None  # the sender's unix time (full HELLO only; clock skew, see _clock.py)
    # the sampling features it decodes ("sampling:min_tokens", "grammar:gbnf": node.inference.sampling
    # FEATURES; full HELLO only); None: a version before 2026-12-07, which says nothing (ignored there)
    sampling: frozenset[str] | None = None
    protocol: str = PROTOCOL_NAME
    version: int = PROTOCOL_VERSION

    def to_frame(self) -> Frame:
        """The HELLO frame."""
        header = {
            "protocol": self.protocol, "version": self.version, "features": self.features,
            "node_id": self.node_id, "boot_id": self.boot_id, "agent": self.agent,
            "listen_port": self.listen_port, "listen": list(self.listen),
            "models": [dict(m) for m in self.models], "hardware": dict(self.hardware),
        }
        header.update(swarm=self.swarm, epoch=self.epoch, member_nonce=self.member_nonce)
        if self.files:
            header["files"] = list(self.files)
        if self.joining:
            header["joining"] = True
        if self.region:
            header["region"] = self.region
        if self.link_nonce:
            header["link_nonce"] = self.link_nonce
        if self.time is not None:
            header["time"] = round(self.time, 3)
        if self.sampling is not None:
            header["sampling"] = sorted(self.sampling)
        return Frame(FrameType.HELLO, header)

    @classmethod
    def from_frame(cls, frame: Frame) -> Hello:
        """Validate a HELLO; a wrong protocol name or version raises NotSwarmPeer."""
        h = frame.header
        protocol, version, agent = h.get("protocol"), h.get("version"), h.get("agent")
        if protocol != PROTOCOL_NAME or version != PROTOCOL_VERSION:
            raise NotSwarmPeer(f"HELLO speaks {protocol!r} version {version!r}",
                               protocol_version=f"{protocol}/{version}", agent=agent)
        models = h.get("models", [])
        if not isinstance(models, list) or len(models) > _MAX_MODELS or not all(
            isinstance(m, dict) for m in models
        ):
            raise ProtocolError("field 'models' must be a list of objects")
        hardware = h.get("hardware", {})
        if not isinstance(hardware, dict):
            raise ProtocolError("field 'hardware' must be an object")
        return cls(
            node_id=_node_id(h, "node_id"),
            boot_id=_text(h, "boot_id", limit=64) or "",
            agent=_text(h, "agent") or "",
            listen_port=_int(h, "listen_port", 0, 65535),
            listen=_addr_list(h, "listen"),
            features=_int(h, "features", 0, (1 << 32) - 1),
            models=tuple(models),
            hardware=hardware,
            files=_files(h),
            region=_text(h, "region", optional=True, limit=REGION_MAX_CHARS),
            link_nonce=_text(h, "link_nonce", optional=True, limit=32),
            swarm=_swarm_id(h),
            epoch=_int(h, "epoch", 0, MAX_EPOCH),
            member_nonce=_hex(h, "member_nonce", NONCE_HEX),
            joining=h.get("joining") is True,
            time=_time(h),
            sampling=_sampling(h),
        )


@dataclass(frozen=True)
class ErrorInfo:
    """Body of an ERROR frame: a machine code and a human message."""

    code: str
    message: str

    def to_header(self) -> dict[str, str]:
        """JSON header of the ERROR frame."""
        return {"code": self.code, "message": self.message}

    @classmethod
    def from_frame(cls, frame: Frame) -> ErrorInfo:
        """Lenient: an ERROR is reported whatever its shape."""
        code = frame.header.get("code")
        message = frame.header.get("message")
        return cls(str(code)[:_MAX_TEXT] if code else "error",
                   str(message)[:4 * _MAX_TEXT] if message else "")


@dataclass(frozen=True)
class PexEntry:
    """One peer a node knows: id, direct addresses, relays it is registered at."""

    node_id: str
    addrs: tuple[str, ...] = ()
    relays: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"node_id": self.node_id, "addrs": list(self.addrs), "relays": list(self.relays)}


def pex_frame(entries: list[PexEntry]) -> Frame:
    """A PEX frame listing known peers."""
    return Frame(FrameType.PEX, {"peers": [e.to_json() for e in entries[:_MAX_PEX]]})


def parse_pex(frame: Frame) -> list[PexEntry]:
    """Validate a PEX frame."""
    peers = frame.header.get("peers")
    if not isinstance(peers, list) or len(peers) > _MAX_PEX:
        raise ProtocolError(f"PEX 'peers' must be a list of at most {_MAX_PEX} entries")
    out = []
    for item in peers:
        if not isinstance(item, dict):
            raise ProtocolError("PEX entry is not an object")
        out.append(PexEntry(_node_id(item, "node_id"), _addr_list(item, "addrs"),
                            _addr_list(item, "relays")))
    return out
