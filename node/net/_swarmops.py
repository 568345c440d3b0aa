"""What a person does with a swarm: invite a device, join a swarm, leave it, remove a member.

- invite: a one-time token (saved in swarm.json) in a short code with this node's addresses;
- join: dial the inviter, present the token instead of a membership proof, receive the swarm over
  that TLS link, adopt it (swarm.json), drop every link of the old swarm and dial in again as a
  member;
- leave: a new private swarm of one;
- remove: rotate the secret (epoch + 1), hand the new one to every member linked now (MEMBER
  "rekey" over their authenticated links), close the removed node's links. A removed node is
  refused by id, and its old secret fails everywhere the rotation reached. A member that was
  offline during a rotation holds the old epoch and needs a new invite.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from node import const
from node.errors import AdmissionEnded, InvalidRequest, NotAMember, PeerError, PeerUnreachable, ProtocolError
from node.logs import kv

from ._admission import Admission, Membership
from ._connect import Establish, async_dial_first
from ._discovery import Discovery
from ._frames import Frame, FrameType
from ._identity import is_node_id, short_id
from ._invite import InviteCode
from ._link import PeerLink
from ._membership import REMOVED_MAX, Swarm, bounded_removed
from ._table import PeerTable
from ._tasks import Tasks
from ._tls import TlsConfig

log = logging.getLogger(__name__)


class SwarmOps:
    """Invite / join / leave / remove, and the rekey frames that follow a removal."""

    def __init__(self, node_id: str, membership: Membership, table: PeerTable, tasks: Tasks,
                 discovery: Discovery, tls: TlsConfig, establish: Establish,
                 live_links: Callable[[], list[PeerLink]], listen_addresses: Callable[[], list[str]],
                 all_links: Callable[[], list[PeerLink]] | None = None):
        self._node_id = node_id
        self._membership = membership
        self._table = table
        self._tasks = tasks
        self._discovery = discovery
        self._tls = tls
        self._establish = establish
        self._live_links = live_links
        self._all_links = all_links or live_links  # retiring duplicates too: they still serve frames
        self._listen_addresses = listen_addresses
        self.joined_via: str | None = None  # set by a successful join (the inviter's address)

    # --- status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What the report, the admin API and the GUI show (never the secret, never a code)."""
        swarm = self._membership.swarm
        now = time.time()
        linked = {link.node_id for link in self._live_links()}
        return {
            "swarm": swarm.public_id, "open": swarm.is_open, "epoch": swarm.epoch,
            "members_connected": len(self._live_links()),
            "invites_open": sum(1 for i in self._membership.state.invites.values() if i.expires_at > now),
            "removed": len(self._membership.state.removed),
            "refused": [{"peer": short_id(r.node_id), "node_id": r.node_id, "by_us": r.by_us, "swarm": r.swarm,
                         "count": r.count, "last_s_ago": round(now - r.last_at, 1), "reason": r.reason,
                         "hint": r.hint, "error": r.describe()}
                        for r in self._membership.refusals.values()],
            # the roster, most recently linked first (a lost device is removed by its id from here)
            "members": [{"peer": short_id(n), "node_id": n, "connected": n in linked,
                         "last_linked_s_ago": round(max(0.0, now - seen), 1)}
                        for n, seen in sorted(self._membership.state.roster().items(), key=lambda i: -i[1])],
        }

    # --- invite -------------------------------------------------------------------------------

    async def async_invite(self, ttl_s: float | None = None) -> tuple[str, float]:
        """A new invite code and when it expires (epoch seconds)."""
        if self._membership.swarm.is_open:
            raise InvalidRequest("this node is in the open swarm: anyone who opted in links without an invite")
        addrs = self._listen_addresses()
        if not addrs:
            raise InvalidRequest("the peer listener is not running; start the node first")
        token, invite = await (self._membership.async_create_invite() if ttl_s is None
                               else self._membership.async_create_invite(ttl_s))
        code = InviteCode(token, self._node_id[:16], tuple(addrs)).encode()
        log.info("DIAG: invite created %s", kv(swarm=self._membership.swarm.public_id,
                                               expires_in_s=round(invite.expires_at - time.time())))
        return code, invite.expires_at

    # --- join ---------------------------------------------------------------------------------

    def _refuse_if_configured_open(self, what: str) -> None:
        """A node configured into the open swarm (--open-swarm, swarm = "open") is there again at
        every start: a join or a leave would last until the next restart only."""
        if self._membership.open_swarm:
            raise InvalidRequest(f"this node is configured into the open swarm (--open-swarm or swarm = \"open\" "
                                 f"in its config): restart it without that to {what}")

    async def async_join(self, code: str) -> str:
        """Join the swarm of the node that made `code`; returns the new swarm's public id."""
        self._refuse_if_configured_open("join a private swarm")
        invite = InviteCode.decode(code)
        if self._node_id.startswith(invite.inviter_prefix):
            raise InvalidRequest("this code was made by this node: run the join on the device to add", param="code")
        errors: list[str] = []
        addrs = list(invite.addrs)
        while addrs:  # racing: an inviter's docker bridge or VPN address first costs no connect timeout
            won, failures = await async_dial_first(self._tls, addrs, None)
            errors += [exc.message if addr in exc.message else f"{addr}: {exc.message}" for addr, exc in failures]
            if won is None:
                break
            addr, stream, proven = won
            tried = {addr, *(a for a, _ in failures)}
            addrs = [a for a in addrs if a not in tried]
            if not proven.startswith(invite.inviter_prefix):
                stream.abort()
                errors.append(f"{addr}: another node answers there ({short_id(proven)})")
                continue
            try:
                await self._establish(stream, proven, is_dialer=True, transport="direct", address=addr,
                                      source="invite", join_token=invite.token)
            except AdmissionEnded:
                return self._membership.swarm.public_id
            except NotAMember as exc:
                raise InvalidRequest(f"the inviter refused the invite: {exc.message}", param="code") from exc
            except PeerError as exc:
                errors.append(f"{addr}: {exc.message}")
                continue
            raise ProtocolError("the inviter admitted us as a member without handing over its swarm")
        raise PeerUnreachable("could not reach the inviter: " + "; ".join(errors or ["no address in the code"]))

    async def async_admission_ended(self, admission: Admission, peer: str, address: str) -> None:
        """A link's admission handed a swarm over: we joined (adopt it), or a joiner got ours."""
        if admission.kind == "welcomed":
            self._membership.refusals.pop(peer, None)  # a member from now on (it dials in again)
            log.info("DIAG: a node joined this swarm with an invite %s",
                     kv(peer_id=short_id(peer), swarm=self._membership.swarm.public_id))
            return
        assert admission.kind == "joined" and admission.swarm is not None
        old = self._membership.swarm.public_id
        await self._async_switch(admission.swarm, removed=set(admission.removed), why="joined")
        self.joined_via = address
        rec = self._table.record(peer, "invite")
        rec.add_addr(address, front=True)
        self._discovery.dialer.dial_soon(rec)
        log.info("DIAG: joined a swarm with an invite %s", kv(
            swarm=admission.swarm.public_id, left=old, inviter=short_id(peer), addr=address))

    # --- leave --------------------------------------------------------------------------------

    async def async_leave(self) -> str:
        """Leave this swarm: a new private swarm of one (every link closes)."""
        self._refuse_if_configured_open("leave the open swarm")
        old = self._membership.swarm.public_id
        swarm = Swarm.create()
        await self._async_switch(swarm, removed=set(), why="left")
        log.info("DIAG: left the swarm %s", kv(left=old, swarm=swarm.public_id))
        return swarm.public_id

    async def _async_switch(self, swarm: Swarm, *, removed: set[str], why: str) -> None:
        await self._membership.async_adopt(swarm, removed=removed)
        # async_adopt keeps the refusals when the swarm id stays, as a rotation must; a join of
        # the same swarm (a member back after a rotation it missed) is no rotation: the members
        # it was refused by, or refused, under its old epoch are worth a try again
        self._membership.refusals.clear()
        self._membership.refused_addrs.clear()
        for link in self._all_links():
            link.close(f"{why} swarm")
        for rec in self._table:  # refusals were about the old swarm: everyone is worth a try again
            if rec.state == "refused":
                rec.state = "gone"
                rec.next_dial_at = 0.0
                self._table.emit_changed(rec)
        await self._discovery.async_swarm_changed()
        self._discovery.dialer.wake()

    # --- remove a member ----------------------------------------------------------------------

    async def async_remove(self, node_id: str) -> int:
        """Remove a member: rotate the secret, hand it to the members linked now, close the removed
        node's links. Returns how many members got the new secret."""
        swarm = self._membership.swarm
        if swarm.is_open:
            raise InvalidRequest("an open swarm has no members to remove")
        if not is_node_id(node_id):
            # known peers and the roster: a device lost long ago has left the peer table
            known = {r.node_id for r in self._table} | set(self._membership.state.roster())
            matches = [n for n in known if n.startswith(node_id)] if node_id else []
            if len(matches) != 1:
                raise InvalidRequest(f"{node_id!r} is not a node id (or a prefix of exactly one known peer or "
                                     f"member: `swarmllm swarm` lists them)", param="node_id")
            node_id = matches[0]
        if node_id == self._node_id:
            raise InvalidRequest("to leave the swarm yourself, use leave", param="node_id")
        if node_id in self._membership.state.removed:
            # 2026-12-07: removing it again rotated the secret again, for nothing, and every member away
            # at that moment came back with an old secret and needed a new invite
            raise InvalidRequest(f"{short_id(node_id)} was removed from this swarm already: nothing changed (the "
                                 "secret was not rotated again)", param="node_id")
        try:
            rotated = swarm.rotated()
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc
        removed = bounded_removed(self._membership.state.removed, {node_id}, keep=frozenset({node_id}))
        if not any(link.node_id not in removed for link in self._live_links()):
            # the members known: the peer table's, and the roster's linked lately (the table forgets
            # a peer an hour after it went, and holds nothing after a restart)
            lately = time.time() - const.ROSTER_AWAY_S
            known = {rec.node_id for rec in self._table} | {
                n for n, seen in self._membership.state.roster().items() if seen >= lately}
            away = [short_id(n) for n in known if n not in removed and n != self._node_id
                    and not self._membership.is_refused(n)]
            if away:  # the new secret would reach no one: this node, not the removed one, would be out
                raise InvalidRequest(
                    f"no other member is connected now (away: {', '.join(sorted(away)[:5])}): the new "
                    "secret would reach none of them, and this node would be the one cut off from the "
                    "swarm; remove it while this node is linked to another member", param="node_id")
        self._close_removed(removed)  # before anything can wait: no frame reaches them again
        self._retry_members(removed)
        told = self._send_rekey(rotated, removed, skip=None)
        await self._membership.async_adopt(rotated, removed=removed)
        await self._discovery.async_swarm_changed()  # the mDNS tag follows the secret
        log.info("DIAG: member removed, swarm secret rotated %s",
                 kv(peer_id=short_id(node_id), swarm=rotated.public_id, epoch=rotated.epoch, members_told=told))
        return told

    def handle_frame(self, link: PeerLink, frame: Frame) -> None:
        """MEMBER frames on an admitted link: a rekey from another member."""
        if frame.header.get("op") != "rekey":
            link.send_error(frame, "unsupported", "only rekey is served on an admitted link")
            return
        rotated = Swarm.from_json(frame.header.get("swarm"))
        removed = frame.header.get("removed")
        if not isinstance(removed, list) or not all(is_node_id(r) for r in removed) or len(removed) > REMOVED_MAX:
            raise ProtocolError("rekey 'removed' must be a list of node ids")
        # past the bound the ids no one here knows go first: a hostile member's made-up ids must not push
        # out a real removal (review r61: the member removing it was itself kept, and got the new secret)
        keep = self._known(set(removed) | self._membership.state.removed)
        if not self._newer(rotated):
            all_removed = bounded_removed(self._membership.state.removed, set(removed) - {self._node_id}, keep)
            news = all_removed - self._membership.state.removed
            if rotated.swarm_id == self._membership.swarm.swarm_id and news:
                # a rotation that lost the tie-break still removed someone: keep the removal (at most
                # REMOVED_MAX kept, bounded_removed)
                self._membership.state.removed = all_removed
                self._close_removed(all_removed)
                self._send_rekey(self._membership.swarm, all_removed, skip=link.node_id)
                self._tasks.spawn(self._membership.async_save(), name="swarm-save")
            log.debug("DIAG: rekey not adopted %s", kv(peer_id=link.short_id, epoch=rotated.epoch,
                                                      ours=self._membership.swarm.epoch, removed_new=len(news)))
            return
        if self._node_id in removed:
            return  # we are the one removed: the links close from the other side
        all_removed = bounded_removed(self._membership.state.removed, set(removed), keep)
        # adopt now, on the loop (a second rekey then compares with this one), close the removed
        # nodes' links, pass it on (members not linked to the remover get it too), save
        self._membership.state = dataclasses.replace(self._membership.state, swarm=rotated,
                                                     removed=all_removed)
        self._close_removed(all_removed)
        self._retry_members(all_removed)
        self._send_rekey(rotated, all_removed, skip=link.node_id)
        self._tasks.spawn(self._async_after_rekey(rotated, all_removed, link), name="swarm-rekey")

    def _retry_members(self, removed: set[str]) -> None:
        """At a rotation: the members refused (by us or by them) and not removed were refused across an
        epoch change (a link redialled while one side had the new secret and the other not yet): worth
        a try again. 2026-12-07, review r77: such a refusal stayed once both held the new secret, the
        dialers skipped each other for good, and a new invite (what the status advised) was refused
        as "a member of that swarm already"."""
        members = self._membership.state.members
        for node_id in [n for n in self._membership.refusals if n in members and n not in removed]:
            refusal = self._membership.refusals.pop(node_id)
            if refusal.address:  # (a dial by address skips a refused one: review r79)
                self._membership.refused_addrs.pop(refusal.address, None)
            rec = self._table.get(node_id)
            if rec is not None and rec.state == "refused":
                rec.state, rec.next_dial_at = "gone", 0.0
                self._table.emit_changed(rec)
        self._discovery.dialer.wake()

    def _known(self, node_ids: set[str]) -> frozenset[str]:
        """Of `node_ids`, those this node has met: its roster's members and its peer table's."""
        members = self._membership.state.members
        return frozenset(n for n in node_ids if n in members or self._table.get(n) is not None)

    def _newer(self, rotated: Swarm) -> bool:
        """Whether a rekey replaces our swarm: the same swarm, a later epoch; on two rotations of
        one epoch (two members removing at once) every node keeps the same one, the lower hash."""
        swarm = self._membership.swarm
        if rotated.swarm_id != swarm.swarm_id or rotated.secret is None or swarm.secret is None:
            return False
        if rotated.epoch != swarm.epoch:
            return rotated.epoch > swarm.epoch
        return hashlib.sha256(rotated.secret).digest() < hashlib.sha256(swarm.secret).digest()

    def _send_rekey(self, rotated: Swarm, removed: set[str], *, skip: str | None) -> int:
        frame = Frame(FrameType.MEMBER, {"op": "rekey", "swarm": rotated.to_json(), "removed": sorted(removed)})
        told = 0
        for link in self._live_links():
            if link.node_id in removed or link.node_id == skip:
                continue
            try:
                link.send_nowait(frame)
                told += 1
            except PeerError:
                pass
        return told

    async def _async_after_rekey(self, rotated: Swarm, removed: set[str], via: PeerLink) -> None:
        if self._membership.swarm is rotated:  # not replaced by a later rekey meanwhile
            await self._membership.async_adopt(rotated, removed=removed)
            await self._discovery.async_swarm_changed()  # the mDNS tag follows the secret
        log.info("DIAG: swarm secret rotated by a member %s",
                 kv(peer_id=via.short_id, epoch=rotated.epoch, removed=len(removed)))

    def _close_removed(self, removed: set[str]) -> None:
        # only the peers this node knows (its table, its roster): a made-up id was never met, and
        # each one logged a WARNING, 4,096 per rekey frame of a hostile member (2026-12-07)
        for node_id in self._known(removed):  # refused before its links close, so nothing redials it
            if not self._membership.is_refused(node_id):
                self._membership.note_refusal(NotAMember("removed from this swarm", node_id=node_id,
                                                         swarm=self._membership.swarm.public_id, by_us=True), None)
        for link in self._all_links():
            if link.node_id in removed:
                link.close("removed from the swarm")
        for node_id in removed:
            rec = self._table.get(node_id)
            if rec is not None:
                rec.state = "refused"
                rec.last_error = "removed from this swarm"
                self._table.emit_changed(rec)


JoinFn = Callable[[str], Awaitable[str]]
