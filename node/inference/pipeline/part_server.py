"""PartServer answers peers' MODEL_PART requests (frame 25) from this node's partial models
(node/models/partial) and, through wholeparts.WholeFileParts, from the whole files it shares:
`{sha256, op: "hashes", parts}` → payload JSON `{"tensors": {name: sha256}}` for the tensors of
those parts held complete and checked; `{sha256, op: "read", tensor, offset, n}` → those bytes
(n ≤ PARTIAL_PEER_CHUNK). A malformed request, an unknown model or a part not held is an ERROR
(the link stays).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from node import const
from node.errors import InvalidRequest, ModelNotFound, ModelUnavailable, Overloaded
from node.inference.pipeline.wholeparts import WholeFileParts, whole_file
from node.logs import MESSAGE, kv
from node.models.catalog import ModelCatalog
from node.models.header import read_range
from node.models.partial import PartialStore
from node.net import Frame, FrameType
from node.values import is_int, is_sha256

log = logging.getLogger(__name__)

_SERVE_PER_LINK = 2 * const.PARTIAL_PEER_WINDOW  # MODEL_PART requests served at once for one peer
_SERVE_UNSENT_MAX = 2 * const.PARTIAL_PEER_WINDOW * const.PARTIAL_PEER_CHUNK  # a link's unsent bytes: no more reads
_PART = re.compile(r"(layer-\d{4}|embd|head|globals)")



class PartServer:
    """Answers MODEL_PART requests from this node's partial models (see the module doc)."""

    def __init__(self, catalog: ModelCatalog, *, contributing: Callable[[], bool] = lambda: True,
                 shares_whole: Callable[[str], bool] = lambda _sha: True):
        self.catalog = catalog
        # whole files are handed out only while contributing, and only those this node advertises
        # (loaded, or listed in its HELLO's `files`); a paused node's are refused `not_contributing`
        self.contributing, self.shares_whole = contributing, shares_whole
        self._serving: dict[int, int] = {}  # id(link) -> requests being served for it
        self.whole = WholeFileParts()  # the same requests, answered from whole files

    async def async_handle(self, link: Any, frame: Frame) -> Frame:
        """One request; a peer asking more than a client's window at once, or not reading what it
        asked (its link's unsent bytes over the cap), is told so (`overloaded`) before anything is read:
        what one peer can make this node hold is bounded."""
        key = id(link)
        if self._serving.get(key, 0) >= _SERVE_PER_LINK or getattr(link, "unsent", 0) > _SERVE_UNSENT_MAX:
            raise Overloaded(f"more than {_SERVE_PER_LINK} MODEL_PART requests at once, or replies not read")
        self._serving[key] = self._serving.get(key, 0) + 1
        try:
            return await self._async_answer(link, frame)
        finally:
            left = self._serving.pop(key) - 1
            if left:
                self._serving[key] = left

    async def _async_answer(self, link: Any, frame: Frame) -> Frame:
        h = frame.header
        sha, op = h.get("sha256"), h.get("op")
        if not is_sha256(sha):
            raise InvalidRequest("MODEL_PART needs 'sha256': 64 lower-case hex digits")
        if op not in ("hashes", "read"):
            raise InvalidRequest("MODEL_PART 'op' must be 'hashes' or 'read'")
        entry = self.catalog.by_sha(sha)
        whole = whole_file(entry, sha)  # (wholeparts.whole_file says which)
        if entry is None or (entry.partial is None and not (whole and self.shares_whole(sha))):
            raise ModelNotFound(f"no partial model or file {sha[:16]} served on this node")
        if whole and not self.contributing():
            raise ModelUnavailable("this node has paused contributing to the swarm", code="not_contributing")
        if op == "hashes":
            parts = h.get("parts")
            if not isinstance(parts, list) or len(parts) > 4 * 4096 or \
                    not all(isinstance(p, str) and _PART.fullmatch(p) for p in parts):
                raise InvalidRequest("MODEL_PART hashes needs 'parts': a list of part names")
            if whole:
                return await self.whole.async_hashes(link, frame, entry, parts)
        elif op == "read" and whole:
            return await self.whole.async_read(link, frame, entry, h.get("tensor"), h.get("offset"), h.get("n"))
        manifest = entry.partial
        assert manifest is not None
        served = manifest.complete - manifest.unchecked  # only bytes this node checked against the origin
        if op == "hashes":
            wanted = set(parts) & served
            tensors = {t.name: t.sha256 for t in manifest.tensors.values() if t.part in wanted and t.sha256}
            return frame.reply(FrameType.MODEL_PART, {"sha256": sha}, json.dumps({"tensors": tensors}).encode())
        name, offset, n = h.get("tensor"), h.get("offset"), h.get("n")
        t = manifest.tensors.get(name) if isinstance(name, str) else None
        if t is None or t.part not in served:
            raise ModelNotFound(f"tensor {str(name)[:64]!r} of {entry.id} is not held here")
        if not (is_int(offset) and is_int(n) and 0 <= offset and 0 < n <= const.PARTIAL_PEER_CHUNK
                and offset + n <= t.n_bytes):
            raise InvalidRequest(f"MODEL_PART read needs 0 <= offset, 0 < n <= {const.PARTIAL_PEER_CHUNK}, "
                                 f"offset + n <= {t.n_bytes}")
        path, at = PartialStore(entry.path).part_path(t.part), t.local + offset
        try:
            data = await asyncio.get_running_loop().run_in_executor(None, read_range, path, at, n)
        except OSError as exc:  # trimmed meanwhile
            raise ModelNotFound(f"tensor {name} of {entry.id} is not held here any more") from exc
        if len(data) != n:
            raise ModelNotFound(f"tensor {name} of {entry.id} is not held here any more")
        log.log(MESSAGE, "DIAG: served partial model bytes %s", kv(peer_id=getattr(link, "short_id", "?"), model=entry.id,
                                                                   tensor=name, offset=offset, bytes=n))
        return frame.reply(FrameType.MODEL_PART, {"sha256": sha, "tensor": name, "offset": offset}, data)
