"""The model catalog: GGUF files this node can serve, with stable content-hash ids.

Sources: the embedded default model, `data_dir/models/*.gguf` (any case; a split model by its part 1,
file_kinds.py), and `--model` paths. A model id is
a readable name plus the first 8 hex of the file's sha256 (`swarmllm-pydoc-q8_0-1a2b3c4d`), so the
same file has the same id on every node. Hashes are cached per (path, size, mtime) in
`data_dir/model_hashes.json`, with the header's hash and length (header.py) and, for a download,
its origin URL and whether that origin is public (`public`: anyone could fetch the file there; a
record without it is not); hashing and header parsing are blocking and run in an executor. A model known only
by a header fetched from the swarm is an entry of source "swarm" (no file here).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from node.errors import ModelLoadError, ModelNotFound
from node.logs import kv
from node.models.file_kinds import NotAModel, check_split, not_a_model, refuse_slices, set_files, set_stem
from node.models.gguf_meta import GgufHeader, read_header
from node.models.hash_cache import HASH_CACHE_FILE, HashCache, HashingStopped
from node.models.header import HeaderCache
from node.models.origin_record import OriginRecord
from node.models.partial.layout import Manifest, PartialStore, file_stem

log = logging.getLogger(__name__)



def served_context(trained: int | None, n_ctx: int, max_ctx: int) -> int:
    """The context a node serves a model at (NodeConfig `n_ctx`, else the model's trained context
    capped by `max_ctx`): its requests' limit, and on a slice the positions a session may reach,
    which its KV reserve is sized for."""
    trained = trained or 2048
    if n_ctx:
        return min(n_ctx, trained)
    return min(trained, max_ctx) if max_ctx else trained


@dataclass
class ModelEntry:
    """One GGUF file known to this node."""

    id: str
    name: str
    path: Path
    sha256: str
    size_bytes: int
    source: str  # default | data_dir | cli | swarm (only the header is here, fetched from the swarm)
    header: GgufHeader
    header_sha256: str = ""  # sha256 of the bytes before the tensor data (header.py)
    header_bytes: int = 0
    origin_url: str | None = None  # where the file came from (no query string), if known
    origin_public: bool = False  # that origin serves the file to anyone (download/public.py): shared unloaded
    partial: Manifest | None = None  # a partial model (path is its directory): which layers are here
    hashed_stat: tuple[int, int] | None = None  # (size, mtime_ns) of the file when its sha256 was computed
    changed: bool = False  # its file changed on disk since (the watch saw it): not handed out to peers
    file_gone: bool = False  # its file was deleted or moved while the model stayed (loaded): no load after this one

    @property
    def tokenizer_path(self) -> Path:
        """What llama.cpp's vocab-only load reads: the file, or a partial model's vocab file."""
        return PartialStore(self.path).vocab_path if self.partial is not None else self.path

    @property
    def header_path(self) -> Path:
        """A file that starts with the model's header bytes (a swarm model's: its cached header, beside
        the vocab file that is its path)."""
        if self.partial is not None:
            return PartialStore(self.path).header_path
        return self.path if self.has_file else HeaderCache(self.path.parent).header_path(self.sha256)

    @property
    def whole_ok(self) -> bool:
        """Whether llama.cpp can load it whole (a file with every tensor, here)."""
        return self.has_file and self.partial is None

    @property
    def has_file(self) -> bool:
        """False for a model known here by its header only (no weights on this node)."""
        return self.source != "swarm"

    @property
    def architecture(self) -> str:
        return self.header.architecture

    @property
    def split_count(self) -> int:
        """Parts of a model split by gguf-split (path is part 1); 1 for a single file. Served here
        only: its id hashes part 1, and peers could not fetch its layers from one file."""
        return max(1, int(self.header.get("split.count", 1) or 1))

    def refuse_slices(self) -> None:
        """SplitModelServedWhole for a split model (its layers are not served as slices)."""
        refuse_slices(self.id, self.header)

    @property
    def n_layers(self) -> int:
        return self.header.n_layers

    @property
    def context_length(self) -> int:
        return self.header.context_length

    @property
    def quantization(self) -> str:
        return self.header.quantization

    def summary(self) -> dict[str, Any]:
        """Metadata for the admin API and the GUI."""
        return {
            "id": self.id,
            "name": self.name,
            "sha256": self.sha256,
            "architecture": self.architecture,
            "n_layers": self.n_layers,
            "context_length": self.context_length,
            "quantization": self.quantization,
            "size_bytes": self.size_bytes,
            "n_params": self.header.n_params,
            "vocab_size": self.header.vocab_size,
            "source": self.source,
            "header_sha256": self.header_sha256,
            "header_bytes": self.header_bytes,
            "partial": self.partial.describe() if self.partial is not None else None,
            "held_layers": self.partial.held_layers if self.partial is not None else None,
            "held_bytes": self.partial.held_bytes if self.partial is not None else None,
            "unchecked_parts": len(self.partial.unchecked) if self.partial is not None else None,
            "file_gone": self.file_gone,
        }


MODEL_NAME_MAX = 128
# What a model's readable name is: readable_name() makes only these, and a peer's advert of a name
# that is not one is refused (headers.parse_advert), so both sides agree on every id.
MODEL_NAME_RE = re.compile(rf"[a-z0-9][a-z0-9._-]{{0,{MODEL_NAME_MAX - 1}}}")


def _name_from(text: str) -> str:
    name = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).lstrip("._-")
    return name[:MODEL_NAME_MAX].rstrip("-")


def readable_name(path: Path, header: GgufHeader) -> str:
    """A lower-case, dash-separated name from the file stem (a split model's set name, without
    `-00001-of-00003`; else the model's general.name, else
    "model"): always a MODEL_NAME_RE match, at most MODEL_NAME_MAX characters."""
    name = _name_from(set_stem(path)) or _name_from(str(header.get("general.name", "model"))) or "model"
    return name


def check_model_file(path: Path, source: str) -> GgufHeader:
    """The header of a GGUF file that can be served whole, or ModelLoadError saying what is wrong
    with it (a folder, missing, not a GGUF, truncated, a split model's part missing or not part 1;
    NotAModel: a projector, an adapter, a vocabulary), before anything hashes it (blocking)."""
    if path.is_dir():  # the folder a model came in
        raise ModelLoadError(f"{path} is a directory: give the path of the .gguf file in it")
    if path.is_symlink() and not path.exists():
        raise ModelLoadError(f"{path.name} is a link to {path.readlink()}, which is missing (moved, deleted, "
                             "or on a drive not mounted?)")
    if not path.is_file():  # a typo, or a model's name as other tools take it
        hint = " (--model takes the path of a .gguf file, or an http(s):// or hf:// URL, hf://owner/repo:QUANT)" \
            if source == "cli" else ""
        raise ModelLoadError(f"model file not found: {path.absolute()}{hint}")
    header = read_header(path)
    what = not_a_model(header)
    if what is not None:
        raise NotAModel(f"{path.name} is {what}")
    split_no, split_count = int(header.get("split.no", 0) or 0), int(header.get("split.count", 0) or 0)
    if split_count >= 2:
        if split_no != 0:
            raise ModelLoadError(f"{path.name} is part {split_no + 1} of a model split in {split_count} parts: "
                                 "give the path of part 1 (name-00001-of-…), llama.cpp loads the others from it")
        check_split(path, header)
        return header
    size, needed = path.stat().st_size, header.data_end()
    if size < needed:  # llama.cpp would say only that it "could not read the vocabulary"
        raise ModelLoadError(f"{path.name} is truncated: {size / 1e6:.1f} of the {needed / 1e6:.1f} MB its header "
                             "describes (an interrupted download or copy? fetch it again)")
    return header


def scan_entry(path: Path, source: str, cache: HashCache) -> ModelEntry:
    """Build a ModelEntry for one file, or a partial model's directory (blocking)."""
    if PartialStore.is_partial(path):
        store = PartialStore(path)
        manifest = store.load()
        header = read_header(store.header_path)
        name = readable_name(Path(file_stem(path) + ".gguf"), header)  # dots kept, as a file's are
        return ModelEntry(f"{name}-{manifest.sha256[:8]}", name, path.resolve(), manifest.sha256, manifest.size_bytes,
                          source, header, header_sha256=manifest.header_sha256, header_bytes=manifest.header_bytes,
                          origin_url=manifest.origin_url or None, partial=manifest)
    header = check_model_file(path, source)
    sha = cache.get_or_compute(path)
    header_sha, header_bytes, origin = cache.header_of(path)
    name = readable_name(path, header)
    size = sum(p.stat().st_size for p in set_files(path))  # a split model's parts together
    return ModelEntry(f"{name}-{sha[:8]}", name, path.resolve(), sha, size, source, header,
                      header_sha256=header_sha, header_bytes=header_bytes, origin_url=origin,
                      origin_public=cache.public_of(path), hashed_stat=cache.stat_of(path))


Added = Literal["new", "back", "known"]  # catalog.add_file: a new entry, a gone file's entry given this one, as it was


def _file_back(known: ModelEntry, found: ModelEntry) -> bool:
    """Give `known`, whose file is gone (deleted, moved while its model stayed loaded), the file just
    found with its bytes (blocking: checks the old path; under the scan lock). 2026-12-07, review r65:
    adding the moved file was told "served already" and the model still could not be reloaded."""
    if not (known.has_file and known.partial is None and found.partial is None and known.sha256 == found.sha256
            and known.path != found.path and (known.file_gone or not known.path.exists())):
        return False
    known.path, known.source, known.size_bytes = found.path, found.source, found.size_bytes
    known.hashed_stat, known.changed, known.file_gone = found.hashed_stat, False, False
    return True


class ModelCatalog:
    """Every GGUF this node can serve, keyed by id; lookup by id, name or hash prefix."""

    def __init__(self, data_dir: Path | None):
        self.data_dir = data_dir
        self.entries: dict[str, ModelEntry] = {}
        self._scan_lock = threading.Lock()  # two scans at once (a download and the GUI's Add) add each file once
        self._cache = HashCache(data_dir / HASH_CACHE_FILE if data_dir else None)
        # files a scan could not serve → why (a truncated copy in the models folder): the app's
        # banner and the diagnostics report say it, not only a warning in the log
        self.skipped: dict[Path, str] = {}
        # GGUFs that are not models (a vision projector, a LoRA adapter, a vocabulary) → what they are:
        # not offered, not a problem to show in the banner (file_kinds.py)
        self.ignored: dict[Path, str] = {}
        # bumped on every change of an entry or of what is known of one (added, removed, its origin
        # found public, its file found changed or the same again), AFTER the change: Node keeps the
        # whole files it hands out (wholeparts.held_files) until this moves, not a pass over the
        # catalog per MODEL_PART, reading it before its pass (2026-12-07: the origin check bumped it
        # first, and the loop could keep the old list under the new generation)
        self._generations = itertools.count(1)  # next() is atomic: scans bump it from executor threads
        self.generation = 0

    def load_hashes(self) -> None:
        """Read the hash cache from the data dir (blocking; Node.start runs it in an executor)."""
        self._cache.load()

    def scan(self, sources: list[tuple[Path, str]]) -> list[ModelEntry]:
        """Scan (path, source) pairs; a bad file is logged and skipped (blocking)."""
        started = time.monotonic()
        found = [entry for path, source in sources for entry, how in [self._scan_one(path, source)] if how == "new"]
        log.info("DIAG: catalog scan complete model_count=%d elapsed_ms=%d", len(self.entries),
                 (time.monotonic() - started) * 1000)
        return found

    def add_file(self, path: Path, source: str, *, keep_refusal: bool = True) -> tuple[ModelEntry, Added]:
        """One file added while the node runs (blocking): the catalog's entry for it and what the add
        did (`Added`: the same file, or a file of the same id, added again is the entry already here;
        the file of an entry whose own is gone becomes its file); ModelLoadError saying why it cannot
        be served. `keep_refusal=False` (a path the caller was told about, outside the models folder):
        a refusal is that answer only, not a file listed as skipped for the rest of the run (the
        folder watch forgets only its own folder's)."""
        entry, how = self._scan_one(path, source)
        if entry is None:
            why = self.skipped.get(path) or self.ignored.get(path) or f"{path.name} could not be read (see node.log)"
            if not keep_refusal:
                self.skipped.pop(path, None)
                self.ignored.pop(path, None)
            raise ModelLoadError(why)
        return entry, how

    def sha256_of(self, path: Path, source: str) -> str | None:
        """The sha256 an add of `path` catalogs it under (blocking; a file's is hashed through the
        cache, where the add reads it again), None for a file the add refuses (it says why)."""
        try:
            if PartialStore.is_partial(path):
                return PartialStore(path).load().sha256
            check_model_file(path, source)  # (a projector or a truncated file is not hashed for nothing)
            return self._cache.get_or_compute(path)
        except (ModelLoadError, OSError, ValueError):
            return None

    def _scan_one(self, path: Path, source: str) -> tuple[ModelEntry | None, Added]:
        """(the catalog's entry for the file, what was done); (None, "known") if skipped."""
        try:
            entry = scan_entry(path, source, self._cache)
        except NotAModel as exc:
            log.info("DIAG: not a model, not served %s", kv(file=path.name, what=exc.message))
            self.ignored[path] = exc.message
            return None, "known"
        except ModelLoadError as exc:
            log.warning("skipping model %s: %s", path.name, exc.message)
            self.skipped[path] = exc.message
            return None, "known"
        except OSError as exc:
            log.warning("skipping model %s: %s", path.name, exc)
            if not isinstance(exc, HashingStopped):
                self.skipped[path] = str(exc)
            return None, "known"
        self.skipped.pop(path, None)
        self.ignored.pop(path, None)
        with self._scan_lock:
            known = self.entries.get(entry.id)
            new = known is None or not known.has_file  # the file replaces a header-only entry
            if new:
                self.entries[entry.id] = entry
                self.generation = next(self._generations)
            elif back := _file_back(known, entry):
                self.generation = next(self._generations)
        if not new:
            if back:
                log.info("DIAG: model file added again from another place; the model's file is that one now %s",
                         kv(model=known.id, path=known.path))
            return known, "back" if back else "known"
        log.info("DIAG: load_from_dir model=%s arch=%s layers=%d ctx=%d quant=%s source=%s",
                 entry.id, entry.architecture, entry.n_layers, entry.context_length, entry.quantization, source)
        return entry, "new"

    def remove_file_entry(self, entry: ModelEntry) -> bool:
        """Take back the entry of a file that is gone (only this very entry)."""
        with self._scan_lock:
            if self.entries.get(entry.id) is not entry:
                return False
            del self.entries[entry.id]
            self.generation = next(self._generations)
            return True

    def skipped_reasons(self) -> list[str]:
        """One line per file a scan skipped, naming the file (its reason may name it already)."""
        return [why if path.name in why else f"{path.name}: {why}" for path, why in list(self.skipped.items())]

    def ignored_reasons(self) -> list[str]:
        """One line per GGUF in the models folder that is not a model (a projector, an adapter, a
        vocabulary), saying what it is."""
        return [why if path.name in why else f"{path.name}: {why}" for path, why in list(self.ignored.items())]

    def stop_hashing(self) -> None:
        """Give up any hash in progress, and those asked later (the node is stopping): an executor
        thread still hashing a large file would keep the process alive after it quits."""
        self._cache.stop.set()

    def remember_hash(self, file: Path, sha256: str, origin_url: str | None = None) -> None:
        """Seed the hash cache for a file whose sha256 is already known (blocking)."""
        self._cache.remember(file, sha256, origin_url)

    def set_origin_public(self, file: Path, sha256: str, public: bool | None, *,
                          sent_token: bool = True) -> ModelEntry | None:
        """Record a download's origin check (blocking; None: it could not be made, not public until
        checked again, asked then without a token if `sent_token`): in the hash cache, and on the
        file's entry, which it returns (None: the file changed or left meanwhile)."""
        if not self._cache.set_public(file, sha256, public, sent_token=sent_token):
            return None
        try:
            entry = self.by_sha(sha256)
            if entry is None or not entry.has_file or entry.path != file.resolve():
                return None
            entry.origin_public = public is True and entry.origin_url is not None
            return entry
        finally:  # bumped after the change (a reader caches what it saw under the generation it read first)
            self.generation = next(self._generations)

    def unchecked_origins(self) -> list[tuple[Path, str, OriginRecord]]:
        """(file, sha256, origin record: its URL, whether its download sent a token) of the downloaded
        files whose origin check could not be made (blocking): origin_checks.py asks again at start."""
        return [(e.path, e.sha256, found) for e in list(self.entries.values())
                if e.whole_ok and (found := self._cache.unchecked_of(e.path, e.sha256))]

    def same_bytes(self, entry: ModelEntry) -> bool | None:
        """Whether a file whose stat changed since it was hashed still holds the bytes its sha256
        names (blocking: hashes it again, once, through the cache): a touched file is (its entry then
        takes the new stat, no longer `changed`), a file overwritten with other bytes is not (marked
        `changed`); None when it cannot be read (gone: the caller's load says so)."""
        try:
            digest = self._cache.get_or_compute(entry.path)
        except OSError:
            return None
        if digest != entry.sha256:
            self.mark_changed(entry)
            return False
        entry.hashed_stat, entry.changed = self._cache.stat_of(entry.path), False
        self.generation = next(self._generations)
        return True

    def mark_changed(self, entry: ModelEntry) -> None:
        """A file whose bytes are no longer those its sha256 names: not handed out (wholeparts)."""
        entry.changed = True
        self.generation = next(self._generations)

    def mark_gone(self, entry: ModelEntry, gone: bool) -> None:
        """Its file is gone (deleted, moved) while the model stays loaded, or back again."""
        entry.file_gone = gone
        self.generation = next(self._generations)

    def add_swarm_entry(self, entry: ModelEntry) -> ModelEntry:
        """Add a model known here by its fetched header only; the entry already there (a file
        of the same content found meanwhile) wins."""
        with self._scan_lock:
            kept = self.entries.setdefault(entry.id, entry)
            self.generation = next(self._generations)  # after the change, as everywhere
            return kept

    def remove_swarm_entry(self, entry: ModelEntry) -> bool:
        """Take back a header-only entry (its tokenizer could not be read); only this very entry."""
        with self._scan_lock:
            if entry.has_file or self.entries.get(entry.id) is not entry:
                return False
            del self.entries[entry.id]
            self.generation = next(self._generations)
            return True

    async def async_scan(self, sources: list[tuple[Path, str]]) -> list[ModelEntry]:
        """scan() off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.scan, sources)

    def resolve(self, name: str) -> ModelEntry:
        """Find a model by exact id, readable name, or sha256 prefix (≥ 8 hex)."""
        if name in self.entries:
            return self.entries[name]
        by_name = [e for e in self.entries.values() if e.name == name or e.path.stem == name]
        if len(by_name) == 1:
            return by_name[0]
        if len(by_name) > 1:  # two files of one name (here, or on peers): never one of them at random
            ids = ", ".join(sorted(e.id for e in by_name))
            raise ModelNotFound(f"The model name `{name}` names {len(by_name)} different models here ({ids}): "
                                "ask for one by its id", param="model")
        lowered = name.lower()
        if len(lowered) >= 8 and re.fullmatch(r"[0-9a-f]+", lowered):
            by_hash = [e for e in self.entries.values() if e.sha256.startswith(lowered)]
            if len(by_hash) == 1:
                return by_hash[0]
        raise ModelNotFound(f"The model `{name}` does not exist on this node", param="model", model=name)

    def by_sha(self, sha256: str) -> ModelEntry | None:
        """The entry whose content hash matches (models are matched across peers by hash)."""
        return next((e for e in self.entries.values() if e.sha256 == sha256), None)
