"""A hash cache record whose origin fields are not as the node writes them (a hand edit, another
version, a bad disk) is never read as public: its file is not handed out unloaded
(origin_record.py). A `public` that is not true/false/"unchecked" is checked again at the next
start, asked without a token; a `rule` that is not an integer counts as no rule (2.0 was read as
rule 2 before 2026-12-07, so that file was shared with no check under this rule); a record that is
no JSON object is dropped (it made the catalog's scan fail). Driven on the real hash cache file and
ModelCatalog of a data dir."""

from __future__ import annotations

import hashlib
import json

import pytest

from node.datadir import MODELS_DIR
from node.inference.synth import write_gguf
from node.models.catalog import HASH_CACHE_FILE, ModelCatalog
from node.models.hash_cache import PUBLIC_RULE, HashCache
from tests.support.nodes import TINY

URL = "https://huggingface.co/org/model/resolve/main/tiny.gguf"

# (origin fields on disk, whether the start checks it again)
MALFORMED = [
    ({"origin": URL, "public": "true", "rule": PUBLIC_RULE}, True),
    ({"origin": URL, "public": 1, "rule": PUBLIC_RULE}, True),
    ({"origin": URL, "public": None, "rule": PUBLIC_RULE}, True),
    ({"origin": URL, "public": {"value": True}, "rule": PUBLIC_RULE}, True),
    ({"origin": URL, "public": True, "rule": float(PUBLIC_RULE)}, True),
    ({"origin": URL, "public": True, "rule": str(PUBLIC_RULE)}, True),
    ({"origin": URL, "public": True}, True),  # no rule: an older one
    ({"public": True, "rule": PUBLIC_RULE}, False),  # no origin: the user's own file
    ({"origin": 5, "public": True, "rule": PUBLIC_RULE}, False),
    ({"origin": "", "public": True, "rule": PUBLIC_RULE}, False),
    ({"origin": URL, "rule": PUBLIC_RULE}, False),  # no result recorded
]


async def _catalog(data_dir, origin_fields: dict) -> tuple[ModelCatalog, object, str]:
    path = write_gguf(data_dir / MODELS_DIR / "tiny.gguf", TINY)
    st = path.stat()
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    record = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha, **origin_fields}
    (data_dir / HASH_CACHE_FILE).write_text(json.dumps({str(path.resolve()): record}), encoding="utf-8")
    catalog = ModelCatalog(data_dir)
    await catalog.async_scan([(path, "data_dir")])
    return catalog, path, sha


@pytest.mark.parametrize(("fields", "checked_again"), MALFORMED, ids=[json.dumps(f) for f, _ in MALFORMED])
async def test_a_malformed_origin_record_is_never_public(tmp_path, fields, checked_again):
    catalog, path, sha = await _catalog(tmp_path, fields)
    (entry,) = catalog.entries.values()
    assert entry.sha256 == sha, "the file was hashed again: the record was not the one read"
    assert not entry.origin_public
    assert not HashCache(tmp_path / HASH_CACHE_FILE).public_of(path)
    again = catalog.unchecked_origins()
    if checked_again:
        assert [(p, s, r.url, r.token_sent) for p, s, r in again] == [(path.resolve(), sha, URL, True)]
    else:
        assert again == []


async def test_the_same_record_well_formed_is_public(tmp_path):
    """The control: the record as the check writes it is public."""
    catalog, path, _sha = await _catalog(tmp_path, {"origin": URL, "public": True, "rule": PUBLIC_RULE})
    (entry,) = catalog.entries.values()
    assert entry.origin_public and catalog.unchecked_origins() == []


async def test_a_record_that_is_no_object_is_dropped(tmp_path):
    path = write_gguf(tmp_path / MODELS_DIR / "tiny.gguf", TINY)
    (tmp_path / HASH_CACHE_FILE).write_text(json.dumps({str(path.resolve()): ["public", True]}), encoding="utf-8")
    catalog = ModelCatalog(tmp_path)
    await catalog.async_scan([(path, "data_dir")])
    (entry,) = catalog.entries.values()
    assert not entry.origin_public and catalog.unchecked_origins() == []
