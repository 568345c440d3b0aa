"""A slice's unload frees its weights, KV caches and open file by refcounting alone, the moment its
model is dropped on its executor: no garbage collection runs. A full `gc.collect()` there held the
GIL for its walk of the whole heap, stalling the event loop (0.13 s on a quiet node, 749 ms in CI's
watchdog) on every move, pause, budget change and model removal (2026-12-07). Each test runs with
the collector disabled and records any collection that runs meanwhile."""

from __future__ import annotations

import contextlib
import gc
import os
import weakref
from pathlib import Path

import pytest
import torch

from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.wire import SessionControl, Work, encode_tokens
from node.inference.pipeline.worker import SegmentWorker
from node.inference.sampling import SamplingParams
from node.models.catalog import ModelCatalog
from tests.pipeline.swarm import split_model
from tests.pipeline.workerkit import COORD, ME, RecordingPeers, _results, _work
from tests.support.waiting import wait_until


@contextlib.contextmanager
def collections_seen():
    """The collector off (what is in a cycle stays); yields the generations of the collections that ran."""
    seen: list[int] = []

    def note(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    was = gc.isenabled()
    gc.collect()  # (what earlier tests left in cycles: not counted against this one)
    gc.disable()
    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)
        if was:
            gc.enable()


def _fields(obj) -> list:
    """An object's attribute values, in its __dict__ or its __slots__ (the Linear layers have slots)."""
    names = set(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names.update((slots,) if isinstance(slots, str) else slots)
    return [getattr(obj, name) for name in sorted(names) if hasattr(obj, name)]


def _tensors(obj, depth: int = 2) -> list[torch.Tensor]:
    """The tensors an object holds in its attributes, and those of its attributes' objects (a block's
    Linear layers, their packed matrices)."""
    out = []
    for value in _fields(obj):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif depth > 1 and not isinstance(value, (type, str, int, float, tuple, bool)) and value is not None:
            out += _tensors(value, depth - 1)
    return out


def _watch(model) -> dict[str, weakref.ref]:
    """Weak references to what a slice's unload must free: the model, each block's weight tensors, the
    head's, every session's K and V, the GgufFile and its mapping."""
    refs = {"model": weakref.ref(model), "file": weakref.ref(model.file), "mapping": weakref.ref(model.file._mm)}
    for i, block in enumerate(model.blocks):
        refs[f"block {i}"] = weakref.ref(block)
        tensors = _tensors(block)
        assert tensors, f"no weight tensors found in block {i}"
        refs.update({f"block {i} weight {j}": weakref.ref(t) for j, t in enumerate(tensors)})
    if model.head is not None:
        norm, head = model.head
        refs["head norm"] = weakref.ref(norm)
        refs.update({f"head weight {j}": weakref.ref(t) for j, t in enumerate(_tensors(head))})
    for sid in ("s1", "s2"):
        sess = model.sessions.peek(sid)
        if sess is not None:
            refs.update({f"{sid} session": weakref.ref(sess), f"{sid} K": weakref.ref(sess.k),
                         f"{sid} V": weakref.ref(sess.v)})
    return refs


def _open_on(path: Path) -> list[str] | None:
    """This process's descriptors open on `path` (Linux: /proc; elsewhere None, not looked at)."""
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        return None
    out = []
    for fd in os.listdir(fds):
        with contextlib.suppress(OSError):
            if os.readlink(fds / fd) == str(path):
                out.append(fd)
    return out


@pytest.mark.parametrize(("dtype", "requests"), [("f32", False), ("f32", True), ("int8", True)],
                         ids=["idle", "with_sessions", "int8_with_sessions"])
async def test_an_unloaded_slice_is_freed_by_refcounting_with_no_collection(tmp_path, dtype, requests):
    """A slice loaded as a node loads it (a catalog: its file vouched for by its stat), idle or after
    requests ran on it (a kept session, one in use, a constrained step that read the vocabulary; int8:
    the packed matrices and the fused decode's layouts), is
    drained and unloaded with the collector off: every weight and KV tensor, its GgufFile, mapping and
    descriptor are gone once async_unload returns, and no collection ran."""
    path = split_model(tmp_path)
    catalog = ModelCatalog(None)
    entry = catalog.scan([(path, "cli")])[0]
    host = SliceHost(dtype=dtype, n_threads=1, catalog=catalog)
    try:
        hosted = await host.async_load(entry, 0, entry.n_layers)
        assert hosted.state == "loaded", hosted.error
        assert hosted.model.file.vouch is not None
        if requests:
            peers = RecordingPeers()
            w = SegmentWorker(ME, host, PipelineTransport(ME, peers))
            w.on_work(_work(entry, 0, 0, [5, 6, 7, 8]).to_header(), encode_tokens([5, 6, 7, 8]), COORD)
            await wait_until(lambda: len(_results(peers)) == 1, 30, what="s1's RESULT")
            w.on_session_end(SessionControl("s1", entry.sha256, "session_end", keep=True).to_header(), b"", COORD)
            biased = Work(sid="s2", model=entry.sha256, seq=0, index_pos=0, n_tokens=3, route=_work(entry, 0, 0, [1]).route,
                          hop=0, coordinator=COORD, sample=True,
                          sampling=SamplingParams(temperature=0.0, logit_bias=((3, 5.0),)))
            w.on_work(biased.to_header(), encode_tokens([5, 6, 9]), COORD)
            await wait_until(lambda: len(_results(peers)) == 2, 30, what="s2's RESULT")
            assert [r.error for r in _results(peers)] == [None, None]
            await wait_until(lambda: hosted.model.sessions.counts() == (1, 1), 10, what="s1 kept, s2 in use")
            assert hosted.vocab is not None
        refs = _watch(hosted.model)
        assert _open_on(path) != []  # (the file's descriptor, open while the slice is loaded)
        with collections_seen() as seen:
            host.drain(hosted)
            await host.async_unload(hosted)
            alive = sorted(name for name, ref in refs.items() if ref() is not None)
            assert alive == [], f"still alive after the unload, left for a garbage collection: {alive}"
            assert _open_on(path) in ([], None)
        assert seen == [], f"the unload ran garbage collections of generations {seen}"
        assert hosted.state == "unloaded" and hosted.model is None
    finally:
        await host.async_close()

