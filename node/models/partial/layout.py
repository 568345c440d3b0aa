"""A partial model on disk: the GGUF header plus the tensors of some layers, and their manifest.

    models/<name>.partial/
      header.gguf-header   the origin file's bytes before its tensor data, exactly
      vocab.gguf           the header with zero tensors (what llama.cpp's vocab-only load reads)
      manifest.json        origin URL (no query), validator, file size, identity, header hash,
                           every tensor of the header: part, origin offset, size, local offset,
                           sha256 of its bytes once complete; which parts are complete
      fetch.json           bytes received so far per tensor (resume) and the validator they are of
      parts/<part>.bin     one file per part: `layer-NNNN` (blk.N.*), `embd` (token_embd),
                           `head` (output_norm, output), `globals` (rope factors, …); its tensors
                           in origin order, each at a 64-byte aligned local offset
      quarantine/          parts whose bytes did not hash to the manifest (the newest copy of each,
                           kept for a look)

A layer's tensors are not always one contiguous range of the origin file (seed 000), so the
manifest is per tensor. Which parts a slice of layers [a, b) needs: its layers, `globals`, `embd`
when it starts at 0 and `head` when it ends at the last layer (plus `embd` when the head is tied
to the embeddings). Everything here is blocking: executors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.errors import ModelLoadError
from node.models.gguf_meta import GgufHeader
from node.models.header import vocab_only_gguf, write_atomic

MANIFEST = "manifest.json"
HEADER = "header.gguf-header"
VOCAB = "vocab.gguf"
FETCH_STATE = "fetch.json"
PARTS_DIR = "parts"
QUARANTINE_DIR = "quarantine"
SUFFIX = ".partial"
LOCAL_ALIGN = 64
MANIFEST_VERSION = 1
_BLK = re.compile(r"blk\.(\d+)\.")


def dir_name(url: str, file_name: str) -> str:
    """`<stem>-<8 hex of the URL without its query>.partial`: two URLs never share a directory."""
    tag = hashlib.sha256(url.encode()).hexdigest()[:8]
    return f"{Path(file_name).stem}-{tag}{SUFFIX}"


def file_stem(directory: Path) -> str:
    """The origin file's stem a partial model's directory was named after (dir_name's inverse)."""
    return re.sub(r"-[0-9a-f]{8}$", "", directory.name.removesuffix(SUFFIX))


def part_of(name: str) -> str:
    """The part a tensor belongs to."""
    m = _BLK.match(name)
    if m:
        return f"layer-{int(m.group(1)):04d}"
    if name.startswith("token_embd."):
        return "embd"
    if name.startswith("output_norm.") or name.startswith("output."):
        return "head"
    return "globals"


def parts_for(header: GgufHeader, start: int, end: int) -> list[str]:
    """The parts a slice of layers [start, end) reads."""
    n = header.n_layers
    if not 0 <= start < end <= n:
        raise ModelLoadError(f"layer range [{start}, {end}) is outside the model's {n} layers")
    present = {part_of(t.name) for t in header.tensors}
    wanted = [f"layer-{i:04d}" for i in range(start, end)] + ["globals"]
    tied = not any(t.name == "output.weight" for t in header.tensors)
    if start == 0 or (end == n and tied):
        wanted.append("embd")
    if end == n:
        wanted.append("head")
    return [p for p in wanted if p in present]


def origin_identity(header_sha256: str, size_bytes: int) -> str:
    """A model's id hash when the origin does not tell the whole file's sha256: the same for every
    node reading the same header of a file of the same size (see ARCHITECTURE: Partial models)."""
    return hashlib.sha256(f"swarmllm-origin-v1\0{header_sha256}\0{size_bytes}".encode()).hexdigest()


@dataclass
class TensorRecord:
    name: str
    part: str
    offset: int  # absolute, in the origin file
    n_bytes: int
    local: int  # offset in its part file
    sha256: str | None = None  # of its bytes, once complete


@dataclass
class Manifest:
    """What a partial model holds and where it came from."""

    origin_url: str  # without query string
    validator: str | None  # strong ETag or Last-Modified of the version fetched
    size_bytes: int
    sha256: str  # the model's identity: the whole file's sha256 when known, else origin_identity()
    sha256_known: bool
    header_sha256: str
    header_bytes: int
    n_layers: int
    tensors: dict[str, TensorRecord] = field(default_factory=dict)
    # Both sets are replaced, never changed in place (mark/forget): the fetch's I/O thread updates
    # them while the loop may be iterating them (a summary, a MODEL_PART answer).
    complete: frozenset[str] = frozenset()  # parts whose every tensor is here and hashed
    unchecked: frozenset[str] = frozenset()  # complete parts from a peer, not yet spot-checked (peers.py)

    def mark_complete(self, part: str) -> None:
        self.complete = self.complete | {part}

    def mark_unchecked(self, parts: list[str]) -> None:
        """These parts came from a peer and the origin has not vouched for them yet."""
        self.unchecked = self.unchecked | set(parts)

    def mark_checked(self, parts: list[str]) -> None:
        self.unchecked = self.unchecked - set(parts)

    def forget(self, part: str) -> None:
        """The part is not here (quarantined, deleted): its tensors' hashes go too."""
        self.complete = self.complete - {part}
        self.unchecked = self.unchecked - {part}
        for t in self.part_tensors(part):
            t.sha256 = None

    @property
    def whole_sha256(self) -> bool:
        """Its id is a whole file's sha256 (the origin's word, or the swarm's), not origin_identity()'s:
        an origin's bytes are its bytes only where the origin states that sha256."""
        return self.sha256_known and self.sha256 != origin_identity(self.header_sha256, self.size_bytes)

    def part_tensors(self, part: str) -> list[TensorRecord]:
        return [t for t in self.tensors.values() if t.part == part]

    @property
    def held_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors.values() if t.part in self.complete)

    @property
    def held_layers(self) -> list[int]:
        return sorted(int(p[6:]) for p in self.complete if p.startswith("layer-"))

    def covers(self, parts: list[str]) -> bool:
        return all(p in self.complete for p in parts)

    def describe(self) -> str:
        """"layers 4–7 of 16, 310 MB of 1320 MB" (runs of held layers)."""
        runs: list[list[int]] = []
        for i in self.held_layers:
            if runs and runs[-1][1] == i - 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        text = ", ".join(f"{a}–{b}" if a != b else f"{a}" for a, b in runs) or "none"
        unchecked = f", {len(self.unchecked)} parts not yet checked against the origin" if self.unchecked else ""
        return (f"layers {text} of {self.n_layers}, {self.held_bytes / 1e6:.0f} MB of {self.size_bytes / 1e6:.0f} MB"
                + unchecked)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION, "origin_url": self.origin_url, "validator": self.validator,
            "size_bytes": self.size_bytes, "sha256": self.sha256, "sha256_known": self.sha256_known,
            "header_sha256": self.header_sha256, "header_bytes": self.header_bytes, "n_layers": self.n_layers,
            "complete": sorted(self.complete), "unchecked": sorted(self.unchecked),
            "tensors": [[t.name, t.part, t.offset, t.n_bytes, t.local, t.sha256] for t in self.tensors.values()],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Manifest:
        if d.get("version") != MANIFEST_VERSION:
            raise ValueError(f"manifest version {d.get('version')!r}")
        m = cls(str(d["origin_url"]), d.get("validator"), int(d["size_bytes"]), str(d["sha256"]),
                bool(d["sha256_known"]), str(d["header_sha256"]), int(d["header_bytes"]), int(d["n_layers"]))
        for name, part, offset, n_bytes, local, sha in d["tensors"]:
            m.tensors[name] = TensorRecord(str(name), str(part), int(offset), int(n_bytes), int(local), sha)
        m.complete = frozenset(str(p) for p in d["complete"])
        m.unchecked = frozenset(str(p) for p in d.get("unchecked", ())) & m.complete
        return m


def new_manifest(header: GgufHeader, header_data: bytes, *, origin_url: str, validator: str | None,
                 size_bytes: int, sha256: str | None) -> Manifest:
    """The manifest of a partial model of this header, holding nothing yet; ModelLoadError when the
    tensor table does not fit the file's size (nothing of such a file is trusted)."""
    header_sha = hashlib.sha256(header_data).hexdigest()
    m = Manifest(origin_url, validator, size_bytes, sha256 or origin_identity(header_sha, size_bytes),
                 sha256 is not None, header_sha, len(header_data), header.n_layers)
    ends: dict[str, int] = {}
    for t in sorted(header.tensors, key=lambda t: t.offset):
        try:
            n_bytes = t.n_bytes
        except (KeyError, ValueError):
            raise ModelLoadError(f"tensor {t.name[:64]} has unknown type {t.ggml_type}") from None
        start = header.data_offset + t.offset
        if start + n_bytes > size_bytes:
            raise ModelLoadError(f"tensor {t.name[:64]} runs past the end of the {size_bytes}-byte file")
        part = part_of(t.name)
        local = ends.get(part, 0)
        local += (-local) % LOCAL_ALIGN
        ends[part] = local + n_bytes
        m.tensors[t.name] = TensorRecord(t.name, part, start, n_bytes, local)
    return m


class PartialStore:
    """One partial model directory (blocking methods)."""

    def __init__(self, directory: Path):
        self.dir = directory

    @staticmethod
    def is_partial(path: Path) -> bool:
        return path.is_dir() and (path / MANIFEST).is_file()

    @property
    def header_path(self) -> Path:
        return self.dir / HEADER

    @property
    def vocab_path(self) -> Path:
        return self.dir / VOCAB

    def part_path(self, part: str) -> Path:
        return self.dir / PARTS_DIR / f"{part}.bin"

    def create(self, manifest: Manifest, header_data: bytes, header: GgufHeader) -> None:
        """A new partial model holding nothing (what an earlier one in the directory held goes)."""
        shutil.rmtree(self.dir / PARTS_DIR, ignore_errors=True)
        (self.dir / FETCH_STATE).unlink(missing_ok=True)
        (self.dir / PARTS_DIR).mkdir(parents=True, exist_ok=True)
        write_atomic(self.header_path, header_data)
        write_atomic(self.vocab_path, vocab_only_gguf(header_data, header))
        self.save(manifest)

    def load(self) -> Manifest:
        try:
            return Manifest.from_json(json.loads((self.dir / MANIFEST).read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{self.dir.name}: unreadable partial-model manifest ({exc})") from exc

    def save(self, manifest: Manifest) -> None:
        write_atomic(self.dir / MANIFEST, json.dumps(manifest.to_json()).encode())

    def fetch_state(self, validator: str | None) -> dict[str, int]:
        """Bytes already received per tensor, if they are of this version of the file."""
        try:
            d = json.loads((self.dir / FETCH_STATE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(d, dict) or d.get("validator") != validator or not validator:
            return {}
        have = d.get("have")
        return {str(k): int(v) for k, v in have.items()} if isinstance(have, dict) else {}

    def save_fetch_state(self, validator: str | None, have: dict[str, int]) -> None:
        write_atomic(self.dir / FETCH_STATE, json.dumps({"validator": validator, "have": have}).encode())

    def hash_part(self, manifest: Manifest, part: str) -> dict[str, str]:
        """sha256 of each tensor of a part as it is on disk."""
        out = {}
        with open(self.part_path(part), "rb") as fh:
            for t in manifest.part_tensors(part):
                fh.seek(t.local)
                h, left = hashlib.sha256(), t.n_bytes
                while left:
                    chunk = fh.read(min(left, 8 << 20))
                    if not chunk:
                        break
                    h.update(chunk)
                    left -= len(chunk)
                out[t.name] = h.hexdigest() if not left else ""
        return out

    def verify(self, manifest: Manifest, parts: list[str]) -> list[str]:
        """The complete parts among `parts` whose bytes no longer hash to the manifest (a corrupt
        byte, a truncated file): each is moved to quarantine/ and marked missing. Returns them."""
        bad = []
        for part in parts:
            if part not in manifest.complete:
                continue
            try:
                digests = self.hash_part(manifest, part)
            except OSError:
                digests = {}
            if any(digests.get(t.name) != t.sha256 for t in manifest.part_tensors(part)):
                bad.append(part)
                self.quarantine(manifest, part)
        if bad:
            self.save(manifest)
        return bad

    def quarantine(self, manifest: Manifest, part: str) -> None:
        q = self.dir / QUARANTINE_DIR
        q.mkdir(exist_ok=True)
        src = self.part_path(part)
        if src.exists():
            for older in q.glob(f"{part}.*.bin"):  # the newest copy is kept for a look, not every one: a
                older.unlink(missing_ok=True)  # peer sending bad bytes at each start would fill the disk
            os.replace(src, q / f"{part}.{time.time_ns()}.bin")
        manifest.forget(part)

    def remove_parts(self, manifest: Manifest, parts: list[str]) -> int:
        """Delete parts no longer served; returns the bytes freed."""
        freed = 0
        for part in parts:
            path = self.part_path(part)
            try:
                freed += path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                pass
            manifest.forget(part)
        self.save(manifest)
        return freed

    def tensor_locations(self) -> tuple[Manifest, dict[str, tuple[Path, int, int]]]:
        """(manifest, {tensor: (part file, local offset, bytes)}) of the complete parts: what the
        slice engine's GgufFile reads a partial model through."""
        m = self.load()
        return m, {t.name: (self.part_path(t.part), t.local, t.n_bytes)
                   for t in m.tensors.values() if t.part in m.complete}
