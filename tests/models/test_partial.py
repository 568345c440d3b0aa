"""Partial models against a local HTTP server with Range support that counts the bytes it sends:
a quarter of the layers costs a quarter of the file, the slice engine reads the partial model as
it reads the whole file (same logits), and a dropped connection, a server ignoring Range, a
changed file, a short range and a corrupt byte on disk are each handled."""

from __future__ import annotations

import asyncio

import pytest
import torch

from node import const
from node.errors import DownloadFailed, ModelLoadError
from node.inference.slice.model import SliceModel
from node.inference.synth import SynthSpec, write_gguf
from node.models.gguf_meta import read_header
from node.models.partial import PartialStore, async_fetch_parts, async_open_partial, parts_for
from tests.support.rangeserver import ThreadedOrigin

pytestmark = pytest.mark.usefixtures("fast_retries")

SPEC = SynthSpec(n_layers=8, hidden=256, n_heads=4, n_kv_heads=2, ffn=1024, vocab=512, n_ctx=256, name="part8")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("partial") / "part8.gguf", SPEC)


@pytest.fixture
def server(model):
    with ThreadedOrigin(model.read_bytes()) as srv:
        yield srv


def _logits(path, start, end, tokens):
    m = SliceModel.load(path, start, end, dtype="f32")
    s = m.new_session("t")
    return m.forward(s, tokens, 0)


def _hidden(path, start, end, x):
    m = SliceModel.load(path, start, end, dtype="f32")
    return m.forward(m.new_session("t"), x, 0)


async def test_a_quarter_of_the_layers_costs_a_quarter_of_the_file_and_gives_the_same_logits(
        tmp_path, model, server):
    size = model.stat().st_size
    store, manifest = await async_open_partial(server.url, tmp_path / "m.partial")
    header = read_header(store.header_path)
    assert manifest.n_layers == 8 and manifest.size_bytes == size and not manifest.sha256_known
    probe = server.sent
    assert probe < size * 0.02  # the header probe, not the file

    middle = parts_for(header, 2, 4)
    stats = await async_fetch_parts(store, manifest, middle)
    assert server.sent <= 0.30 * size, (server.sent, size)
    assert stats.wire_bytes == server.sent - probe == stats.wanted_bytes  # contiguous layers: no gap bytes
    assert manifest.describe().startswith("layers 2–3 of 8")
    x = torch.randn(5, SPEC.hidden)
    loop = asyncio.get_running_loop()
    whole = await loop.run_in_executor(None, _hidden, model, 2, 4, x)
    part = await loop.run_in_executor(None, _hidden, store.dir, 2, 4, x)
    assert torch.equal(whole, part)

    # the last quarter, with the head; the first slice of the same dir needs the embeddings too
    await async_fetch_parts(store, manifest, parts_for(header, 6, 8))
    assert manifest.held_layers == [2, 3, 6, 7]
    h = torch.randn(4, SPEC.hidden)
    assert torch.equal(await loop.run_in_executor(None, _hidden, model, 6, 8, h),
                       await loop.run_in_executor(None, _hidden, store.dir, 6, 8, h))
    with pytest.raises(ModelLoadError, match="not held"):  # layers 0-1 and the embeddings are not here
        await loop.run_in_executor(None, _logits, store.dir, 0, 2, torch.tensor([1, 2, 3]))
    # nothing is fetched again for what is held; the same URL reopens the same partial model
    sent = server.sent
    again = await async_fetch_parts(store, manifest, middle)
    assert again.wire_bytes == 0
    store2, manifest2 = await async_open_partial(server.url, tmp_path / "m.partial")
    assert manifest2.held_layers == [2, 3, 6, 7] and server.sent - sent < size * 0.02


async def test_a_dropped_connection_resumes_and_fetches_nothing_twice(tmp_path, model, server):
    store, manifest = await async_open_partial(server.url, tmp_path / "m.partial")
    header = read_header(store.header_path)
    probe = server.sent
    parts = parts_for(header, 0, 2)  # the first quarter: embeddings + layers 0-1
    wanted = sum(t.n_bytes for t in manifest.tensors.values() if t.part in parts)
    server.drop_after = wanted // 2 + 12345
    stats = await async_fetch_parts(store, manifest, parts)
    assert stats.attempts == 2 and stats.requests == 2
    # one coalesced range, then its rest: the resume asks from the first byte not received
    (a1, b1), (a2, b2) = [map(int, r.removeprefix("bytes=").split("-")) for r in server.ranges[-2:]]
    assert b1 == b2 and a1 < a2 <= a1 + server.drop_cut
    # every byte of the span was received once: what the client read is the span, nothing twice
    assert stats.wire_bytes == b1 - a1 + 1
    assert 0 <= stats.wire_bytes - wanted < const.PARTIAL_COALESCE_GAP  # the wanted bytes and small gaps
    assert server.sent - probe >= stats.wire_bytes  # (bytes in flight at the drop are lost, as on a network)
    tokens = torch.tensor([3, 1, 4, 1, 5])
    loop = asyncio.get_running_loop()
    assert torch.equal(await loop.run_in_executor(None, _hidden, model, 0, 2, tokens),
                       await loop.run_in_executor(None, _hidden, store.dir, 0, 2, tokens))


async def test_a_server_ignoring_range_is_read_through_once(tmp_path, model, server):
    server.ignore_range = True  # from the probe on: 200s with the whole file
    store, manifest = await async_open_partial(server.url, tmp_path / "m.partial")
    header = read_header(store.header_path)
    stats = await async_fetch_parts(store, manifest, parts_for(header, 2, 4))
    assert stats.requests == 1  # one pass from byte 0, dropped after the last wanted byte
    assert manifest.held_layers == [2, 3]
    last = max(t.offset + t.n_bytes for t in manifest.tensors.values() if t.part == "layer-0003")
    assert stats.wire_bytes <= last + (1 << 20)
    x = torch.randn(3, SPEC.hidden)
    loop = asyncio.get_running_loop()
    assert torch.equal(await loop.run_in_executor(None, _hidden, model, 2, 4, x),
                       await loop.run_in_executor(None, _hidden, store.dir, 2, 4, x))


async def test_a_short_range_is_retried_from_where_it_ended(tmp_path, model, server):
    store, manifest = await async_open_partial(server.url, tmp_path / "m.partial")
    header = read_header(store.header_path)
    probe = server.sent
    parts = parts_for(header, 4, 6)
    server.short_by = 100_000
    stats = await async_fetch_parts(store, manifest, parts)
    assert stats.attempts == 2 and server.sent - probe == stats.wanted_bytes
    assert manifest.held_layers == [4, 5]


async def test_a_changed_file_restarts_from_zero_with_the_new_bytes(tmp_path, model, server):
    loop = asyncio.get_running_loop()
    store, manifest = await async_open_partial(server.url, tmp_path / "m.partial")
    header = await loop.run_in_executor(None, read_header, store.header_path)
    parts = parts_for(header, 2, 4)
    t = manifest.tensors["blk.2.attn_norm.weight"]  # the first bytes of the range: fetched before the drop
    t3 = manifest.tensors["blk.3.ffn_down.weight"]

    def new_version() -> tuple[bytearray, bytes]:  # off the loop: megabytes copied (0.25 s CPU on CI)
        changed = bytearray(server.data)
        changed[t.offset + 10] ^= 0xFF  # same header, other weights: a new version of the file
        changed[t3.offset + 10] ^= 0xFF
        return changed, bytes(changed)

    changed, changed_bytes = await loop.run_in_executor(None, new_version)
    server.drop_after = 1_000_000  # the first request breaks; the file changes before the retry
    server.change_after = (server.sent + 1, changed_bytes)
    stats = await async_fetch_parts(store, manifest, parts)
    assert stats.restarts == 1 and manifest.validator == '"v2"'

    def spliced() -> list[str]:  # off the loop: megabytes compared (the loop police caught it on CI)
        view = memoryview(changed)
        return [x.name for part in parts for raw in [store.part_path(part).read_bytes()]
                for x in manifest.part_tensors(part)
                if raw[x.local:x.local + x.n_bytes] != view[x.offset:x.offset + x.n_bytes]]
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, spliced) == []  # every byte is the new version's

    # another header at the URL: the model is gone from there (a clear error, nothing trusted)
    other = await loop.run_in_executor(None, lambda: write_gguf(
        tmp_path / "other.gguf", SPEC.replace(n_layers=4, name="other")).read_bytes())
    await loop.run_in_executor(None, store.remove_parts, manifest, parts)
    server.data, server.etag = other, '"v3"'
    with pytest.raises(DownloadFailed, match="changed"):
        await async_fetch_parts(store, manifest, parts)


async def test_a_corrupt_byte_on_disk_is_quarantined_and_fetched_again(tmp_path, model, server):
    store, manifest = await async_open_partial(server.url, tmp_path / "m.partial")
    header = read_header(store.header_path)
    parts = parts_for(header, 2, 4)
    await async_fetch_parts(store, manifest, parts)
    path = store.part_path("layer-0003")
    loop = asyncio.get_running_loop()
    raw = bytearray(await loop.run_in_executor(None, path.read_bytes))
    raw[1000] ^= 1  # one flipped byte
    await loop.run_in_executor(None, path.write_bytes, bytes(raw))
    before = server.sent
    stats = await async_fetch_parts(store, manifest, parts)
    assert stats.wanted_bytes == sum(t.n_bytes for t in manifest.part_tensors("layer-0003"))  # that part only
    assert server.sent - before == stats.wire_bytes == stats.wanted_bytes
    assert len(list((store.dir / "quarantine").iterdir())) == 1
    assert await loop.run_in_executor(None, store.verify, manifest, parts) == []
    x = torch.randn(2, SPEC.hidden)
    assert torch.equal(await loop.run_in_executor(None, _hidden, model, 2, 4, x),
                       await loop.run_in_executor(None, _hidden, store.dir, 2, 4, x))


async def test_what_is_not_a_model_is_refused_before_anything_is_stored(tmp_path, server):
    server.data = b"<html>login</html>" + b" " * 5000
    with pytest.raises(DownloadFailed, match="not a GGUF"):
        await async_open_partial(server.url, tmp_path / "m.partial")
    assert not (tmp_path / "m.partial").exists()
    # a tensor table that runs past the file's end (a truncated upload) is refused too
    good = await asyncio.get_running_loop().run_in_executor(None, lambda: write_gguf(
        tmp_path / "g.gguf", SPEC.replace(n_layers=2, name="g")).read_bytes())
    server.data = good[: len(good) - 4096]
    with pytest.raises(ModelLoadError, match="past the end"):
        await async_open_partial(server.url, tmp_path / "m.partial")
    assert not PartialStore.is_partial(tmp_path / "m.partial")


def test_layers_map_to_parts(tmp_path):
    header = read_header(write_gguf(tmp_path / "t.gguf", SPEC.replace(n_layers=4, tied=True, name="tied")))
    assert parts_for(header, 1, 3) == ["layer-0001", "layer-0002"]
    assert parts_for(header, 0, 1) == ["layer-0000", "embd"]
    assert parts_for(header, 3, 4) == ["layer-0003", "embd", "head"]  # a tied head reads the embeddings
    with pytest.raises(ModelLoadError):
        parts_for(header, 2, 5)


def _interleaved_copy(src, dst):
    """The same model with its tensors reordered by kind (every layer's attn_norm, then every
    layer's attn_q, …): a layer's tensors lie in as many runs across the file as it has kinds."""
    import struct

    data = src.read_bytes()
    header = read_header(src)
    pos, where = header.kv_end, {}
    for _ in header.tensors:  # walk the tensor infos to find each offset field
        (n,) = struct.unpack_from("<Q", data, pos)
        name = data[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        (dims,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * dims + 4
        where[name] = pos
        pos += 8
    order = sorted(header.tensors, key=lambda t: (t.name.split(".", 2)[-1] if t.name.startswith("blk.") else "",
                                                  t.name))
    out = bytearray(data[:header.data_offset])
    body, offset = bytearray(), 0
    for t in order:
        offset += (-offset) % header.alignment
        body += b"\0" * (offset - len(body))
        struct.pack_into("<Q", out, where[t.name], offset)
        start = header.data_offset + t.offset
        body += data[start:start + t.n_bytes]
        offset += t.n_bytes
    dst.write_bytes(bytes(out) + bytes(body))
    return dst


async def test_a_layer_spread_over_the_file_is_fetched_tensor_by_tensor(tmp_path, model):
    loop = asyncio.get_running_loop()
    spread = await loop.run_in_executor(None, _interleaved_copy, model, tmp_path / "spread.gguf")
    with ThreadedOrigin(await loop.run_in_executor(None, spread.read_bytes)) as srv:
        store, manifest = await async_open_partial(srv.url, tmp_path / "s.partial")
        probe = srv.sent
        parts = parts_for(read_header(store.header_path), 2, 4)
        stats = await async_fetch_parts(store, manifest, parts)
        assert stats.requests >= 5  # one run per tensor kind: the layers are not one range
        assert srv.sent - probe == stats.wire_bytes <= stats.wanted_bytes + stats.requests * const.PARTIAL_COALESCE_GAP
        assert stats.wire_bytes < 0.30 * len(srv.data)
    x = torch.randn(3, SPEC.hidden)
    whole = await loop.run_in_executor(None, _hidden, model, 2, 4, x)
    assert torch.equal(whole, await loop.run_in_executor(None, _hidden, spread, 2, 4, x))
    assert torch.equal(whole, await loop.run_in_executor(None, _hidden, store.dir, 2, 4, x))


async def test_rope_factors_come_with_the_header_and_a_signed_url_is_never_stored(tmp_path):
    from node.inference.pipeline.coverage import slice_sizes

    spec = SPEC.replace(n_layers=4, rope_scaling="llama3", rope_scaling_factor=8.0, rope_orig_ctx=128, name="l3")
    loop = asyncio.get_running_loop()
    path = await loop.run_in_executor(None, write_gguf, tmp_path / "l3.gguf", spec)
    with ThreadedOrigin(await loop.run_in_executor(None, path.read_bytes)) as srv:
        signed = srv.url + "?token=SECRET123"
        store, manifest = await async_open_partial(signed, tmp_path / "l3.partial")
        assert "globals" in manifest.complete  # rope_freqs: what the model's configuration reads
        sizes = await loop.run_in_executor(None, slice_sizes, store.dir, "f32")  # budgets before any layer
        assert sizes.n_layers == 4
        await async_fetch_parts(store, manifest, parts_for(read_header(store.header_path), 1, 3), url=signed)
        on_disk = b"".join(p.read_bytes() for p in store.dir.glob("*.json"))
        assert b"SECRET123" not in on_disk and manifest.origin_url == srv.url
        with pytest.raises(DownloadFailed, match="not this partial model"):
            await async_fetch_parts(store, manifest, ["layer-0000"], url="http://127.0.0.1:1/other.gguf")
    x = torch.randn(3, spec.hidden)
    assert torch.equal(await loop.run_in_executor(None, _hidden, path, 1, 3, x),
                       await loop.run_in_executor(None, _hidden, store.dir, 1, 3, x))


async def test_the_catalog_lists_a_partial_model_by_its_files_name(tmp_path, server):
    from node.models.catalog import ModelCatalog

    d = tmp_path / "Llama-3.2-1B-Q8_0-0123abcd.partial"
    store, manifest = await async_open_partial(server.url, d)
    await async_fetch_parts(store, manifest, parts_for(read_header(store.header_path), 2, 4))
    [entry] = await ModelCatalog(None).async_scan([(d, "cli")])
    assert entry.name == "llama-3.2-1b-q8_0" and entry.id == f"llama-3.2-1b-q8_0-{manifest.sha256[:8]}"
    assert entry.partial is not None and not entry.whole_ok and entry.tokenizer_path == store.vocab_path
    assert entry.summary()["partial"].startswith("layers 2–3 of 8, ") and entry.summary()["held_layers"] == [2, 3]


async def test_an_origin_naming_no_version_is_warned_about(tmp_path, server, caplog):
    """No ETag and no Last-Modified: a file replaced there by another of the same header and size
    cannot be told from the one whose layers are held, so the node says so (once, at the open)."""
    import logging

    server.etag = None
    caplog.set_level(logging.WARNING, logger="node.models.partial")
    _store, manifest = await async_open_partial(server.url, tmp_path / "m.partial")
    assert manifest.validator is None
    warned = [r.getMessage() for r in caplog.records if "names no version" in r.getMessage()]
    assert len(warned) == 1 and server.url.split("?")[0].rsplit("/", 1)[0] in warned[0], warned
