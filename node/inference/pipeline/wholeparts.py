"""MODEL_PART answered from a model's whole file (a node that downloaded or was given the file).

A node holding a model's whole GGUF (catalog entry with a file, not partial, its id hash the sha256
the catalog computed over the file; loaded, or unloaded and downloaded from a public origin: nothing
of a loaded model is read, only the file and its catalogued header; public: download/public.py), while contributing, hands out
any tensor of it as a partial holder does its parts:
`hashes` names the sha256 of each tensor of the parts asked, hashed here off the loop from the file
and cached (per model, while the file's size and mtime stay); one request hashes at most
`PARTIAL_WHOLE_HASH_BYTES` of tensors not hashed yet, one hashing request at a time for the whole
node (one whose tensors are all hashed already answers at once): the parts not reached are left out
of the answer, and the asker asks again. The file gone meanwhile is `ModelNotFound`, and so is a file
whose size or mtime are no longer those the catalog hashed (overwritten in place: its tensors would be
another model's, answered under this id). `read` returns the bytes of
a tensor from the file. The per-link bounds are PartServer's (it calls this).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from node import const
from node.errors import InvalidRequest, ModelNotFound
from node.logs import MESSAGE, kv
from node.models.catalog import ModelEntry
from node.models.gguf_meta import TensorInfo
from node.models.header import read_range
from node.models.partial.layout import part_of
from node.net import Frame, FrameType
from node.values import is_int

log = logging.getLogger(__name__)

_HASH_BLOCK = 8 << 20  # bytes read at a time while hashing a tensor


def _hash_tensor(path: Path, at: int, n: int) -> str:
    """sha256 of n bytes of a file from `at` (blocking); ModelNotFound when the file is shorter."""
    digest, left = hashlib.sha256(), n
    with open(path, "rb") as fh:
        fh.seek(at)
        while left:
            block = fh.read(min(_HASH_BLOCK, left))
            if not block:
                raise ModelNotFound(f"{path.name} is shorter than its header says")
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def _stat_key(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _read_if_same(path: Path, at: int, n: int, hashed: tuple[int, int] | None) -> bytes | None:
    """n bytes of a file from `at`, or None when its (size, mtime_ns) are not `hashed` (blocking)."""
    if hashed is not None and _stat_key(path) != hashed:
        return None
    return read_range(path, at, n)


def whole_file(entry: ModelEntry | None, sha256: str) -> bool:
    """Whether a catalog entry is a whole file whose tensors may be handed out under this id: a file
    with every tensor here, its id hash the sha256 the catalog computed over it (a split model's hashes
    part 1 only, and its tensors lie in other files: not handed out)."""
    return entry is not None and entry.whole_ok and entry.sha256 == sha256 and entry.split_count < 2 \
        and not entry.changed


def held_files(catalog: Any) -> list[str]:
    """sha256 of the whole files in the catalog that came from a public origin (a download its
    downloader found anyone could fetch: no token needed, no signed or `user:pass@` URL, not a LAN
    host; download/public.py; the entry's origin_public), at most ADVERT_FILES_MAX, by model id; not
    a file the models folder's watch saw changed since it was hashed. A file the user gave
    (`--model PATH`, the GUI's Add, copied into models/) or a private or signed download (a private
    fine-tune, perhaps) is neither listed nor handed out while unloaded; a loaded model is handed
    out as before (advertised in `models`: the user chose to serve it). Until 2026-12-06 any
    download with an origin_url was, a private Hugging Face repo's too."""
    entries = sorted((e for e in list(catalog.entries.values())
                      if whole_file(e, e.sha256) and e.origin_url and e.origin_public),
                     key=lambda e: e.id)
    return list(dict.fromkeys(e.sha256 for e in entries))[:const.ADVERT_FILES_MAX]


class WholeFileParts:
    """Tensor hashes and bytes of the whole files in the catalog, for peers fetching layers."""

    def __init__(self) -> None:
        # model sha256 -> ((size, mtime_ns) of the file when hashed, tensor name -> sha256)
        self._hashes: dict[str, tuple[tuple[int, int], dict[str, str]]] = {}
        self._by_name: dict[str, dict[str, TensorInfo]] = {}  # model sha256 -> its tensors by name (reads)
        self._hashing = asyncio.Lock()  # one hashing request at a time for the whole node
        self._changed: set[str] = set()  # models whose file was found overwritten (logged once)

    def _tensors(self, entry: ModelEntry) -> dict[str, TensorInfo]:
        """Its tensors by name, made once per model (its sha256 fixes its header), not per 1 MiB read."""
        by_name = self._by_name.get(entry.sha256)
        if by_name is None:
            by_name = self._by_name[entry.sha256] = {t.name: t for t in entry.header.tensors}
        return by_name

    async def _async_stat(self, entry: ModelEntry) -> tuple[int, int]:
        """The file's (size, mtime_ns) now; ModelNotFound when it is gone, or is not the file the
        catalog hashed (overwritten in place: its tensors are another model's, not this id's)."""
        try:
            key = await asyncio.get_running_loop().run_in_executor(None, _stat_key, entry.path)
        except OSError as exc:  # deleted or moved while listed
            raise ModelNotFound(f"{entry.id}'s file is not here any more") from exc
        if entry.hashed_stat is not None and key != entry.hashed_stat:
            self._refuse_changed(entry)
        return key

    def _refuse_changed(self, entry: ModelEntry) -> None:
        if entry.sha256 not in self._changed:  # said once per model
            self._changed.add(entry.sha256)
            log.info("DIAG: whole model file changed on disk since it was hashed, not handed out %s",
                     kv(model=entry.id, path=entry.path))
        raise ModelNotFound(f"{entry.id}'s file changed on disk since it was hashed")

    async def async_hashes(self, link: Any, frame: Frame, entry: ModelEntry, parts: list[str]) -> Frame:
        loop = asyncio.get_running_loop()
        wanted = set(parts)
        todo = [t for t in entry.header.tensors if part_of(t.name) in wanted]
        cached = self._hashes.get(entry.sha256)
        hashed, reached = 0, wanted
        if cached is None or cached[0] != await self._async_stat(entry) or \
                any(t.name not in cached[1] for t in todo):  # (all hashed already: no wait on others' hashing)
            async with self._hashing:
                known, hashed, reached = await self._async_hash(entry, todo)
        else:
            known = cached[1]
        tensors = {t.name: known[t.name] for t in todo if part_of(t.name) in reached}
        log.debug("DIAG: whole model tensor hashes served %s", kv(
            peer_id=getattr(link, "short_id", "?"), model=entry.id, parts=len(reached), asked=len(wanted),
            hashed_mb=round(hashed / 1e6, 1)))
        payload = await loop.run_in_executor(None, lambda: json.dumps({"tensors": tensors}).encode())
        return frame.reply(FrameType.MODEL_PART, {"sha256": entry.sha256}, payload)

    async def _async_hash(self, entry: ModelEntry, todo: list[TensorInfo]) -> tuple[dict[str, str], int, set[str]]:
        """(tensor hashes known, bytes hashed now, the parts reached) within PARTIAL_WHOLE_HASH_BYTES."""
        loop = asyncio.get_running_loop()
        key = await self._async_stat(entry)
        cached = self._hashes.get(entry.sha256)
        known = cached[1] if cached is not None and cached[0] == key else {}
        budget, hashed, reached = const.PARTIAL_WHOLE_HASH_BYTES, 0, set()
        by_part: dict[str, list[TensorInfo]] = {}
        for t in todo:
            by_part.setdefault(part_of(t.name), []).append(t)
        try:
            for part, tensors in by_part.items():
                cost = sum(t.n_bytes for t in tensors if t.name not in known)
                if cost and hashed and hashed + cost > budget:
                    continue  # the next request (a part larger than the budget alone is hashed whole)
                for t in tensors:
                    if t.name not in known:
                        known[t.name] = await loop.run_in_executor(
                            None, _hash_tensor, entry.path, entry.header.data_offset + t.offset, t.n_bytes)
                hashed += cost
                reached.add(part)
        except OSError as exc:  # deleted or moved meanwhile
            raise ModelNotFound(f"{entry.id}'s file is not here any more") from exc
        finally:
            self._hashes[entry.sha256] = (key, known)
        return known, hashed, reached

    async def async_read(self, link: Any, frame: Frame, entry: ModelEntry, name: Any, offset: Any, n: Any) -> Frame:
        t = self._tensors(entry).get(name) if isinstance(name, str) else None
        if t is None:
            raise ModelNotFound(f"tensor {str(name)[:64]!r} is not a tensor of {entry.id}")
        if not (is_int(offset) and is_int(n) and 0 <= offset and 0 < n <= const.PARTIAL_PEER_CHUNK
                and offset + n <= t.n_bytes):
            raise InvalidRequest(f"MODEL_PART read needs 0 <= offset, 0 < n <= {const.PARTIAL_PEER_CHUNK}, "
                                 f"offset + n <= {t.n_bytes}")
        try:
            data = await asyncio.get_running_loop().run_in_executor(
                None, _read_if_same, entry.path, entry.header.data_offset + t.offset + offset, n, entry.hashed_stat)
        except OSError as exc:  # the file went meanwhile
            raise ModelNotFound(f"{entry.id}'s file is not here any more") from exc
        if data is None:  # overwritten in place: another model's bytes
            self._refuse_changed(entry)
        if len(data) != n:
            raise ModelNotFound(f"{entry.id}'s file is shorter than its header says")
        log.log(MESSAGE, "DIAG: served whole model bytes %s", kv(peer_id=getattr(link, "short_id", "?"),
                                                                 model=entry.id, tensor=name, offset=offset, bytes=n))
        return frame.reply(FrameType.MODEL_PART, {"sha256": entry.sha256, "tensor": name, "offset": offset}, data)

