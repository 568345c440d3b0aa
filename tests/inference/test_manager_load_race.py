"""A load whose checks (a stat of the file, off the loop) were awaiting while the model's load under
way ended loads nothing more (2026-12-07): it found the load task done and started another, whose
engine replaced the first one unclosed — its weights and its llama-* thread kept for good — or,
with an unload begun meanwhile, loaded the model again under that unload. Real llama.cpp, tiny
model; the check is held by the test so the load ends inside it."""

from __future__ import annotations

import asyncio

import pytest

from node.errors import ModelUnavailable
from node.inference import manager as manager_module
from node.inference.llama_engine import LlamaEngine
from node.models.changed import async_refuse_changed
from tests.inference.test_manager_close import _registered
from tests.support.policing import parked_in_live_pool
from tests.support.waiting import wait_until


class _Engines(LlamaEngine):
    made: list[LlamaEngine] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Engines.made.append(self)


@pytest.fixture
def held_check(monkeypatch):
    """The second load's check waits for `release` (the first's runs as it does)."""
    _Engines.made = []
    monkeypatch.setattr(manager_module, "LlamaEngine", _Engines)
    checking, release, calls = asyncio.Event(), asyncio.Event(), []

    async def check(catalog, entry):
        calls.append(entry)
        if len(calls) == 2:
            checking.set()
            await release.wait()
        await async_refuse_changed(catalog, entry)

    monkeypatch.setattr(manager_module, "async_refuse_changed", check)
    return checking, release


async def test_a_request_checking_as_the_load_ends_loads_no_second_engine(tmp_path, held_check):
    checking, release = held_check
    models, model_id = await _registered(tmp_path)
    try:
        first = asyncio.create_task(models.async_load(model_id))  # the load under way
        second = asyncio.create_task(models.async_load(model_id))  # a request that comes as it ends
        await asyncio.wait_for(checking.wait(), 30)
        await first  # loaded while the second's check is out
        release.set()
        assert await second is models.get(model_id)
        assert len(_Engines.made) == 1, "a second engine was loaded over the first"
    finally:
        release.set()
        await models.async_close()
    for engine in _Engines.made:  # (was: the first engine, replaced unclosed, kept its weights and thread)
        assert engine.model is None, "an engine's weights were never freed"
        assert not any(parked_in_live_pool(t) for t in engine.executor._threads)  # noqa: SLF001


async def test_a_request_checking_as_an_unload_begins_is_told_it_is_going_away(tmp_path, held_check):
    checking, release = held_check
    models, model_id = await _registered(tmp_path)
    served = models.get(model_id)
    unload = None
    try:
        first = asyncio.create_task(models.async_load(model_id))
        second = asyncio.create_task(models.async_load(model_id))  # a request that comes as it ends
        await asyncio.wait_for(checking.wait(), 30)
        await first
        await served.lock.acquire()  # another request holds the model: the unload waits for it
        unload = asyncio.create_task(models.async_unload(model_id, force=True))
        await wait_until(lambda: served.unloading is not None, 10, what="the unload to begin")
        release.set()
        with pytest.raises(ModelUnavailable, match="being unloaded"):
            await second  # (was: loaded again under the unload, over the first engine)
        served.lock.release()
        await unload
        assert served.state == "unloaded" and served.engine is None
        assert len(_Engines.made) == 1, "a second engine was loaded under the unload"
    finally:
        release.set()
        if unload is not None and not unload.done():
            served.lock.release()
            await asyncio.gather(unload, return_exceptions=True)
        await models.async_close()
