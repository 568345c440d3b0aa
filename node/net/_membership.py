"""Swarm membership: which swarm this node belongs to, and the proofs that a peer belongs to it too.

A swarm is a 128-bit id and a 256-bit secret shared by its members (`swarm.json`, 0600, in the data
dir; a node creates its own private swarm on first run). TLS proves a peer holds the key of the
node id it claims; membership proves it holds the swarm's secret: after the HELLOs, each side sends
HMAC-SHA256(secret, label | swarm id | epoch | prover id | verifier id | prover nonce | verifier
nonce), so a proof is bound to both identities and both fresh nonces and cannot be replayed for
another node id, on another link or through a relay. The secret never leaves this module except to
be written to swarm.json or handed to a member (invite, rotation) over an authenticated link.

What others may see: `public_id` (a hash of the swarm id: logs, reports, HELLO) and the mDNS tag
(a keyed hash of the swarm id for the day, so strangers cannot even tell two members apart from
two nodes of different swarms, and members do not dial nodes of other swarms). An open swarm
(`swarm = "open"`, opt-in) has no secret: its nodes link with any other open node.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from node.datadir import cannot_read, keep_aside, linked_target, open_private, present, read_data_file
from node.errors import NodeError, ProtocolError

log = logging.getLogger(__name__)

SWARM_FILE = "swarm.json"
OPEN = "open"
_PROOF_LABEL = b"swarmllm-member-v1"
_PUBLIC_LABEL = b"swarmllm-swarm-id-v1"
_MDNS_LABEL = b"swarmllm-mdns-v1"
_JOIN_LABEL = b"swarmllm-join-v1"
_NONCE_BYTES = 16
NONCE_HEX = 2 * _NONCE_BYTES
MAX_EPOCH = 2**31 - 1
MAX_MEMBERS = 1024  # members remembered in swarm.json (the least recently linked are forgotten first)
MEMBER_SEEN_SAVE_S = 3600.0  # a known member's last-linked time is written again at most this often
REMOVED_MAX = 4096  # removed node ids kept: what one rekey or welcome may carry (a longer list is refused)


def bounded_removed(kept: set[str], new: set[str] | frozenset[str], keep: frozenset[str] = frozenset()) -> set[str]:
    """`kept | new`, at most REMOVED_MAX ids: those in `keep` (a removal this node makes now), then
    the lowest ids, an order every member shares, so members passing rekeys on converge on one set
    (the newest first had two members evict each other's ids and pass them back and forth).
    2026-12-07: the set only grew, a member's rekeys adding 4,096 made-up ids each; past 4,096 this
    node's rekeys and welcomes were refused by every member as malformed (the links closing), so its
    removals no longer reached anyone."""
    union = set(kept) | set(new)
    if len(union) <= REMOVED_MAX:
        return union
    first = set(keep) & union
    return first | set(sorted(union - first)[:REMOVED_MAX - len(first)])


def new_nonce() -> str:
    """A fresh membership nonce for one link (hex)."""
    return secrets.token_hex(_NONCE_BYTES)


def _is_hex(value: object, n: int) -> bool:
    return isinstance(value, str) and len(value) == n and all(c in "0123456789abcdef" for c in value)


@dataclass(frozen=True)
class Swarm:
    """This node's swarm. `secret` is None for the open swarm."""

    swarm_id: str  # 32 hex digits; OPEN for the open swarm
    secret: bytes | None = field(repr=False)  # never in a repr, a log or a report
    epoch: int = 0  # bumped by every rotation (a removed member's secret stops working)

    @property
    def is_open(self) -> bool:
        return self.secret is None

    @property
    def public_id(self) -> str:
        """What logs, reports and HELLO show (8 hex digits): a hash, never the id itself."""
        if self.is_open:
            return OPEN
        return hashlib.sha256(_PUBLIC_LABEL + self.swarm_id.encode()).hexdigest()[:8]

    def proof(self, prover: str, verifier: str, prover_nonce: str, verifier_nonce: str) -> str:
        """The membership proof `prover` sends `verifier` on one link ('' for the open swarm)."""
        if self.secret is None:
            return ""
        msg = b"\0".join([_PROOF_LABEL, self.swarm_id.encode(), str(self.epoch).encode(), prover.encode(),
                          verifier.encode(), prover_nonce.encode(), verifier_nonce.encode()])
        return hmac.new(self.secret, msg, hashlib.sha256).hexdigest()

    def verify(self, proof: object, prover: str, verifier: str, prover_nonce: str, verifier_nonce: str) -> bool:
        """True when `proof` is the one a member `prover` would send us on this link."""
        if self.secret is None:
            return True  # open: any open node; the swarm ids were compared already
        return isinstance(proof, str) and hmac.compare_digest(
            proof, self.proof(prover, verifier, prover_nonce, verifier_nonce))

    def mdns_tag(self, day: int) -> str:
        """The mDNS tag (16 hex digits) for one day (`Clock.day`): only members holding the current
        secret can compute or recognise it (a removed member's old secret stops recognising it at
        the rotation)."""
        if self.is_open or self.secret is None:
            return OPEN
        key = hmac.new(self.secret, _MDNS_LABEL, hashlib.sha256).digest()
        return hmac.new(key, str(day).encode(), hashlib.sha256).hexdigest()[:16]

    def mdns_tags_around(self, day: int) -> set[str]:
        """Tags a member's announcement may carry on `day` (the day before and after too: clocks
        and midnights differ; `Clock.accept_mdns` handles clocks further off)."""
        return {self.mdns_tag(day), self.mdns_tag(day - 1), self.mdns_tag(day + 1)}

    def rotated(self) -> Swarm:
        """The same swarm with a fresh secret and the next epoch (revocation)."""
        if self.is_open:
            raise ValueError("an open swarm has no secret to rotate")
        if self.epoch + 1 >= MAX_EPOCH:
            raise ValueError("this swarm's secret was rotated too often; start a new swarm")
        return Swarm(self.swarm_id, secrets.token_bytes(32), self.epoch + 1)

    def to_json(self) -> dict:
        """What swarm.json and a member hand-over carry (holds the secret: never log it)."""
        return {"swarm_id": self.swarm_id, "secret": self.secret.hex() if self.secret else None,
                "epoch": self.epoch}

    @classmethod
    def from_json(cls, data: object) -> Swarm:
        """Validate a stored or handed-over swarm; ProtocolError if malformed."""
        if not isinstance(data, dict):
            raise ProtocolError("swarm must be an object")
        swarm_id, secret, epoch = data.get("swarm_id"), data.get("secret"), data.get("epoch", 0)
        if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < MAX_EPOCH:
            raise ProtocolError("swarm epoch must be a small integer")
        if swarm_id == OPEN and secret is None:
            return cls(OPEN, None, 0)
        if not _is_hex(swarm_id, 32) or not _is_hex(secret, 64):
            raise ProtocolError("swarm id must be 32 hex digits and its secret 64")
        return cls(swarm_id, bytes.fromhex(secret), epoch)

    @classmethod
    def create(cls) -> Swarm:
        """A new private swarm of one."""
        return cls(secrets.token_hex(16), secrets.token_bytes(32), 0)

    @classmethod
    def open_swarm(cls) -> Swarm:
        return cls(OPEN, None, 0)


@dataclass(frozen=True)
class Invite:
    """A one-time invitation this node issued: the token's hash and when it expires."""

    token_sha256: str
    expires_at: float


def join_proof(token: bytes, joiner: str, inviter: str, joiner_nonce: str, inviter_nonce: str) -> str:
    """What a joining node sends instead of a membership proof: it knows an invite's token."""
    msg = b"\0".join([_JOIN_LABEL, joiner.encode(), inviter.encode(), joiner_nonce.encode(),
                      inviter_nonce.encode()])
    return hmac.new(token, msg, hashlib.sha256).hexdigest()


@dataclass
class MembershipState:
    """What swarm.json holds: the swarm, the invites still open, nodes removed from it and the members
    this node has linked with (the roster: `swarm remove` finds a lost device there long after the
    peer table forgot it)."""

    swarm: Swarm
    invites: dict[str, Invite] = field(default_factory=dict)  # token sha256 → invite
    tokens: dict[str, bytes] = field(default_factory=dict, repr=False)  # token sha256 → token (join proofs)
    removed: set[str] = field(default_factory=set)  # node ids removed from this swarm
    members: dict[str, float] = field(default_factory=dict)  # node id -> when last linked (epoch s)

    def roster(self) -> dict[str, float]:
        """The members remembered, removed ones left out."""
        return {n: seen for n, seen in self.members.items() if n not in self.removed}

    def to_json(self) -> dict:
        now = time.time()
        return {
            **self.swarm.to_json(),
            "invites": [{"token": self.tokens[h].hex(), "expires_at": inv.expires_at}
                        for h, inv in self.invites.items() if inv.expires_at > now and h in self.tokens],
            "removed": sorted(self.removed),
            "members": {n: round(seen) for n, seen in self.roster().items()},
        }

    @classmethod
    def from_json(cls, data: object) -> MembershipState:
        swarm = Swarm.from_json(data)
        assert isinstance(data, dict)
        state = cls(swarm)
        invites, removed = data.get("invites"), data.get("removed")  # (a wrong shape costs these, not the swarm)
        for item in invites if isinstance(invites, list) else []:
            if isinstance(item, dict) and _is_hex(item.get("token"), 32) and isinstance(item.get("expires_at"),
                                                                                       int | float):
                token = bytes.fromhex(item["token"])
                h = hashlib.sha256(token).hexdigest()
                state.invites[h] = Invite(h, float(item["expires_at"]))
                state.tokens[h] = token
        state.removed = bounded_removed(set(), {r for r in (removed if isinstance(removed, list) else [])
                                                if _is_hex(r, 64)})
        members = data.get("members")
        if isinstance(members, dict):  # absent in files written before the roster
            seen = [(n, float(t)) for n, t in members.items() if _is_hex(n, 64) and isinstance(t, int | float)]
            state.members = dict(sorted(seen, key=lambda item: item[1])[-MAX_MEMBERS:])
        return state


def load_or_create(data_dir: Path, *, open_swarm: bool = False) -> MembershipState:
    """This node's membership (blocking: file I/O). First run: a new private swarm, written 0600.
    `open_swarm`: the opt-in open swarm instead (not written: the private one stays for later)."""
    if open_swarm:
        return MembershipState(Swarm.open_swarm())
    path = data_dir / SWARM_FILE
    if present(path):  # (a link to a folder not mounted yet is said, not taken for no swarm)
        try:
            text = read_data_file(path)
        except OSError as exc:  # unreadable is not damaged: a new swarm here cut the node off from its own
            raise NodeError(cannot_read(path, exc), code="swarm_unreadable") from None
        try:
            return MembershipState.from_json(json.loads(text.decode("utf-8")))
        except (ValueError, ProtocolError) as exc:  # damaged (a crash cut it short): its secret is gone
            try:
                broken = keep_aside(path)  # never over an earlier copy
            except OSError as move:  # (held: Windows; it was "cannot write …: give a writable --data-dir")
                raise NodeError(f"{path} is damaged and another program holds it ({move.strerror or move}): "
                                "close it, then try again", code="swarm_unreadable") from None
            log.warning("DIAG: swarm file unreadable, starting a new private swarm (the old file is %s) "
                        "error=%s", broken.name, exc)
    state = MembershipState(Swarm.create())
    save(data_dir, state)
    log.info("DIAG: created a new private swarm swarm=%s", state.swarm.public_id)
    return state


def write_swarm_file(data_dir: Path, swarm: Swarm) -> None:
    """Make `data_dir`'s node a member of `swarm` (blocking; before the node starts). What a join
    does, for set-ups that prepare several nodes at once: benches, tests, the screenshot swarm."""
    save(data_dir, MembershipState(swarm))


def save(data_dir: Path, state: MembershipState) -> None:
    """Write swarm.json atomically, 0600 (blocking). Nothing is written for the open swarm."""
    if state.swarm.is_open:
        return
    write_json(data_dir, state.to_json())


def write_json(data_dir: Path, data: dict) -> None:
    """Write swarm.json atomically, 0600, from a snapshot taken on the loop (blocking)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = linked_target(data_dir / SWARM_FILE)  # (a link stays one: its target is written)
    tmp = path.with_name(f"{SWARM_FILE}.{secrets.token_hex(4)}.tmp")  # concurrent writers never share one
    fd = open_private(tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename (a power cut left an empty swarm.json on XFS)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    os.chmod(path, 0o600)
