"""PartialModels: the slice host's side of models given by URL (node/models/partial).

`async_open(url)` opens (or reuses) the partial model of a `--model URL` in models/; the slice
host calls `async_fetch(entry, start, end)` before it loads a slice of a partial model and
`async_trim(entry, ranges)` after it unloaded one (the parts no remaining range uses are
deleted). One fetch or trim at a time. The URL as given, with its query (a signed URL's
credentials), is kept here in memory only.

Where the missing tensors come from: first the peers whose advertised slices of the model cover
them (most layers first), each checked as node/models/partial/peers.py says (their hashes, one
range against the origin); a peer caught altering bytes is not asked again for that model. What
no peer gave comes from the origin. Parts kept unchecked (taken from a peer while the origin was
unreachable) are checked first whenever a fetch runs. Once the origin failed in a fetch (not read,
busy, another version), that fetch's later peer rounds take parts unchecked rather than wait for it
again under the lock; the next fetch checks them.

The answering side, PartServer (MODEL_PART requests from peers), is in part_server.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from node import const
from node.errors import (
    Conflict,
    DownloadFailed,
    NodeError,
    PeerError,
    SplitModelServedWhole,
)
from node.inference.pipeline.origin_urls import OriginUrls
from node.inference.weights.cache import WeightCache
from node.locks import KeyedLocks
from node.logs import kv, progress_extra
from node.models.catalog import ModelEntry
from node.models.download import file_name_for, resolve_url
from node.models.download.fetch import Retryable
from node.models.download.urls import describe_error, display_url
from node.models.partial import (
    PartialStore,
    SpotCheckFailed,
    async_fetch_parts,
    async_fetch_parts_from,
    async_open_partial,
    async_spot_check_held,
    origin_session,
    parts_for,
)
from node.models.partial.fromheader import async_adopt_origin, create_from_header
from node.models.partial.layout import dir_name, origin_identity
from node.models.partial.probe import Probe, async_probe
from node.net import Frame, FrameType
from node.values import is_sha256, loads_bounded

log = logging.getLogger(__name__)


class PartialModels:
    """Partial models' layers: opened, fetched before a slice loads, trimmed after an unload."""

    def __init__(self, models_dir: Path, weight_cache: WeightCache | None = None,
                 note: Callable[[str], None] = lambda _text: None):
        self.models_dir = models_dir
        self.weight_cache = weight_cache
        self.note = note  # a line for the node's activity list (the GUI's status)
        self._lock = asyncio.Lock()
        self._urls: dict[Path, str] = {}  # partial model directory -> the file URL as given (its query too)
        self.origins = OriginUrls(models_dir)  # a URL as given -> its file's URL (a Hugging Face repo looked up once)
        self._open_locks = KeyedLocks()  # one open at a time per directory
        # URL as given -> since when (epoch s): opens the start did not wait for (their origin not answering)
        self.opening: dict[str, float] = {}
        self.peers: Any = None  # PeerManager (async_request), once the node's network is up
        # (model sha256) -> [(node id, start, end)]: the peers' advertised slices of it
        self.holders: Callable[[str], list[tuple[str, int, int]]] = lambda _sha: []
        self.whole_holders: Callable[[str], list[str]] = lambda _sha: []  # peers holding its whole file
        self._distrusted: set[tuple[str, str]] = set()  # (model, node id): caught altering its bytes
        # (entry, parts) when parts already in use proved altered (the slice host drops their slices)
        self.on_dropped: Callable[[ModelEntry, list[str]], None] = lambda _entry, _parts: None

    def attach(self, peers: Any, holders: Callable[[str], list[tuple[str, int, int]]],
               whole_holders: Callable[[str], list[str]] = lambda _sha: []) -> None:
        """Fetch from peers too (the node calls this once its peer manager runs)."""
        self.peers, self.holders, self.whole_holders = peers, holders, whole_holders

    def directory_of(self, url: str) -> Path:
        """Where url's partial model lies (it may not exist yet; nothing read); a Hugging Face repo
        once looked up (`origins`), else an InvalidRequest."""
        resolved = resolve_url(self.origins.file_of(url) or url)
        return self.models_dir / dir_name(display_url(resolved), file_name_for(resolved, None))

    async def async_open(self, url: str, *, probed: tuple[str, Probe] | None = None) -> Path:
        """The directory of url's partial model (its header probed; nothing else fetched but the
        tiny `globals` part). DownloadFailed when the origin cannot be read and nothing is here. A
        Hugging Face repo is looked up first (origin_urls.py): its file is the origin kept.
        `probed`: (file URL, its probe) just read by the caller, not asked of the origin again."""
        url = await self.origins.async_file_of(url, held=lambda file: self.directory_of(file).exists())
        directory = self.directory_of(url)
        async with self._open_locks.hold(directory):  # two spellings of one file
            store, manifest = await async_open_partial(url, directory, forget=self._forget,
                                                       probed=probed[1] if probed and probed[0] == url else None)
        log.info("DIAG: partial model opened %s", kv(url=manifest.origin_url, dir=directory.name,
                                                     held=manifest.describe()))
        resolved_dir = await asyncio.get_running_loop().run_in_executor(None, store.dir.resolve)
        self._urls[resolved_dir] = url
        return resolved_dir

    async def async_open_swarm_model(self, entry: ModelEntry, origin: str | None) -> Path:
        """The partial model for "Help serve" of a model known here by the header a holder gave
        (`entry`), always under the swarm's id (its holders' whole-file sha256). Opened from `origin`
        only when that states this sha256 (the Hub's X-Linked-Etag); an origin stating no sha256 (a
        plain server, a release, S3) is not used for it at all: its header and size alone do not tie
        its bytes to the swarm's id (found in review 2026-12-07: a file replaced in place with the
        same header and size was served under the swarm's sha256, the honest holder distrusted), so
        its layers come from peers only, as when no origin is named — unless the swarm's id is this
        origin's own (derived from its header and size, `origin_identity`: the holders opened it from
        such an origin): then it is opened from it, the gap no peer holds filled only so. One stating
        another sha256 is a Conflict; nothing is made for it. An unreachable origin: peers, the origin
        named (as before)."""
        if not origin:
            log.warning("DIAG: model origin not usable, its layers come from peers only %s", kv(
                model=entry.id, error="its holders name no origin"))
            return await self.async_open_from_swarm(entry, None)
        try:
            url = await self.origins.async_file_of(origin, held=lambda file: self.directory_of(file).exists())
            async with asyncio.timeout(const.PARTIAL_HELD_PROBE_S), \
                    origin_session(aiohttp.ClientTimeout(
                        total=None, connect=const.DOWNLOAD_CONNECT_TIMEOUT_S)) as session:
                probe = await async_probe(url, session)
            data, _header, size, _validator, linked = probe
        except (aiohttp.ClientError, TimeoutError, DownloadFailed, Retryable) as exc:
            # no internet, an origin this node may not use, busy: peers give
            log.warning("DIAG: model origin not usable, its layers come from peers only %s", kv(
                model=entry.id, url=display_url(origin), error=getattr(exc, "message", None) or describe_error(exc)))
            return await self.async_open_from_swarm(entry, origin)
        if linked is None and entry.sha256 == origin_identity(hashlib.sha256(data).hexdigest(), size):
            # the swarm's id is this origin's own (derived from its header and size: the holders opened it
            # from such an origin too): its layers come from it as from any --model URL (a gap no peer
            # holds is filled only so; 2026-12-07: the no-sha rule above refused this too)
            return await self.async_open(origin, probed=(url, probe))
        if linked is None:
            log.info("DIAG: model origin states no sha256, not used for the swarm's model: its layers "
                     "come from peers only %s", kv(model=entry.id, url=display_url(origin)))
            return await self.async_open_from_swarm(entry, None)
        if linked != entry.sha256:
            raise Conflict(f"the file at {display_url(origin)} is another file now than the swarm's {entry.id} "
                           f"(its origin states another sha256, {linked[:16]}): its layers could not be "
                           "checked against it")
        # (its header read once: the open took a second 64 KiB+ probe of the origin, 2026-12-07)
        return await self.async_open(origin, probed=(url, probe))

    async def async_open_from_swarm(self, entry: ModelEntry, origin: str | None) -> Path:
        """A partial model of a model known here by the header a holder gave (`entry`, source
        `swarm`), when its origin cannot be read, none is named or it states no sha256: its layers
        come from peers only (node/models/partial/fromheader.py). The directory is the origin's when
        one is named (an open once it answers finds it), else one named after the model's id hash."""
        if origin:
            directory = self.directory_of(origin)
        else:
            directory = self.models_dir / dir_name(f"swarm:{entry.sha256}", f"{entry.name}.gguf")
        loop = asyncio.get_running_loop()
        data = await loop.run_in_executor(None, entry.header_path.read_bytes)
        resolved = await loop.run_in_executor(None, lambda: create_from_header(
            directory, data, entry.header, sha256=entry.sha256, header_sha256=entry.header_sha256,
            size_bytes=entry.size_bytes, origin_url=display_url(resolve_url(origin)) if origin else None))
        if origin:
            self._urls[resolved] = origin
        return resolved

    async def async_open_all(self, urls: list[str], *, later_ok: bool,
                             wait_s: float | None = None) -> tuple[set[Path], list[str], dict[str, asyncio.Task[Path]]]:
        """Open each URL's partial model, side by side: (their directories, the URLs whose origin
        could not be read with nothing of them here, when `later_ok` (else that DownloadFailed is
        raised), the opens still under way after `wait_s` (an origin that accepts and does not
        answer): the caller hands those to `async_open_pending`, the node starting without them)."""
        # one open per partial directory: two spellings of one URL would write it at once (found in review)
        firsts: dict[object, str] = {}  # (a repo not looked up yet: by its spelling; the open's lock does the rest)
        for url in urls:
            firsts.setdefault(self.directory_of(url) if self.origins.file_of(url) else url, url)
        tasks = {url: asyncio.create_task(self.async_open(url), name="open-model-url") for url in firsts.values()}
        dirs, later, pending = set(), [], {}
        try:
            if tasks:  # (in the try: a start cancelled while waiting cancels the opens too)
                await asyncio.wait(tasks.values(), timeout=wait_s)
            for url, task in tasks.items():
                if not task.done():
                    shown = self.origins.shown(url)
                    log.warning("DIAG: model origin slow to answer at start, opening it in the background %s",
                                kv(url=shown, waited_s=wait_s))
                    self.note(f"model {shown}: its origin has not answered yet; opening it in the background")
                    self.opening[url] = time.time()
                    pending[url] = task
                    continue
                try:
                    dirs.add(task.result())
                except DownloadFailed as exc:
                    if not later_ok:
                        raise
                    log.warning("DIAG: model URL unreachable at start, trying again in the background %s",
                                kv(error=exc.message))
                    later.append(url)
                    self.opening[url] = time.time()  # (waiting_on says so from the start on)
        except BaseException:  # the start fails: the other opens go with it
            for task in tasks.values():
                task.cancel()
            raise
        return dirs, later, pending

    async def async_open_pending(self, url: str, opening: asyncio.Task[Path],
                                 on_open: Callable[[Path], Awaitable[None]]) -> None:
        """An open that outlasted the start's wait (`async_open_all`): `on_open(directory)` once it
        ends; if it fails, opened again as `async_open_later` does."""
        shown = self.origins.shown(url)
        try:
            directory = await opening
        except DownloadFailed as exc:
            log.warning("DIAG: model URL unreachable at start, trying again in the background %s",
                        kv(url=shown, error=exc.message))
            await self.async_open_later(url, on_open)
            return
        except NodeError as exc:  # its header is no model (at start this stopped the node): said, not retried
            self.opening.pop(url, None)
            log.error("DIAG: model from URL cannot be served %s", kv(url=shown, error=exc.message))
            self.note(f"model {shown} cannot be served: {exc.message}")
            return
        except Exception as exc:  # noqa: BLE001 - a full disk, a bug: said, not "waiting" for ever (found in review)
            self.opening.pop(url, None)
            log.exception("DIAG: model from URL could not be opened url=%s", shown)
            self.note(f"model {shown} could not be opened: {exc}")
            return
        finally:
            opening.cancel()  # this task cancelled (the node stops): the open goes too
        self.opening.pop(url, None)
        log.info("DIAG: model origin answered after the start, serving it %s", kv(url=shown))
        self.note(f"model {shown} reachable: serving it")
        try:
            await on_open(directory)
        except Exception:  # noqa: BLE001 - logged: the node goes on without it
            log.exception("DIAG: model from URL could not be served url=%s", shown)

    async def async_open_later(self, url: str, on_open: Callable[[Path], Awaitable[None]]) -> None:
        """Open `url`'s partial model once its origin answers: tried again after
        PARTIAL_OPEN_RETRY_MIN_S, doubling up to PARTIAL_OPEN_RETRY_MAX_S, then `on_open(directory)`.
        For a `--model URL` whose origin could not be read at start with nothing of it here: the
        node starts without it (it used to exit, although peers may serve every layer of it)."""
        delay = const.PARTIAL_OPEN_RETRY_MIN_S
        self.opening.setdefault(url, time.time())
        while True:
            await asyncio.sleep(delay)
            try:
                directory = await self.async_open(url)
            except SplitModelServedWhole as exc:  # a repo's quant that is a split set: never served as layers
                self.opening.pop(url, None)
                log.error("DIAG: model from URL cannot be served %s", kv(url=self.origins.shown(url), error=exc.message))
                return self.note(f"model {self.origins.shown(url)} cannot be served: {exc.message}")
            except Exception as exc:  # noqa: BLE001 - unreachable, or a bad header: the origin may change
                delay = min(delay * 2, const.PARTIAL_OPEN_RETRY_MAX_S)
                log.info("DIAG: model URL still unreachable %s", kv(url=self.origins.shown(url),
                                                                     error=getattr(exc, "message", str(exc)),
                                                                     retry_in_s=delay))
                continue
            self.opening.pop(url, None)
            self.note(f"model {self.origins.shown(url)} reachable: serving it")
            try:
                await on_open(directory)
            except Exception:  # noqa: BLE001 - logged: the node goes on without it
                log.exception("DIAG: model from URL could not be served url=%s", self.origins.shown(url))
            return

    def pending(self) -> list[str]:
        """The `--model URL`s not open yet (their origin has not answered), as shown (no query)."""
        return [self.origins.shown(url) for url in self.opening]

    async def async_fetch(self, entry: ModelEntry, start: int, end: int, *,
                          progress: Callable[[int, int], None] | None = None) -> None:
        """The tensors of layers [start, end) of a partial model, from peers and its origin;
        `progress(bytes here, bytes wanted)` as the origin's bytes arrive (the GUI's row)."""
        assert entry.partial is not None
        manifest, parts, label = entry.partial, parts_for(entry.header, start, end), f"{start}-{end - 1}"
        last = [0.0]
        # one bar over the whole range: each source (a peer, then the next, then the origin)
        # reports its own bytes against its own total; counted here against the parts missing
        # when the fetch begins (`wanted`, set under the lock)
        wanted: list[str] = []
        shown = [0]

        def phase() -> Callable[[int, int], None]:
            """Progress of one source: its bytes on top of the parts completed before it began."""
            overall = sum(t.n_bytes for p in wanted for t in manifest.part_tensors(p))
            settled = sum(t.n_bytes for p in wanted if p in manifest.complete for t in manifest.part_tensors(p))

            def report(done: int, _total: int) -> None:
                shown[0] = min(overall, max(shown[0], settled + done))
                on_progress(shown[0], overall)
            return report

        def on_progress(done: int, total: int) -> None:
            if progress is not None:
                progress(done, total)
            # every update draws the CLI's bar on a terminal; a line (node.log, a pipe) every
            # PARTIAL_PROGRESS_LOG_S and at the end
            now = time.monotonic()
            line = now - last[0] >= const.PARTIAL_PROGRESS_LOG_S or done >= total
            if line:
                last[0] = now
            log.info("DIAG: fetching layers %s", kv(
                model=entry.id, layers=label, done_mb=round(done / 1e6, 1), of_mb=round(total / 1e6, 1),
                percent=round(100 * done / max(total, 1))),
                extra=progress_extra(f"fetching layers {label} of {entry.id}", done, total, line=line))

        async with self._lock:
            store, url = PartialStore(entry.path), self._urls.get(entry.path) or manifest.origin_url
            # the URL the peers' parts are checked against: None once the origin failed in this fetch
            # (unreachable, busy, another version): each check would wait for it again, under the lock
            check, refused = [url], ""
            if url and manifest.validator is None and (manifest.unchecked or not manifest.covers(parts)):
                # (opened from the swarm's header: fromheader.py)
                adopted = await async_adopt_origin(store, manifest, url)
                if adopted is None:
                    check[0] = None
                elif not adopted and manifest.whole_sha256:
                    # a whole-file sha256 (the swarm's) the origin does not state (no sha256, another
                    # file): never checked against nor fetched from, peers only (review 39)
                    url, check[0], refused = "", None, manifest.origin_url
            if manifest.unchecked and check[0]:
                try:
                    dropped = await async_spot_check_held(store, manifest, url)
                except SpotCheckFailed as exc:
                    dropped, check[0] = [], None
                    log.info("DIAG: unchecked partial model parts still unchecked %s",
                             kv(model=entry.id, parts=len(manifest.unchecked), reason=str(exc)))
                if dropped:  # altered bytes were in use: their conversions and the slices on them go
                    await self._async_forget_conversions(entry)
                    self.on_dropped(entry, dropped)
            wanted[:] = [p for p in parts if p not in manifest.complete]
            await self._async_from_peers(entry, store, parts, start, end, check, label, phase)
            if not url:  # opened from the swarm's header with no origin named: peers are the only source
                if not manifest.covers(parts):
                    raise DownloadFailed(f"layers {label} of {entry.id}: no peer gave them and " + (
                        f"{refused} holds another file or does not state its sha256 (peers only)" if refused
                        else "no origin is known to fetch them from"))
                return
            if not manifest.covers(parts):
                self.note(f"fetching layers {label} of {entry.id} from its origin")
            # a restart (the same id, other bytes) forgets the conversions itself, before it records the
            # new version
            stats = await async_fetch_parts(store, manifest, parts, progress=phase(), url=url,
                                            forget=self._forget)
        if stats.wire_bytes:
            self.note(f"fetched layers {label} of {entry.id}: {stats.wire_bytes / 2**20:.1f} MiB")

    @property
    def _forget(self) -> Callable[[str], object] | None:
        """What forgets a model's weight-cache conversions (blocking), for a fetch to call."""
        return self.weight_cache.forget if self.weight_cache is not None else None

    async def _async_forget_conversions(self, entry: ModelEntry) -> None:
        """The weight cache's conversions of this model go (its bytes on disk changed)."""
        if self.weight_cache is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.weight_cache.forget, entry.sha256)

    async def _async_from_peers(self, entry: ModelEntry, store: PartialStore, parts: list[str], start: int,
                                end: int, check: list[str | None], label: str, phase: Callable[[], Callable[[int, int], None]]) -> None:
        """What peers holding these layers can give, most overlap first (see the module doc)."""
        manifest = entry.partial
        assert manifest is not None
        if self.peers is None or manifest.covers(parts):
            return
        n = entry.n_layers
        candidates = sorted(((min(e, end) - max(s, start), node) for node, s, e in self.holders(entry.sha256)
                             if (entry.sha256, node) not in self._distrusted
                             and (min(e, end) > max(s, start) or (start == 0 and s == 0) or (end == n and e == n))),
                            reverse=True)
        # then the peers holding its whole file (any tensor of it), before the origin
        asked = [(node, "slice") for _overlap, node in candidates]
        asked += [(node, "whole") for node in dict.fromkeys(self.whole_holders(entry.sha256))
                  if (entry.sha256, node) not in self._distrusted and all(node != n for n, _ in asked)]
        for node, kind in asked:
            await self._async_from_peer(entry, store, parts, node, kind, check, label, phase)

    async def _async_from_peer(self, entry: ModelEntry, store: PartialStore, parts: list[str], node: str, kind: str,
                               check: list[str | None], label: str, phase: Callable[[], Callable[[int, int], None]]) -> None:
        """What one peer gives of the parts still missing: asked again while each answer brings parts
        (a whole holder names the hashes of at most PARTIAL_WHOLE_HASH_BYTES of tensors at a time).
        `check[0]`: the origin to check them against, set to None here when it could not check them."""
        manifest = entry.partial
        assert manifest is not None
        source, refused = PeerPartSource(self.peers, node), set()
        while (missing := [p for p in parts if p not in manifest.complete and p not in refused]):
            log.info("DIAG: asking a peer for layers %s", kv(peer_id=source.label, model=entry.id, holds=kind,
                                                              parts=len(missing)))
            self.note(f"fetching layers {label} of {entry.id} from peer {source.label}")
            try:
                got = await async_fetch_parts_from(store, manifest, missing, source, origin_url=check[0],
                                                   progress=phase())
            except NodeError as exc:  # it went, or holds none of these: the next one, then the origin
                log.info("DIAG: layer fetch from peer failed %s", kv(peer_id=source.label, model=entry.id,
                                                                     holds=kind, error=exc.message))
                return
            if got.parts and not got.spot_checked:  # the origin could not check them: not asked again
                check[0] = None
            if got.lied:
                self._distrusted.add((entry.sha256, node))
            if got.parts:
                self.note(f"fetched {len(got.parts)} parts of {entry.id} from peer {source.label}: "
                          f"{got.peer_bytes / 2**20:.1f} MiB" + ("" if got.spot_checked else " (not yet checked)"))
            refused.update(got.rejected)  # its bytes did not hash to its names: not asked of it again
            if got.lied or not got.parts:
                return

    async def async_trim(self, entry: ModelEntry, ranges: Callable[[], list[tuple[int, int]]]) -> None:
        """Delete the parts of a partial model that none of `ranges()` (its slices here, read once
        the lock is held: a load registered while the trim waited keeps its parts) uses."""
        assert entry.partial is not None
        async with self._lock:  # what to drop is decided under the lock: a fetch it waited for may have added parts
            keep = {part for start, end in ranges() for part in parts_for(entry.header, start, end)}
            drop = sorted(p for p in entry.partial.complete if p not in keep)
            if not drop:
                return
            freed = await asyncio.get_running_loop().run_in_executor(
                None, PartialStore(entry.path).remove_parts, entry.partial, drop)
        log.info("DIAG: partial model parts deleted %s", kv(model=entry.id, parts=len(drop),
                                                            freed_mb=round(freed / 1e6, 1),
                                                            held=entry.partial.describe()))


_HASHES_MAX_BYTES = 8 << 20  # a tensor list: ~120 bytes a tensor, far fewer than 70 000 tensors in a model


class PeerPartSource:
    """A peer's partial model over the peer link (MODEL_PART frames): a PartSource."""

    def __init__(self, peers: Any, node_id: str):
        self.peers, self.node_id, self.label = peers, node_id, node_id[:8]

    async def async_hashes(self, model: str, parts: list[str]) -> dict[str, str]:
        reply = await self.peers.async_request(self.node_id, Frame(FrameType.MODEL_PART, {
            "sha256": model, "op": "hashes", "parts": parts}), const.PARTIAL_PEER_TIMEOUT_S)
        if len(reply.payload) > _HASHES_MAX_BYTES:
            raise PeerError(f"peer {self.label} sent a {len(reply.payload)}-byte tensor list", code="protocol_error")
        try:
            raw = bytes(reply.payload)
            tensors = (loads_bounded(raw) if len(raw) < 65536 else  # (nesting: a ValueError, not a RecursionError)
                       await asyncio.get_running_loop().run_in_executor(None, loads_bounded, raw))["tensors"]
        except (ValueError, KeyError, TypeError) as exc:
            raise PeerError(f"peer {self.label} sent an unreadable tensor list ({exc})", code="protocol_error") from exc
        if not isinstance(tensors, dict):
            raise PeerError(f"peer {self.label} sent an unreadable tensor list", code="protocol_error")
        return {str(k): v for k, v in tensors.items() if is_sha256(v)}

    async def async_read(self, model: str, tensor: str, offset: int, n: int) -> bytes:
        reply = await self.peers.async_request(self.node_id, Frame(FrameType.MODEL_PART, {
            "sha256": model, "op": "read", "tensor": tensor, "offset": offset, "n": n}), const.PARTIAL_PEER_TIMEOUT_S)
        return bytes(reply.payload)
