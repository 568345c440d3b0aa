"""An advert's origin is fetched by every node of the swarm, on the advertiser's word, for as many
header bytes as it advertises (up to MODEL_HEADER_MAX_BYTES, 64 MiB), and hash-checked only once
all are here: a hostile member advertising made-up models (a new sha256 costs nothing) whose origin
is any large file on a third party's https server had every node download 64 MiB from it per
advert, again at each retry: the swarm as a bandwidth amplifier, and each node's own data spent
(2026-12-07). A GGUF header starts with `GGUF`: the answer is dropped as soon as its first bytes say
it is not one."""

from __future__ import annotations

import asyncio

import pytest

from node import const
from node.errors import DownloadFailed
from node.inference.headers import HeaderFetcher
from tests.inference.test_headers import Holders, advert
from tests.inference.test_headers import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.rangeserver import ThreadedOrigin

ADVERTISED = 48 << 20  # the header length the advert claims (under the cap)


async def test_an_origin_that_is_not_a_gguf_is_dropped_after_its_first_bytes(model, monkeypatch):  # noqa: F811
    monkeypatch.setattr(const, "MODEL_HEADER_TIMEOUT_S", 60.0)
    junk = b"\x89PNG" + bytes(ADVERTISED)  # a large file that is no model, on someone else's server
    with ThreadedOrigin(junk, name="big.bin") as third_party:
        made_up = advert(model.entry, header_bytes=ADVERTISED, origin_url=third_party.url)
        fetcher = HeaderFetcher(Holders(model.catalog))
        with pytest.raises(DownloadFailed) as failed:
            await fetcher.async_fetch([made_up])
        assert "GGUF" in failed.value.message or "no source" in failed.value.message
        await asyncio.sleep(0)
        assert third_party.sent < 16 << 20, f"{third_party.sent >> 20} MiB downloaded for a made-up advert"
