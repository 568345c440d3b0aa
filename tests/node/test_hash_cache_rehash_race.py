"""An origin check recorded while the same file is hashed again (it was touched: a backup tool, a
copy with preserved bytes) is kept (review r31, 2026-12-07): the re-hash built its new record from
the one it read before hashing, and since set_public swaps in a new record it wrote the old origin
fields back: a check's result lost, a file just found public recorded as never checked, an
`unchecked` one never asked again. The real hash cache file of a data dir; the re-hash is held
(its sha256_file waits) while the check's result is recorded."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from node.inference.synth import write_gguf
from node.models import hash_cache
from node.models.hash_cache import HASH_CACHE_FILE, HashCache
from tests.support.nodes import TINY

URL = "https://huggingface.co/org/model/resolve/main/tiny.gguf"


@pytest.mark.parametrize("result", [True, False, None], ids=["public", "private", "unchecked"])
def test_a_check_recorded_during_a_rehash_is_kept(tmp_path, monkeypatch, result):
    path = write_gguf(tmp_path / "tiny.gguf", TINY)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    cache = HashCache(tmp_path / HASH_CACHE_FILE)
    cache.remember(path, sha, URL)  # the download ended; its origin check is under way
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: hashed again

    hashing, go = threading.Event(), threading.Event()
    real = hash_cache.sha256_file

    def held(file, stop=None):
        hashing.set()
        assert go.wait(30), "the test never let the hash go on"
        return real(file, stop)

    monkeypatch.setattr(hash_cache, "sha256_file", held)
    got: list[str] = []
    rehash = threading.Thread(target=lambda: got.append(cache.get_or_compute(path)))
    rehash.start()
    try:
        assert hashing.wait(30), "the re-hash did not start"
        assert cache.set_public(path, sha, result, sent_token=False)  # the check's result, meanwhile
    finally:
        go.set()
        rehash.join(30)
    assert got == [sha]
    for reader in (cache, HashCache(tmp_path / HASH_CACHE_FILE)):  # in memory and on disk
        origin = reader.origin_of(path, sha)
        assert origin.url == URL and origin.checked, origin
        assert origin.shared is (result is True)
        assert (reader.unchecked_of(path, sha) is not None) is (result is None)
