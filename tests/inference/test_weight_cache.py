"""The on-disk cache of converted slice weights: a second load reads what the first converted, gives
the same numbers, and a changed file, format, budget or a damaged part is never served from it."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from node.inference.pipeline.host import SliceHost
from node.inference.slice import SliceModel
from node.inference.slice.formats import cache_kernel_name
from node.inference.synth import SynthSpec
from node.inference.weights.cache import CacheKey, WeightCache
from node.models.catalog import ModelCatalog
from tests.inference.reference import INT8_KERNELS, our_logits

SPEC = SynthSpec(hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=300, n_layers=4, n_ctx=128)
OTHER = SynthSpec(hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=300, n_layers=4, n_ctx=128, seed=7)
TOKENS = [1, *range(10, 40)]
SHA = "ab" * 32
BIG = 1 << 30


@pytest.fixture
def path(synth_model):
    return synth_model(SPEC)


@pytest.fixture(params=INT8_KERNELS)
def kernel(request):
    """Each int8 kernel's arrays are cached (qgemm's packed rows, fbgemm's rows before prepack)."""
    return request.param


def load(path, cache, sha=SHA, start=0, end=None, **kw):
    return SliceModel.load(path, start, end, dtype=kw.pop("dtype", "int8"), cache=cache, sha256=sha, **kw)


def logits(model):
    return our_logits(model, TOKENS, decode_from=20)


def parts(cache: WeightCache) -> list[str]:
    return sorted(p.name for p in cache.root.rglob("*.swc"))


def test_second_load_reads_the_cache_and_computes_the_same_logits(path, tmp_path, kernel):
    cache = WeightCache(tmp_path / "wc", BIG)
    plain = logits(SliceModel.load(path, dtype="int8", kernel=kernel))
    first = load(path, cache, kernel=kernel)
    assert first.weight_cache == "miss"
    assert parts(cache) == ["head.swc", "layer-0000.swc", "layer-0001.swc", "layer-0002.swc", "layer-0003.swc"]
    second = load(path, cache, kernel=kernel)
    assert second.weight_cache == "hit"
    np.testing.assert_array_equal(logits(first), plain)
    np.testing.assert_array_equal(logits(second), plain)  # bit for bit: the same int8 rows and scales


def test_slices_of_one_model_share_their_layers(path, tmp_path, kernel):
    cache = WeightCache(tmp_path / "wc", BIG)
    assert load(path, cache, start=0, end=2, kernel=kernel).weight_cache == "miss"
    assert parts(cache) == ["layer-0000.swc", "layer-0001.swc"]
    whole = load(path, cache, kernel=kernel)  # layers 0-1 from the first load; 2-3, head converted
    assert whole.weight_cache == "partial"
    assert load(path, cache, start=1, end=4, kernel=kernel).weight_cache == "hit"


def test_another_file_or_format_is_another_key_and_prefill_modes_share_one(path, synth_model, tmp_path, kernel):
    cache = WeightCache(tmp_path / "wc", BIG)
    load(path, cache, kernel=kernel)
    assert load(path, cache, sha="cd" * 32, kernel=kernel).weight_cache == "miss"  # a changed file: another sha256
    # one conversion serves both prefill modes (only which matrices take the residual pass differs)
    assert load(path, cache, exact_prefill=True, kernel=kernel).weight_cache == "hit"
    assert load(path, cache, dtype="f32", kernel=kernel).weight_cache == "off"  # f32 converts in a blink: not cached
    assert len([d for d in cache.root.iterdir() if d.is_dir()]) == 2
    # a part of another key's directory (a copy, a renamed dir) is refused on its header, not used
    other = synth_model(OTHER)
    key = CacheKey(SHA, "int8", cache_kernel_name(kernel), "std")
    mine = cache.root / key.dirname / "layer-0001.swc"
    theirs = cache.root / CacheKey("cd" * 32, "int8", cache_kernel_name(kernel), "std").dirname / "layer-0001.swc"
    mine.write_bytes(theirs.read_bytes())
    assert cache.read(key, "layer-0001") is None
    assert not mine.exists()
    assert load(other, cache, sha="ef" * 32, kernel=kernel).weight_cache == "miss"


@pytest.mark.skipif(len(INT8_KERNELS) < 2, reason="one int8 kernel here")
def test_another_kernel_is_another_key_and_a_qgemm_hit_maps_its_weights(path, tmp_path):
    cache = WeightCache(tmp_path / "wc", BIG)
    assert load(path, cache, kernel="fbgemm").weight_cache == "miss"
    assert load(path, cache, kernel="qgemm").weight_cache == "miss"  # fbgemm's parts are not qgemm's
    hit = load(path, cache, kernel="qgemm")
    assert hit.weight_cache == "hit" and hit.kernel == "qgemm"
    packed = hit.blocks[0].gate_up.packed
    assert not packed.flags.writeable and not packed.flags.owndata  # a view of the mapped part: no copy
    assert sorted(d.name.split("-")[2] for d in cache.root.iterdir() if d.is_dir()) == ["fbgemm2", "qgemm1"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_a_damaged_part_is_detected_removed_and_converted_again(path, tmp_path, caplog, damage, kernel):
    cache = WeightCache(tmp_path / "wc", BIG)
    plain = logits(load(path, cache, kernel=kernel))
    victim = next(p for p in cache.root.rglob("layer-0002.swc"))
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[len(data) - 1000] ^= 0x10  # one bit inside the arrays (the header is intact)
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"\x00GGUF" * 100)
    victim.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="node.inference.weights.cache"):
        again = load(path, cache, kernel=kernel)
    assert again.weight_cache == "partial"
    assert "weight cache part unusable" in caplog.text and "layer-0002.swc" in caplog.text
    np.testing.assert_array_equal(logits(again), plain)
    assert load(path, cache, kernel=kernel).weight_cache == "hit"  # rewritten whole


def test_the_budget_evicts_the_least_recently_used_model_and_never_overflows(path, synth_model, tmp_path, kernel):
    probe = WeightCache(tmp_path / "probe", BIG)
    load(path, probe, kernel=kernel)
    one_model = probe.total_bytes()
    cache = WeightCache(tmp_path / "wc", int(one_model * 1.5))
    load(path, cache, sha="aa" * 32, kernel=kernel)
    load(path, cache, sha="bb" * 32, kernel=kernel)  # does not fit beside the first: the first goes
    assert load(path, cache, sha="bb" * 32, kernel=kernel).weight_cache == "hit"
    assert load(path, cache, sha="aa" * 32, kernel=kernel).weight_cache == "miss"  # evicted; now "bb" is evicted
    assert cache.total_bytes() <= cache.budget_bytes
    tiny = WeightCache(tmp_path / "tiny", one_model // 4)  # smaller than one model: nothing written
    assert load(path, tiny, kernel=kernel).weight_cache == "miss"
    assert tiny.total_bytes() == 0
    assert load(path, tiny, kernel=kernel).weight_cache == "miss"
    off = WeightCache(tmp_path / "off", 0)
    assert load(path, off, kernel=kernel).weight_cache == "off"
    assert not off.root.exists()


def test_a_part_round_trips_every_array_exactly(tmp_path):
    cache = WeightCache(tmp_path / "wc", BIG)
    key = CacheKey(SHA, "int8", "fbgemm", "std")
    rng = np.random.default_rng(0)
    arrays = {"q": rng.integers(-127, 128, (33, 70), dtype=np.int8), "scales": rng.random(33, dtype=np.float32),
              "flags": np.array([1, 32], dtype=np.int32), "odd": rng.random((3, 5)).astype(np.float64)[:, ::2]}
    assert cache.reserve(key, 1 << 20)
    assert cache.write(key, "p", arrays)
    back = cache.read(key, "p")
    assert set(back) == set(arrays)
    for name, a in arrays.items():
        np.testing.assert_array_equal(back[name], a)
        assert back[name].dtype == a.dtype and back[name].ctypes.data % 16 == 0
    assert cache.read(key, "absent") is None


async def test_a_hosted_slice_loads_from_the_cache_the_second_time(path, tmp_path):
    entry = ModelCatalog(None).scan([(path, "cli")])[0]
    host = SliceHost(dtype="int8", n_threads=1, weight_cache=WeightCache(tmp_path / "wc", BIG))
    try:
        first = await host.async_load(entry, 0, 4)
        assert first.state == "loaded" and first.summary()["weight_cache"] == "miss"
        await host.async_unload(first)
        second = await host.async_load(entry, 0, 4)
        assert second.state == "loaded" and second.summary()["weight_cache"] == "hit"
        assert second.summary()["load_ms"] >= 0
        assert second.model.kernel in INT8_KERNELS
        assert (tmp_path / "wc" / CacheKey(entry.sha256, "int8", cache_kernel_name(second.model.kernel), "std").dirname
                / "head.swc").is_file()
        sess = second.model.new_session("s")
        out = second.model.forward(sess, torch.tensor(TOKENS), 0, last_only=True)
        assert out.shape == (1, SPEC.vocab) and torch.isfinite(out).all()
    finally:
        await host.async_close()


def test_out_of_descriptors_is_not_a_damaged_part(tmp_path, monkeypatch, caplog):
    """EMFILE (macOS starts programs at 256 open files; each mapped part holds one) says nothing
    about the part: it is kept for the next load, not removed and converted again."""
    import errno

    from node.inference.weights import cache as cache_mod

    cache = WeightCache(tmp_path / "wc", BIG)
    key = CacheKey(SHA, "int8", "fbgemm", "std")
    assert cache.reserve(key, 1 << 20) and cache.write(key, "p", {"a": np.arange(8, dtype=np.int32)})

    def out_of_files(fd, size):
        raise OSError(errno.EMFILE, "Too many open files")

    real = cache_mod._map_read
    monkeypatch.setattr(cache_mod, "_map_read", out_of_files)
    with caplog.at_level(logging.WARNING, logger="node.inference.weights.cache"):
        assert cache.read(key, "p") is None
    assert "not readable now" in caplog.text and "unusable" not in caplog.text
    monkeypatch.setattr(cache_mod, "_map_read", real)
    np.testing.assert_array_equal(cache.read(key, "p")["a"], np.arange(8, dtype=np.int32))
