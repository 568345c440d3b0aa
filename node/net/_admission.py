"""Admission: after TLS and the HELLOs, before anything else is served, each side proves it belongs
to the other's swarm (or presents an invite), on every link, direct or relayed.

    both:     HELLO {swarm: public id, epoch, member_nonce, joining?}
    member:   MEMBER {op: "proof", proof}  each way; a bad or missing proof → ERROR not_a_member
    joining:  the joiner sends MEMBER {op: "join", proof: HMAC(invite token, ...)}; the inviter
              answers MEMBER {op: "welcome", swarm: {...}} (over TLS: only the joiner reads it) and
              closes; the joiner adopts the swarm and dials again as a member.

`Membership` is this node's side of it at run time: the swarm (swarm.json), its open invites, and
the peers refused (by us, or who refused us), which the dialer then leaves alone.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from node import const
from node.errors import InvalidRequest, NotAMember, ProtocolError
from node.logs import clean_text, kv

from ._frames import Frame, FrameType, encode_frame, type_name
from ._hints import refusal_hint
from ._identity import is_node_id, short_id
from ._link import async_read_frame
from ._membership import (
    MAX_MEMBERS,
    MEMBER_SEEN_SAVE_S,
    REMOVED_MAX,
    Invite,
    MembershipState,
    Swarm,
    join_proof,
    load_or_create,
    write_json,
)
from ._messages import ErrorInfo, Hello
from ._stream import Stream

log = logging.getLogger(__name__)

INVITE_TTL_S = 24 * 3600.0
MAX_REFUSALS = 1024  # peers remembered as refused (the oldest are forgotten first)


@dataclass
class Refusal:
    """A peer this node will not link with while it stays in its swarm."""

    node_id: str
    swarm: str | None  # the peer's swarm as it named it
    by_us: bool  # we refused it (not a member); False: it refused us
    count: int = 0
    first_at: float = 0.0
    last_at: float = 0.0
    address: str | None = None
    reason: str = ""  # the last refusal's reason
    hint: str = ""  # what a person can do about it (another swarm: invite and join), or ''

    def describe(self) -> str:
        """The refused peer's last_error: why, and what to do about it when there is a way."""
        why = ("not in this swarm: " if self.by_us else "") + self.reason  # else: "refused us: ..."
        return f"{why} ({self.hint})" if self.hint else why

class Membership:
    """This node's swarm at run time. Loop-only; file writes go to an executor."""

    def __init__(self, data_dir: Path, *, open_swarm: bool = False):
        self.data_dir = data_dir
        self.open_swarm = open_swarm
        self.state = MembershipState(Swarm.open_swarm())  # until async_load: nothing private yet
        self.refusals: collections.OrderedDict[str, Refusal] = collections.OrderedDict()  # LRU, capped
        self.refused_addrs: dict[str, None] = {}  # least recently refused first, capped
        self._save_lock = asyncio.Lock()  # saves land in order, one at a time
        self.refusals_dropped = 0

    @property
    def swarm(self) -> Swarm:
        return self.state.swarm

    async def async_load(self) -> None:
        """Read swarm.json (or create this node's own private swarm), off the loop."""
        self.state = await asyncio.get_running_loop().run_in_executor(
            None, lambda: load_or_create(self.data_dir, open_swarm=self.open_swarm))

    # --- invites ------------------------------------------------------------------------------

    async def async_create_invite(self, ttl_s: float = INVITE_TTL_S) -> tuple[bytes, Invite]:
        """A one-time invite token (saved, so it survives a restart of this node)."""
        if self.swarm.is_open:
            raise ValueError("an open swarm needs no invites")
        token = secrets.token_bytes(16)
        h = hashlib.sha256(token).hexdigest()
        invite = Invite(h, time.time() + ttl_s)
        self.state.invites[h] = invite
        self.state.tokens[h] = token
        await self.async_save()
        return token, invite

    def take_invite(self, proof: object, joiner: str, inviter: str, joiner_nonce: str, inviter_nonce: str) -> bool:
        """True (and the invite is used up) when `proof` shows the joiner holds an open invite."""
        now = time.time()
        for h, invite in list(self.state.invites.items()):
            if invite.expires_at <= now:
                del self.state.invites[h]
                self.state.tokens.pop(h, None)
                continue
            token = self.state.tokens.get(h)
            if token is not None and isinstance(proof, str) and hmac.compare_digest(
                    proof, join_proof(token, joiner, inviter, joiner_nonce, inviter_nonce)):
                del self.state.invites[h]
                del self.state.tokens[h]
                return True
        return False

    # --- refusals -----------------------------------------------------------------------------

    def note_refusal(self, exc: NotAMember, address: str | None, *, dialled: bool = False) -> Refusal:
        """Count a refusal; the first for a peer is logged, with what to do about it (the dialer
        never retries it). `dialled`: this node dialled the peer (it meant to reach it)."""
        ref = self.refusals.get(exc.node_id)
        now = time.time()
        if ref is not None:
            self.refusals.move_to_end(exc.node_id)
        else:
            while len(self.refusals) >= MAX_REFUSALS:  # fresh identities are cheap: keep the recent ones
                self.refusals.popitem(last=False)
                self.refusals_dropped += 1
            hint = refusal_hint(peer_swarm=exc.swarm, ours=self.swarm.public_id, dialled=dialled,
                                removed=exc.node_id in self.state.removed)
            ref = self.refusals[exc.node_id] = Refusal(exc.node_id, exc.swarm, exc.by_us, first_at=now,
                                                       address=address, hint=hint)
            if exc.by_us:
                log.warning("DIAG: refusing a peer that is not in this swarm %s", kv(
                    peer_id=short_id(exc.node_id), swarm=exc.swarm or "-", ours=self.swarm.public_id,
                    reason=exc.message, hint=hint or None))
            else:
                log.warning("DIAG: a peer refused this node: not in its swarm %s", kv(
                    peer_id=short_id(exc.node_id), swarm=exc.swarm or "-", ours=self.swarm.public_id,
                    reason=clean_text(exc.message, const.REFUSAL_REASON_MAX_CHARS), hint=hint or None))
        ref.count += 1
        ref.last_at = now
        ref.reason = clean_text(exc.message, const.REFUSAL_REASON_MAX_CHARS)  # (a stranger's text: one line, capped)
        if address:
            self.refused_addrs.pop(address, None)  # re-inserted last: the dict runs least recent first
            self.refused_addrs[address] = None
            while len(self.refused_addrs) > const.REFUSED_ADDRS_MAX:  # a LAN's churn, a relay's stale list
                del self.refused_addrs[next(iter(self.refused_addrs))]
        return ref

    def is_refused(self, node_id: str) -> bool:
        return node_id in self.refusals

    # --- the roster ---------------------------------------------------------------------------

    def note_member(self, node_id: str) -> bool:
        """A peer admitted as a member (or a joiner we welcomed): remembered, with when it was last
        linked. True when swarm.json should be written (a new member, or its time is old)."""
        state = self.state
        if state.swarm.is_open or node_id in state.removed:
            return False
        now = time.time()
        last = state.members.pop(node_id, None)  # re-inserted last: the dict runs least recent first
        state.members[node_id] = now
        while len(state.members) > MAX_MEMBERS:
            del state.members[next(iter(state.members))]
        return last is None or now - last >= MEMBER_SEEN_SAVE_S

    # --- changes of swarm ---------------------------------------------------------------------

    async def async_adopt(self, swarm: Swarm, *, removed: set[str] | None = None) -> None:
        """Belong to `swarm` from now on (join, leave, rotation). Another swarm (join, leave): its
        invites and our refusals start afresh; a rotation of this one keeps both."""
        same = swarm.swarm_id == self.swarm.swarm_id
        invites = self.state.invites if same else {}
        tokens = self.state.tokens if same else {}
        removed = set(removed if removed is not None else self.state.removed)
        members = {n: t for n, t in self.state.members.items() if n not in removed} if same else {}
        self.state = MembershipState(swarm, dict(invites), dict(tokens), removed, members)
        if not same:
            self.refusals.clear()
            self.refused_addrs.clear()
        await self.async_save()

    async def async_save(self) -> None:
        """Write swarm.json: a snapshot taken now, on the loop, written in order off it."""
        if self.state.swarm.is_open:
            return
        snapshot = self.state.to_json()
        async with self._save_lock:
            await asyncio.get_running_loop().run_in_executor(None, write_json, self.data_dir, snapshot)


@dataclass(frozen=True)
class Admission:
    """How a link's admission ended: "member" (serve it), "welcomed" (we admitted a joiner: close
    the link, it dials again as a member) or "joined" (we hold the inviter's swarm now: close)."""

    kind: str
    swarm: Swarm | None = dataclasses.field(default=None, repr=False)
    removed: frozenset[str] = frozenset()  # with "joined": the swarm's removed members


REMOVED_TEXT = "this node was removed from the swarm: an invite cannot bring it back under the same node identity"


def _refuse(stream: Stream, reason: str) -> None:
    stream.writelines(encode_frame(Frame(FrameType.ERROR, ErrorInfo("not_a_member", reason).to_header())))


async def async_admit(stream: Stream, membership: Membership, *, me: str, peer: str, my_nonce: str,
                      hello: Hello, join_token: bytes | None, timeout_s: float) -> Admission:
    """Run admission on a stream whose HELLOs are exchanged. Raises NotAMember (by_us: we refused
    the peer, after telling it) or ProtocolError; the caller closes the stream on any exception."""
    try:
        return await _async_admit(stream, membership, me=me, peer=peer, my_nonce=my_nonce, hello=hello,
                                  join_token=join_token, timeout_s=timeout_s)
    except (NotAMember, ProtocolError, TimeoutError, ConnectionError, asyncio.IncompleteReadError):
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a malformed frame, never a crash
        raise ProtocolError(f"malformed admission: {type(exc).__name__}") from exc


async def _async_admit(stream: Stream, membership: Membership, *, me: str, peer: str, my_nonce: str,
                       hello: Hello, join_token: bytes | None, timeout_s: float) -> Admission:
    swarm = membership.swarm
    async with asyncio.timeout(timeout_s):
        if join_token is not None:  # we are joining the peer's swarm with an invite
            _check_worth_joining(swarm, hello)  # before the token goes: a refused join leaves the code open
            proof = join_proof(join_token, me, peer, my_nonce, hello.member_nonce)
            stream.writelines(encode_frame(Frame(FrameType.MEMBER, {"op": "join", "proof": proof})))
            answer = await _read_member(stream, peer, hello.swarm)
            if answer.get("op") != "welcome":
                raise ProtocolError(f"expected a welcome, got {answer.get('op')!r}")
            welcome = Swarm.from_json(answer.get("swarm"))
            if welcome.is_open or welcome.public_id != hello.swarm:
                raise ProtocolError("the inviter handed over a swarm other than the one it is in")
            removed = answer.get("removed")
            if not isinstance(removed, list) or not all(is_node_id(r) for r in removed) or len(removed) > REMOVED_MAX:
                raise ProtocolError("welcome 'removed' must be a list of node ids")
            return Admission("joined", welcome, frozenset(removed))
        if hello.joining:  # the peer presents an invite of ours
            answer = await _read_member(stream, peer, hello.swarm)
            if peer in membership.state.removed:  # by its node id: no invite brings it back
                _refuse(stream, REMOVED_TEXT)
                raise NotAMember("removed from this swarm", node_id=peer, swarm=hello.swarm, by_us=True)
            if answer.get("op") != "join" or swarm.is_open or \
                    not membership.take_invite(answer.get("proof"), peer, me, hello.member_nonce, my_nonce):
                _refuse(stream, "the invite is not valid here (used, expired, or for another swarm)")
                raise NotAMember("presented no valid invite", node_id=peer, swarm=hello.swarm, by_us=True)
            await membership.async_save()  # the invite is used up on disk before the secret leaves
            # the swarm as it is now: a rotation that came in while the join frame or the save was
            # awaited is what the joiner needs (2026-12-07: it got the secret of before, and every
            # member refused it as one that missed a rotation, its invite used up)
            if membership.swarm.swarm_id != swarm.swarm_id:  # this node left or joined another meanwhile
                _refuse(stream, "the invite is not valid here (used, expired, or for another swarm)")
                raise NotAMember("presented an invite of a swarm this node left", node_id=peer, swarm=hello.swarm,
                                 by_us=True)
            swarm = membership.swarm
            stream.writelines(encode_frame(Frame(FrameType.MEMBER, {
                "op": "welcome", "swarm": swarm.to_json(), "removed": sorted(membership.state.removed)})))
            return Admission("welcomed", swarm)
        if hello.swarm != swarm.public_id or peer in membership.state.removed:
            removed = peer in membership.state.removed
            # a removed node is told so (2026-12-07: it heard "serves only the members of its swarm" from
            # a member of the swarm its status still named as its own, and no one said why)
            _refuse(stream, REMOVED_TEXT if removed else "this node serves only the members of its swarm")
            why = "removed from this swarm" if removed else "in another swarm"
            raise NotAMember(why, node_id=peer, swarm=hello.swarm, by_us=True)
        stream.writelines(encode_frame(Frame(FrameType.MEMBER, {
            "op": "proof", "proof": swarm.proof(me, peer, my_nonce, hello.member_nonce)})))
        answer = await _read_member(stream, peer, hello.swarm)
        if answer.get("op") != "proof" or hello.epoch != swarm.epoch or not swarm.verify(
                answer.get("proof"), peer, me, hello.member_nonce, my_nonce):
            if hello.epoch > swarm.epoch:  # the peer holds a later rotation: we are the one out of date
                why = (f"holds a newer swarm secret (epoch {hello.epoch}, ours {swarm.epoch}): this node missed "
                       "a rotation and needs a new invite")
            elif hello.epoch < swarm.epoch:  # (2026-12-07: "an older or newer" one, though which was known)
                why = f"holds an older swarm secret (epoch {hello.epoch}, ours {swarm.epoch})"
            else:
                why = "bad membership proof"
            _refuse(stream, "membership proof refused")
            raise NotAMember(why, node_id=peer, swarm=hello.swarm, by_us=True)
        return Admission("member", swarm)


def _check_worth_joining(swarm: Swarm, hello: Hello) -> None:
    """InvalidRequest when joining the inviter's swarm would change nothing or take this node back:
    it holds that swarm's current secret already, or a later one (the inviter missed a rotation).
    2026-12-07: a member given a code of its own swarm used it up (the device it was for was then
    refused) and closed every link of its own, requests in flight included; a code from a member
    that missed a rotation took the joiner back to the old secret, cut off from the others."""
    if swarm.is_open or hello.swarm != swarm.public_id or hello.epoch > swarm.epoch:
        return  # another swarm, or a rotation this node missed: the join brings it in
    if hello.epoch == swarm.epoch:
        raise InvalidRequest("this node is a member of that device's swarm already: the code was not presented "
                             "(if it is still valid, another device can use it)", param="code")
    raise InvalidRequest(f"that device missed a rotation of this node's swarm (its epoch {hello.epoch}, ours "
                         f"{swarm.epoch}) and holds an old secret: the code was not presented; to bring it back, "
                         "run `swarmllm invite` here, then `swarmllm join CODE` on it", param="code")


async def _read_member(stream: Stream, peer: str, peer_swarm: str) -> dict:
    frame = await async_read_frame(stream, const.HANDSHAKE_FRAME_MAX_BYTES)
    if frame.type == FrameType.ERROR:
        info = ErrorInfo.from_frame(frame)
        if info.code == "not_a_member":
            raise NotAMember(f"refused us: {info.message}", node_id=peer, swarm=peer_swarm, by_us=False)
        # (the peer's words, kept as the link's last_error and shown by the admin API and the GUI:
        # one line, bounded, as a refusal's reason is)
        raise ProtocolError(f"peer answered admission with ERROR {clean_text(info.code, 64)}: "
                            f"{clean_text(info.message, const.REFUSAL_REASON_MAX_CHARS)}")
    if frame.type != FrameType.MEMBER:
        raise ProtocolError(f"expected MEMBER during admission, got {type_name(frame.type)}")
    return dict(frame.header)
