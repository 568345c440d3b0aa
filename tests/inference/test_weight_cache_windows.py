"""The weight cache read with Windows' `mmap` module: no MAP_SHARED, MAP_POPULATE or PROT_*
constants, and `mmap()` takes only (fileno, length, tagname, access, offset). The read mapped
with flags/prot, so on Windows every load that found its parts in the cache (a slice's second
load, each restart) failed with AttributeError."""

from __future__ import annotations

import mmap

import numpy as np

from node.inference.slice import SliceModel
from node.inference.synth import SynthSpec
from node.inference.weights.cache import WeightCache
from tests.inference.reference import our_logits

SPEC = SynthSpec(hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=300, n_layers=2, n_ctx=128)
TOKENS = [1, *range(10, 30)]


def _windows_mmap(monkeypatch) -> None:
    real = mmap.mmap

    def windows_mmap(fileno, length, tagname=None, access=mmap.ACCESS_DEFAULT, offset=0):
        return real(fileno, length, access=access, offset=offset)

    for name in [n for n in dir(mmap) if n.startswith(("MAP_", "PROT_"))]:
        monkeypatch.delattr(mmap, name)
    monkeypatch.setattr(mmap, "mmap", windows_mmap)


def test_a_load_reads_the_cache_with_windows_mmap(synth_model, tmp_path, monkeypatch):
    path = synth_model(SPEC)
    cache = WeightCache(tmp_path / "wc", 1 << 30)
    plain = our_logits(SliceModel.load(path, dtype="int8"), TOKENS, decode_from=10)
    _windows_mmap(monkeypatch)
    first = SliceModel.load(path, dtype="int8", cache=cache, sha256="ab" * 32)
    second = SliceModel.load(path, dtype="int8", cache=cache, sha256="ab" * 32)
    assert (first.weight_cache, second.weight_cache) == ("miss", "hit")
    np.testing.assert_array_equal(our_logits(second, TOKENS, decode_from=10), plain)
