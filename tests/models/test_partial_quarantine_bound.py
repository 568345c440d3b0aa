"""quarantine/ kept every copy of every part that failed its hash, for ever: a peer sending altered
bytes (its own names or the origin's spot check catch it) is asked again after each restart, a
failing disk corrupts the same part again, and each time another whole part's bytes stayed on disk.
One copy per part (the newest) is kept for a look: quarantine/ never holds more than the model."""

from __future__ import annotations

from node.models.gguf_meta import read_header
from node.models.partial import async_fetch_parts, async_open_partial, parts_for
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.rangeserver import ThreadedOrigin


async def test_a_part_corrupted_again_and_again_keeps_one_quarantined_copy(tmp_path, model):  # noqa: F811
    with ThreadedOrigin(model.read_bytes()) as origin:
        store, manifest = await async_open_partial(origin.url, tmp_path / "m.partial")
        parts = parts_for(read_header(store.header_path), 2, 3)
        part = [p for p in parts if p.startswith("layer-")][0]
        for _ in range(3):
            await async_fetch_parts(store, manifest, parts)  # (the first fetches; later ones quarantine and refetch)
            raw = bytearray(store.part_path(part).read_bytes())
            raw[100] ^= 0xFF  # the disk corrupts a byte of the part
            store.part_path(part).write_bytes(bytes(raw))
        await async_fetch_parts(store, manifest, parts)
        assert manifest.covers(parts)
        kept = sorted((store.dir / "quarantine").iterdir())
        assert len(kept) == 1 and kept[0].name.startswith(part), [p.name for p in kept]
