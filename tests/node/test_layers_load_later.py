"""`swarmllm run --model URL --layers A-B` whose origin answered the header but went away while
the layers were fetched, longer than the fetch's retries (about 30 s): the slice stayed `failed`
until the node was restarted, though the origin came back a minute later (found by driving a
real node against an origin that went down mid-fetch, 2026-12-06). The load is tried again."""

from __future__ import annotations

from node import const
from node.inference.synth import SynthSpec, write_gguf
from tests.support.nodes import node_config, running_node
from tests.support.rangeserver import ThreadedOrigin
from tests.support.waiting import wait_until

SPEC = SynthSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=512, n_ctx=128, name="later")


async def test_layers_that_failed_to_arrive_at_start_load_once_the_origin_is_back(tmp_path, monkeypatch):
    for name, value in (("DOWNLOAD_RETRY_BASE_S", 0.01), ("DOWNLOAD_RETRIES", 2), ("PARTIAL_OPEN_RETRY_MIN_S", 0.2)):
        monkeypatch.setattr(const, name, value)
    data = write_gguf(tmp_path / "later.gguf", SPEC).read_bytes()
    with ThreadedOrigin(data, "later.gguf") as origin:
        origin.fail_from = 65536  # the header comes; the layers' ranges get a 503
        config = node_config(tmp_path / "data", models=[origin.url], layers="1-2", slice_dtype="f32",
                             slice_kv_dtype="f32")
        async with running_node(config) as node:
            [hosted] = node.slice_host.slices.values()
            assert hosted.state == "failed", hosted.state
            origin.fail_from = None  # the origin is back
            await wait_until(lambda: any(s.state == "loaded" for s in node.slice_host.slices.values()), 30.0, 0.05,
                             "the layers, once the origin is back")


async def test_layers_all_here_that_failed_to_load_are_not_tried_for_ever(tmp_path, monkeypatch, caplog):
    """Only a fetch is worth retrying: a slice whose layers are all on disk and still failed (its
    load ran out of memory, say) stays failed, instead of failing again every few minutes for ever."""
    import logging

    from node.inference.slice import SliceModel

    monkeypatch.setattr(const, "PARTIAL_OPEN_RETRY_MIN_S", 0.05)
    calls = []

    def failing_load(*args, **kwargs):
        calls.append(1)
        raise MemoryError("no room for these layers")

    monkeypatch.setattr(SliceModel, "load", staticmethod(failing_load))
    caplog.set_level(logging.INFO, logger="node.inference.pipeline")
    data = write_gguf(tmp_path / "later.gguf", SPEC).read_bytes()
    with ThreadedOrigin(data, "later.gguf") as origin:
        config = node_config(tmp_path / "data", models=[origin.url], layers="1-2", slice_dtype="f32",
                             slice_kv_dtype="f32")
        async with running_node(config) as node:
            [hosted] = node.slice_host.slices.values()
            assert hosted.state == "failed" and "MemoryError" in hosted.error
            await wait_until(lambda: any("all here; not loading them again" in r.getMessage() for r in caplog.records),
                             what="the node deciding not to retry")
            assert not [t for t in node._url_tasks if t.get_name() == "load-layers-later" and not t.done()]
            assert len(calls) == 1
