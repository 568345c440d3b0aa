"""Fixtures of the pipeline tests."""

from __future__ import annotations

import pytest

from node.inference.pipeline.host import SliceHost
from node.inference.pipeline.hosted import parse_layers
from node.inference.pipeline.transport import PipelineTransport
from node.inference.pipeline.worker import SegmentWorker
from node.models.catalog import ModelCatalog
from tests.pipeline.swarm import split_model
from tests.pipeline.workerkit import ME, RecordingPeers


@pytest.fixture
async def worker(tmp_path):
    """(the worker, the model's entry, the recording peers)"""
    model = split_model(tmp_path)
    catalog = ModelCatalog(None)
    entry = catalog.scan([(model, "cli")])[0]
    host = SliceHost(dtype="f32", n_threads=1)
    start, end = parse_layers("0-5", entry.n_layers)  # the whole model: first and last slice at once
    hosted = await host.async_load(entry, start, end)
    assert hosted.state == "loaded"
    peers = RecordingPeers()
    w = SegmentWorker(ME, host, PipelineTransport(ME, peers))
    yield w, entry, peers
    await host.async_close()
