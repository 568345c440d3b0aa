"""A whole-model load the node's stop gives up on is freed, with its thread (2026-12-07). CI on
0242f56 failed the loop police: a `llama-tiny-*` executor thread, started by a GUI test's model load,
still parked in a live pool after the app stopped. ModelManager.async_close cancelled a load under
way, but the load goes on in its thread, and the cancel skipped the engine's close and shutdown; and
a load asked for just before the close (its checks awaiting a stat) was started after it. Either
kept its weights and an idle thread for as long as the process lived. Real llama.cpp, tiny model."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from node.config import NodeConfig
from node.errors import ModelUnavailable
from node.inference import manager as manager_module
from node.inference.llama_engine import LlamaEngine
from node.inference.load_failure import LoadFailure
from node.inference.manager import ModelManager
from node.models.catalog import ModelCatalog
from tests.support.nodes import tiny_model
from tests.support.policing import parked_in_live_pool
from tests.support.waiting import wait_until


class _Engines(LlamaEngine):
    """A LlamaEngine whose load waits for `go` (so the close can come mid-load); every one is kept."""

    made: list[LlamaEngine] = []
    loading = threading.Event()
    go = threading.Event()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Engines.made.append(self)

    def load(self) -> None:
        _Engines.loading.set()
        assert _Engines.go.wait(30)
        super().load()


@pytest.fixture
def engines(monkeypatch):
    _Engines.made, _Engines.loading, _Engines.go = [], threading.Event(), threading.Event()
    monkeypatch.setattr(manager_module, "LlamaEngine", _Engines)
    return _Engines


async def _registered(tmp_path) -> tuple[ModelManager, str]:
    catalog = ModelCatalog(tmp_path)
    [entry] = catalog.scan([(tiny_model(tmp_path), "cli")])
    models = ModelManager(NodeConfig(data_dir=tmp_path, n_threads=1), catalog)
    await models.async_register(entry)
    return models, entry.id


def _thread_of(engine: LlamaEngine) -> threading.Thread:
    [thread] = engine.executor._threads  # noqa: SLF001 (the one worker: max_workers=1)
    return thread


async def _freed(engine: LlamaEngine) -> None:
    thread = _thread_of(engine)
    await wait_until(lambda: not thread.is_alive(), 30, what="the abandoned load's thread to end")
    assert engine.model is None and engine.batcher is None, "the abandoned load's weights were kept"
    assert not parked_in_live_pool(thread)


async def test_a_load_under_way_when_the_node_stops_is_freed_with_its_thread(tmp_path, engines):
    models, model_id = await _registered(tmp_path)
    load = asyncio.create_task(models.async_load(model_id))
    await wait_until(engines.loading.is_set, 30, what="the load to start in its thread")
    await models.async_close()  # the stop, the load under way
    engines.go.set()
    with pytest.raises(ModelUnavailable, match="stopping"):
        await load  # (was: CancelledError out of a request that nobody cancelled)
    [engine] = engines.made
    await _freed(engine)  # (was: the load finished, its engine kept, its thread parked for good)
    assert models.get(model_id).state == "unloaded" and models.get(model_id).engine is None


async def test_a_load_asked_for_just_before_the_stop_is_refused_not_started_after_it(tmp_path, engines, monkeypatch):
    models, model_id = await _registered(tmp_path)
    checking, release = asyncio.Event(), asyncio.Event()

    async def slow_check(_catalog, _entry):  # the stat of the file's identity, off the loop
        checking.set()
        await release.wait()

    monkeypatch.setattr(manager_module, "async_refuse_changed", slow_check)
    engines.go.set()
    load = asyncio.create_task(models.async_load(model_id))
    await asyncio.wait_for(checking.wait(), 30)
    await models.async_close()
    release.set()
    with pytest.raises(ModelUnavailable, match="stopping"):
        await load  # (was: loaded after the close, never freed)
    assert engines.made == [] and models.get(model_id).engine is None



async def test_a_model_registered_as_the_node_stops_is_not_registered_after_it(tmp_path, monkeypatch):
    """The app's Add (a file) while Quit stops the node: its vocabulary, read off the loop, was
    registered after the close and never freed (2026-12-07); refused now, its vocabulary closed."""
    reading, release, made = threading.Event(), threading.Event(), []
    real = manager_module.ModelTokenizer

    def gated(path):
        tok = real(path)
        made.append(tok)
        reading.set()
        assert release.wait(30)
        return tok

    monkeypatch.setattr(manager_module, "ModelTokenizer", gated)
    catalog = ModelCatalog(tmp_path)
    [entry] = catalog.scan([(tiny_model(tmp_path), "cli")])
    models = ModelManager(NodeConfig(data_dir=tmp_path, n_threads=1), catalog)
    register = asyncio.create_task(models.async_register(entry))
    try:
        assert await asyncio.get_running_loop().run_in_executor(None, reading.wait, 30)
        await models.async_close()  # the stop
    finally:
        release.set()
    with pytest.raises(ModelUnavailable, match="stopping"):
        await register
    assert not models.is_registered(entry.id)
    [tok] = made
    assert tok._llm._model.model is None, "its vocabulary was kept"  # noqa: SLF001 (llama.cpp's, freed by close)


async def test_a_failed_model_retried_at_the_stop_answers_the_stop_not_its_old_failure(tmp_path, engines):
    """Review r60: a model whose load had failed (out of memory) tried again by a request once memory
    was freed, the node stopping meanwhile: the request got the old failure's 500, not the 503."""
    models, model_id = await _registered(tmp_path)
    served = models.get(model_id)
    served.state, served.failure = "failed", LoadFailure("llama.cpp could not load x: out of memory", None, time.time())
    served.failure.memory_freed = True  # another model was unloaded since: a request tries again
    load = asyncio.create_task(models.async_load(model_id))
    await wait_until(engines.loading.is_set, 30, what="the load to start in its thread")
    await models.async_close()
    engines.go.set()
    with pytest.raises(ModelUnavailable, match="stopping"):
        await load
    [engine] = engines.made
    await _freed(engine)


async def test_an_unload_cancelled_while_its_close_waits_still_clears_where_the_model_was(tmp_path):
    """Review r60: an unload whose client left while the close waited behind a step on the model's
    thread freed the model but skipped the books after it: "unloaded" with its device and placement
    still set (the Models tab showed a device), and a model that failed for want of memory was not
    allowed its retry."""
    models, model_id = await _registered(tmp_path)
    served = await models.async_load(model_id)
    step_runs, step_may_end = threading.Event(), threading.Event()
    served.engine.executor.submit(lambda: (step_runs.set(), step_may_end.wait(30)))
    try:
        assert await asyncio.get_running_loop().run_in_executor(None, step_runs.wait, 10)
        unload = asyncio.create_task(models.async_unload(model_id))
        await wait_until(lambda: served.engine is None, 10, what="the close queued behind the step")
        unload.cancel()
        await asyncio.gather(unload, return_exceptions=True)
    finally:
        step_may_end.set()
    assert served.state == "unloaded" and served.device is None and served.placement is None
    await models.async_close()
