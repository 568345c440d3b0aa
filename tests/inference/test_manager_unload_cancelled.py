"""An unload cancelled while its close waits behind a step on the model's thread still frees the
model (2026-12-07). The admin API cancels a handler whose client goes away (`swarmllm models unload`
stopped with Ctrl-C, a script's timeout); the close queued on the engine's thread was cancelled with
it and the executor shut down: the model said "unloaded", but llama.cpp's context (the KV cache) and
weights were never freed. Real llama.cpp, tiny model; the step is the test's own job on that thread."""

from __future__ import annotations

import asyncio
import threading

from node.config import NodeConfig
from node.inference.manager import ModelManager
from node.models.catalog import ModelCatalog
from tests.support.nodes import tiny_model
from tests.support.waiting import wait_until


async def test_an_unload_cancelled_while_its_close_waits_still_frees_the_model(tmp_path):
    catalog = ModelCatalog(tmp_path)
    [entry] = catalog.scan([(tiny_model(tmp_path), "cli")])
    models = ModelManager(NodeConfig(data_dir=tmp_path, n_threads=1), catalog)
    await models.async_register(entry)
    served = await models.async_load(entry.id)
    engine = served.engine
    [thread] = engine.executor._threads  # noqa: SLF001 (the one worker)
    step_runs, step_may_end = threading.Event(), threading.Event()
    engine.executor.submit(lambda: (step_runs.set(), step_may_end.wait(30)))  # a step on the model's thread
    try:
        assert await asyncio.get_running_loop().run_in_executor(None, step_runs.wait, 10)
        unload = asyncio.create_task(models.async_unload(entry.id))
        await wait_until(lambda: served.engine is None, 10, what="the unload to queue its close")
        unload.cancel()  # its client went away
        await asyncio.gather(unload, return_exceptions=True)
    finally:
        step_may_end.set()
    await wait_until(lambda: not thread.is_alive(), 10, what="the model's thread to end")
    assert engine.batcher is None and engine.model is None, "the cancelled unload left llama.cpp's memory"
    assert served.state == "unloaded"
    await models.async_close()
