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


async def test_a_range_missing_only_its_head_is_a_fetch_to_retry(tmp_path):
    """The last layers read the `head` part too (and `embd` with tied weights): a slice whose layers
    arrived but whose head did not (the origin went in between) is a fetch to retry, not a failure
    with everything here (review: only the layer parts were looked at)."""
    from node.inference.pipeline import fixed
    from node.models.catalog import ModelCatalog
    from node.models.gguf_meta import read_header
    from node.models.partial import async_fetch_parts, async_open_partial, parts_for
    from tests.models.test_partial import SPEC as PART8

    data = write_gguf(tmp_path / "part8.gguf", PART8).read_bytes()
    with ThreadedOrigin(data) as origin:
        store, manifest = await async_open_partial(origin.url, tmp_path / "m.partial")
        wanted = parts_for(read_header(store.header_path), 6, 8)
        assert "head" in wanted
        await async_fetch_parts(store, manifest, [p for p in wanted if p != "head"])
        [entry] = ModelCatalog(None).scan([(store.dir, "cli")])
        assert set(range(6, 8)) <= set(entry.partial.held_layers)  # every layer is here ...
        assert fixed._missing(entry, 6, 8)  # ... and still something to fetch
        await async_fetch_parts(store, manifest, wanted)
        [entry] = ModelCatalog(None).scan([(store.dir, "cli")])
        assert not fixed._missing(entry, 6, 8)
