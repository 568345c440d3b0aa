"""A model asked for once the node has stopped is refused with one wording and one code, whichever
part refuses it: a registration (ModelManager.async_register), a request for a registered model
(ModelManager.unservable) or a slice load (SliceHost.async_load). Until 2026-12-07 the three said it
three ways ("is not served", "cannot be served", "is not loaded")."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from node.config import NodeConfig
from node.errors import ModelUnavailable
from node.inference.manager import ModelManager
from node.inference.pipeline.host import SliceHost
from node.inference.synth import write_gguf
from node.models.catalog import ModelCatalog
from tests.support.nodes import TINY

pytestmark = [pytest.mark.llama]


async def test_every_refusal_after_the_stop_says_it_the_same_way(tmp_path):
    files = [write_gguf(tmp_path / f"{name}.gguf", dataclasses.replace(TINY, seed=seed, name=name))
             for name, seed in (("first", 71), ("later", 72))]
    catalog = ModelCatalog(None)
    first, later = await asyncio.to_thread(catalog.scan, [(f, "cli") for f in files])  # hashing: off the loop
    models = ModelManager(NodeConfig(data_dir=tmp_path, n_threads=1), catalog)
    served = await models.async_register(first)
    host = SliceHost(dtype="f32", kv_dtype="f32")
    await models.async_close()
    await host.async_close()
    refused = [models.unservable(served)]
    for refuse in (lambda: models.async_register(later), lambda: host.async_load(later, 0, 1)):
        with pytest.raises(ModelUnavailable) as caught:
            await refuse()
        refused.append(caught.value)
    said = [(e.message.replace(later.id, "<id>").replace(first.id, "<id>"), e.http_status, e.code) for e in refused]
    assert said == [("model <id> cannot be served: the node is stopping", 503, "model_unavailable")] * 3, said
