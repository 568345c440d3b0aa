"""An origin that answers a range with something other than the file — a 200 error page, a
proxy's or a captive portal's reply — while the file itself is unchanged: it was taken for a new
version, every part held was deleted (layers in use included), and the fetch failed with "keeps
changing" (found by driving a real `--layers` node, 2026-12-06: 13 MB of layers gone after one
bad answer; gigabytes on a real model). The origin is asked first; the parts stay."""

from __future__ import annotations

import pytest

from node.errors import DownloadFailed
from node.models.gguf_meta import read_header
from node.models.partial import async_fetch_parts, async_open_partial, parts_for
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.rangeserver import ThreadedOrigin

pytestmark = pytest.mark.usefixtures("fast_retries")


async def test_an_answer_that_is_not_the_file_costs_no_part_held(tmp_path, model):  # noqa: F811
    with ThreadedOrigin(model.read_bytes()) as origin:
        origin.fail_page = True  # a failing range is answered with an HTML page, not the file
        store, manifest = await async_open_partial(origin.url, tmp_path / "m.partial")
        header = read_header(store.header_path)
        held = parts_for(header, 2, 4)
        await async_fetch_parts(store, manifest, held)
        assert manifest.covers(held)
        origin.fail_from = 4096  # the probe's first bytes come through; every layer range is a page
        with pytest.raises(DownloadFailed, match="something other than the file"):
            await async_fetch_parts(store, manifest, parts_for(header, 2, 6))
        assert manifest.covers(held) and all(store.part_path(p).exists() for p in held)
        assert store.load().covers(held)
        origin.fail_from = None
        await async_fetch_parts(store, manifest, parts_for(header, 2, 6))  # the origin is well again
        assert manifest.covers(parts_for(header, 2, 6))
