"""The first request to a model's origin (the header probe) broken off mid-body: the open failed
at once, so `swarmllm run --model URL --layers A-B` exited ("cannot start the node: probing …
failed: ClientPayloadError"), where every later range is asked again up to DOWNLOAD_RETRIES times
(found by driving a real node against an origin dropping one connection, 2026-12-06)."""

from __future__ import annotations

import pytest

from node.models.partial import async_open_partial
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.rangeserver import ThreadedOrigin

pytestmark = pytest.mark.usefixtures("fast_retries")


async def test_a_probe_broken_off_once_is_asked_again(tmp_path, model):  # noqa: F811
    with ThreadedOrigin(model.read_bytes()) as origin:
        origin.drop_after = 1000  # the first answer ends after 1000 bytes
        store, manifest = await async_open_partial(origin.url, tmp_path / "m.partial")
        assert origin.drop_cut == 1000 and len(origin.ranges) >= 2
        assert store.header_path.read_bytes() == model.read_bytes()[:manifest.header_bytes]
