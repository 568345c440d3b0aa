"""A partial model opened from the swarm's header (no origin reachable then) when its origin comes
back: the layers taken from a peer are spot-checked against it and the missing ones fetched from it,
keeping what is held. Until 2026-12-06 the unknown validator read as another version: the first
origin fetch dropped every part (`model origin changed, fetching again from zero`) and the checks
never ran."""

from __future__ import annotations

import hashlib
import logging

from node.inference.pipeline.part_server import PartServer
from node.inference.pipeline.partials import PartialModels
from node.models.catalog import HashCache, scan_entry
from node.models.download.urls import display_url, resolve_url
from node.models.partial import async_fetch_parts, async_open_partial, parts_for
from node.models.partial.fromheader import create_from_header
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.pipeline.test_whole_parts_bound import _Catalog, _Peers
from tests.support.rangeserver import ThreadedOrigin


async def test_the_origin_back_checks_the_peers_layers_and_keeps_them(tmp_path, model, caplog):  # noqa: F811
    data = model.read_bytes()
    with ThreadedOrigin(data) as origin:
        # A fetched layers 0-1 from the origin earlier (checked): it serves them to peers
        a_store, a_manifest = await async_open_partial(origin.url, tmp_path / "a.partial")
        a_entry = scan_entry(a_store.dir, "data_dir", HashCache(None))
        await async_fetch_parts(a_store, a_manifest, parts_for(a_entry.header, 0, 2))
        a_entry = scan_entry(a_store.dir, "data_dir", HashCache(None))
        header = a_store.header_path.read_bytes()
        # B made its partial model from A's header while the origin was out of reach
        b_dir = create_from_header(tmp_path / "b.partial", header, a_entry.header, sha256=a_manifest.sha256,
                                   header_sha256=hashlib.sha256(header).hexdigest(), size_bytes=len(data),
                                   origin_url=display_url(resolve_url(origin.url)))
        b = scan_entry(b_dir, "data_dir", HashCache(None))
        partials = PartialModels(tmp_path)
        partials.attach(_Peers(PartServer(_Catalog(a_entry))), lambda _sha: [("a" * 64, 0, 2)])
        origin.close()
        await partials.async_fetch(b, 0, 2)
        taken = set(b.partial.complete)
        assert taken and b.partial.unchecked == taken  # from A, not checked: the origin is gone

    with ThreadedOrigin(data) as back, caplog.at_level(logging.INFO):  # the origin back (another port)
        # (the stand-in cannot take the old port again: B is pointed at the new one, as if the same URL)
        partials._urls[b.path] = back.url
        b.partial.origin_url = display_url(resolve_url(back.url))
        await partials.async_fetch(b, 0, 4)  # layers 2-3: only the origin has them
        assert "fetching again from zero" not in caplog.text
        assert taken <= set(b.partial.complete) and not b.partial.unchecked  # checked, and kept
        layer_bytes = sum(t.n_bytes for t in b.partial.tensors.values() if t.part in {"layer-0002", "layer-0003"})
        assert back.sent < layer_bytes + len(header) + 3 * (64 << 10) + (256 << 10)  # not the held layers again
    held = b_dir / "parts"
    for t in b.partial.tensors.values():
        if t.part in b.partial.complete:
            raw = (held / f"{t.part}.bin").read_bytes()
            assert raw[t.local:t.local + t.n_bytes] == data[t.offset:t.offset + t.n_bytes], t.name
