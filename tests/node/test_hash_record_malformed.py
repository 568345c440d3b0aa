"""A hash cache record whose own fields are not as the node writes them (a hand edit, another
version, a bad disk) does not make the models folder's scan fail (review r31, 2026-12-07): with its
size and mtime_ns matching the file, a record without `sha256` raised KeyError, a `sha256: null`
TypeError, a `header_bytes: "n/a"` ValueError, and the scan of every model failed. A record whose
sha256, size or mtime_ns is not as written is dropped (the file is hashed again); a malformed header
hash or length is computed again. Driven on the real hash cache file and ModelCatalog of a data dir."""

from __future__ import annotations

import hashlib
import json

import pytest

from node.datadir import MODELS_DIR
from node.inference.synth import write_gguf
from node.models.catalog import HASH_CACHE_FILE, ModelCatalog
from node.models.hash_cache import HashCache
from node.models.header import header_digest
from tests.support.nodes import TINY

# what replaces the record's fields (None: the field is left out)
MALFORMED = [
    {"sha256": None},
    {"sha256": "null"},
    {"sha256": 5},
    {"sha256": "abc"},
    {"sha256": "z" * 64},
    {"size": None},
    {"size": "1"},
    {"mtime_ns": True},
    {"header_bytes": "n/a"},
    {"header_bytes": None},
    {"header_bytes": -1},
    {"header_sha256": None},
    {"header_sha256": 7},
    {"header_sha256": "short"},
]


def _write(data_dir, changes: dict) -> tuple[object, str]:
    path = write_gguf(data_dir / MODELS_DIR / "tiny.gguf", TINY)
    st = path.stat()
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    header_sha, header_bytes = header_digest(path)
    record = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha,
              "header_sha256": header_sha, "header_bytes": header_bytes}
    for key, value in changes.items():
        if key == "sha256" and value is None:
            record.pop(key)  # no sha256 at all
        else:
            record[key] = value
    (data_dir / HASH_CACHE_FILE).write_text(json.dumps({str(path.resolve()): record}), encoding="utf-8")
    return path, sha


@pytest.mark.parametrize("changes", MALFORMED, ids=[json.dumps(c) for c in MALFORMED])
async def test_a_malformed_hash_record_does_not_fail_the_scan(tmp_path, changes):
    path, sha = _write(tmp_path, changes)
    catalog = ModelCatalog(tmp_path)
    await catalog.async_scan([(path, "data_dir")])
    (entry,) = catalog.entries.values()
    assert entry.sha256 == sha
    assert HashCache(tmp_path / HASH_CACHE_FILE).header_of(path)[:2] == header_digest(path)
