"""A slice load whose file is written over in place while its layers convert (review r34,
2026-12-07): the converted parts were written to the weight cache under the old sha256, and every
later load (after a restart too) used those layers of the new bytes. The load now fails
(FileChangedWhileOpen) and caches nothing read after the change."""

from __future__ import annotations

import threading

import pytest

from node.inference.arch.block import Block
from node.inference.slice import SliceModel
from node.inference.slice import model as slice_model
from node.inference.synth import write_gguf
from node.inference.weights.cache import WeightCache
from node.inference.weights.gguf_file import FileChangedWhileOpen
from tests.pipeline.test_held_file_changed import OTHER, _overwrite
from tests.support.nodes import TINY


def test_a_file_written_over_while_its_slice_converts_is_not_cached_nor_loaded(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "tiny.gguf", TINY)
    cache = WeightCache(tmp_path / "wc", 1 << 30)
    build, once = Block.build, threading.Lock()
    monkeypatch.setattr(slice_model, "_load_workers", lambda *a: 1)  # (the head, then layer 0 first built)

    def build_then_overwrite(*args, **kwargs):
        built = build(*args, **kwargs)
        if once.acquire(blocking=False):  # layer 0 converted (its cache part not yet written): written over
            _overwrite(path, OTHER)
        return built

    monkeypatch.setattr(Block, "build", build_then_overwrite)
    with pytest.raises(FileChangedWhileOpen):
        SliceModel.load(path, 0, TINY.n_layers, dtype="int8", cache=cache, sha256="ab" * 32)
    # the part converted as the file changed is not cached under the old sha256 (it was; parts checked
    # before the change may be: they were read from the bytes the sha256 names)
    assert "layer-0000.swc" not in {p.name for p in cache.root.rglob("*.swc")}
