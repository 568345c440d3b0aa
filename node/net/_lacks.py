"""Frame types a peer does not serve (an older version): refused with a typed ERROR, remembered.

A node answers a frame type it has no handler for with ERROR `unsupported_frame_type`. Since
2026-12-07 that ERROR says which type (`frame_type`) and echoes the refused frame's session id
(`sid`, the pipeline's request id) or its request id (the frame's own, as every ERROR reply); a
node before that sent only the code and a message. The asker remembers per peer process (node id
and HELLO `boot_id`: a restarted, maybe updated, peer is asked again) which types it lacks, and
tells its listeners (the pipeline's askers: remote embeddings, remote generation), which fail what
waits on that peer for such a frame at once and stop choosing it for that kind of request. An old
ERROR names no type: the listeners get None and attribute it (`refuses`) to their own outstanding
frames to that peer whose type it has not shown it serves (`knows`: it answered one this boot). An
honest peer of this version always names the type.

Only the types this node sends that an older peer may refuse (`REFUSABLE`) are kept, for at most
`PEER_LACKS_MAX` peer processes, the least recently noted going first: any peer could name any type
0-255 and a client churning identities left a table entry each until the peer table forgot it
(2026-12-07, review r27).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from node import const
from node.logs import kv

from ._frames import Frame, FrameType, type_name
from ._link import PeerLink
from ._messages import ErrorInfo

log = logging.getLogger(__name__)

UNSUPPORTED = "unsupported_frame_type"
_MAX_SID = 256  # an echoed sid longer than this is left out (sids are ~40 characters)

# the frame types this node sends that a peer of an older version may not serve, each with the one
# that cancels it (remote generation, 2026-12-02; remote embeddings, 2026-12-06): the only ones whose
# refusal is remembered or told (an asker waits on no other)
_CANCELS: dict[int, int] = {FrameType.GENERATE: FrameType.GENERATE_CANCEL, FrameType.EMBED: FrameType.EMBED_CANCEL}
REFUSABLE: frozenset[int] = frozenset({*_CANCELS, *_CANCELS.values()})

# callback(node_id, frame_type or None (an old peer's ERROR, naming none))
LackListener = Callable[[str, "int | None"], None]


def refuse_unsupported(link: PeerLink, frame: Frame) -> None:
    """Answer a frame whose type this node does not serve: ERROR naming the type and echoing
    the frame's sid (a pipeline frame's request id; the frame's request id rides as any reply's)."""
    header: dict[str, Any] = ErrorInfo(
        UNSUPPORTED, f"frame type {type_name(frame.type)} is not served by this node").to_header()
    header["frame_type"] = int(frame.type)
    sid = frame.header.get("sid")
    if isinstance(sid, str) and 0 < len(sid) <= _MAX_SID:
        header["sid"] = sid
    link.send_error(frame, UNSUPPORTED, header["message"], extra=header)


def _refused_type(header: Any) -> int | None:
    value = header.get("frame_type")
    return value if type(value) is int and 0 <= value <= 255 else None


class PeerLacks:
    """Which frame types each peer process does not serve, and who is told when one is found."""

    def __init__(self, boot_of: Callable[[str], str | None]):
        self._boot_of = boot_of  # node id -> the boot_id of its live link's HELLO (None: no link)
        # node id -> (boot_id, types it lacks / answered), least recently noted first
        self._lacks: OrderedDict[str, tuple[str, set[int]]] = OrderedDict()
        self._knows: OrderedDict[str, tuple[str, set[int]]] = OrderedDict()
        self._listeners: list[LackListener] = []

    def subscribe(self, listener: LackListener) -> Callable[[], None]:
        """Be told of every `unsupported_frame_type` ERROR a peer sends (on the loop; must not block)."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _types(self, table: dict[str, tuple[str, set[int]]], node_id: str) -> set[int] | None:
        boot = self._boot_of(node_id)
        entry = table.get(node_id)
        if boot is None or entry is None:
            return None
        if entry[0] != boot:  # another process of that peer: what the old one lacked says nothing
            del table[node_id]
            return None
        return entry[1]

    def _add(self, table: OrderedDict[str, tuple[str, set[int]]], node_id: str, frame_type: int) -> bool:
        boot = self._boot_of(node_id)
        if boot is None or int(frame_type) not in REFUSABLE:
            return False
        types = self._types(table, node_id)
        if types is None:
            types = set()
            table[node_id] = (boot, types)
            while len(table) > const.PEER_LACKS_MAX:
                table.popitem(last=False)
        table.move_to_end(node_id)
        if frame_type in types:
            return False
        types.add(int(frame_type))
        return True

    def lacks(self, node_id: str, frame_type: int) -> bool:
        """Whether this peer's process refused `frame_type` as unsupported."""
        types = self._types(self._lacks, node_id)
        return types is not None and int(frame_type) in types

    def knows(self, node_id: str, frame_type: int) -> bool:
        """Whether this peer's process has shown it serves `frame_type` (note_knows)."""
        types = self._types(self._knows, node_id)
        return types is not None and int(frame_type) in types

    def forget(self, node_id: str) -> None:
        """The peer table forgot the peer: what its process lacked or served goes too."""
        self._lacks.pop(node_id, None)
        self._knows.pop(node_id, None)

    def note_knows(self, node_id: str, frame_type: int) -> None:
        """The peer answered a frame of this type (its reply came): an old ERROR is not about it."""
        self._add(self._knows, node_id, frame_type)

    def refuses(self, node_id: str, refused: int | None, asked: int, waiting: bool) -> bool:
        """Whether a peer's `unsupported_frame_type` (naming `refused`, or None: a peer before
        2026-12-07) refuses the asker's `asked` type: named, when it is that type or its cancel;
        unnamed, when a frame of that type waits on the peer (`waiting`) and the peer has not
        answered one this boot (then it is remembered as lacking the type)."""
        if refused is not None:
            return refused in (asked, _CANCELS.get(asked))
        if not waiting or self.knows(node_id, asked):
            return False  # not about it: nothing waits, or it answered one before
        self.note_lacks(node_id, asked, f"an unnamed unsupported_frame_type with {type_name(asked)} waiting")
        return True

    def note_lacks(self, node_id: str, frame_type: int, why: str = "") -> None:
        """Remember that this peer's process does not serve `frame_type` (said once, at INFO)."""
        if self._add(self._lacks, node_id, frame_type):
            log.info("DIAG: peer does not serve a frame type, not sent it again until it restarts %s", kv(
                peer_id=node_id[:8], type=type_name(frame_type), boot_id=self._boot_of(node_id), why=why or None))

    def on_error(self, link: PeerLink, frame: Frame) -> None:
        """An ERROR frame that is no reply anyone waits on: logged; `unsupported_frame_type` is
        remembered (when it names the type) and handed to the listeners."""
        info = ErrorInfo.from_frame(frame)
        if info.code != UNSUPPORTED:
            log.info("DIAG: peer reported an error %s", kv(peer_id=link.short_id, code=info.code,
                                                          message=info.message))
            return
        refused = _refused_type(frame.header)
        if refused is not None and refused not in REFUSABLE:  # never sent it: nothing waits, nothing to keep
            log.debug("DIAG: peer refused a frame type this node does not send it %s", kv(
                peer_id=link.short_id, type=refused))
            return
        if refused is not None:
            self.note_lacks(link.node_id, refused, "unsupported_frame_type")
        else:
            log.info("DIAG: peer refused a frame type without naming it (a version before 2026-12-07) %s",
                     kv(peer_id=link.short_id, message=info.message))
        for listener in list(self._listeners):
            try:
                listener(link.node_id, refused)
            except Exception:  # noqa: BLE001 - one listener's bug must not hide the rest
                log.exception("unsupported_frame_type listener failed")


__all__ = ["REFUSABLE", "UNSUPPORTED", "LackListener", "PeerLacks", "refuse_unsupported"]
