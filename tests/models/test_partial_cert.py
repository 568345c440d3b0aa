"""A partial model's layer fetch from an origin whose TLS certificate fails its check fails at once,
naming the host and the reason, as downloads do (2026-12-07, review r27: it was tried
DOWNLOAD_RETRIES times, backing off, and said as `failed 6 times; last: ClientConnectorCertificateError`)."""

from __future__ import annotations

import pytest

from node import const
from node.errors import DownloadFailed
from node.models.gguf_meta import read_header
from node.models.partial import async_fetch_parts, async_open_partial, parts_for
from tests.models.test_partial import model as model  # noqa: F401 - the module-scoped GGUF fixture
from tests.support.rangeserver import ThreadedOrigin
from tests.support.tlsorigin import UntrustedOrigin


async def test_layers_from_an_origin_with_an_untrusted_certificate_fail_at_once(tmp_path, model, monkeypatch):  # noqa: F811
    monkeypatch.setattr(const, "DOWNLOAD_RETRY_BASE_S", 0.01)  # without the fix: the retries come quickly
    with ThreadedOrigin(model.read_bytes()) as plain:
        store, manifest = await async_open_partial(plain.url, tmp_path / "m.partial")
    parts = parts_for(read_header(store.header_path), 2, 6)
    origin = UntrustedOrigin(tmp_path)
    await origin.start()
    try:
        manifest.origin_url = origin.url("m.gguf")  # the same file, now behind a certificate no one trusts
        with pytest.raises(DownloadFailed) as failed:
            await async_fetch_parts(store, manifest, parts)
        said = failed.value.message
        assert "the TLS certificate of localhost failed its check" in said and "not tried again" in said, said
        assert "times" not in said, said
        assert len(origin.handshakes) == 1, origin.handshakes  # one try, not DOWNLOAD_RETRIES
        assert not manifest.covers(parts)
    finally:
        await origin.stop()
