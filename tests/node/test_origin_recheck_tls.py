"""A download's origin check made again at a later start (its first one could not be made) that
meets a certificate failing its check stays `unchecked`, asked again at the next start: that start's
network may be another one (a captive portal, an HTTPS-inspecting office proxy, a clock set wrong),
not the network that fetched the file. Right after a download the same failure is the origin's: not
public, for good (test_download_tls.py). Review r28, finding 4: the later check recorded it not
public for good too, so a file downloaded at home and first checked again behind an office proxy
was never shared while unloaded.

Driven on the real OriginChecks, ModelCatalog and hash cache, against a real HTTPS origin whose
self-signed certificate no client trusts (tests/support/tlsorigin.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging

from node.datadir import MODELS_DIR
from node.inference.synth import write_gguf
from node.models.catalog import HASH_CACHE_FILE, ModelCatalog
from node.models.download.public import async_origin_public
from node.models.hash_cache import UNCHECKED, HashCache
from node.origin_checks import OriginChecks
from tests.support.nodes import TINY, node_config
from tests.support.tlsorigin import UntrustedOrigin
from tests.support.waiting import wait_until


def _unchecked(catalog: ModelCatalog) -> list[tuple]:
    return [(path, sha, record.url, record.token_sent) for path, sha, record in catalog.unchecked_origins()]


def _public(data_dir, path) -> object:
    records = json.loads((data_dir / HASH_CACHE_FILE).read_text(encoding="utf-8"))
    return records[str(path.resolve())].get("public")


async def test_a_certificate_failure_at_a_later_starts_recheck_stays_unchecked(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="node.models.download.public")
    origin = UntrustedOrigin(tmp_path)
    await origin.start()
    data_dir = tmp_path / "data"
    config = node_config(data_dir, public_lan_origins=True)  # the origin is on 127.0.0.1
    path = write_gguf(data_dir / MODELS_DIR / "tiny.gguf", TINY)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    cache = HashCache(data_dir / HASH_CACHE_FILE)  # as a download that sent a token recorded it: its check could not be made
    cache.remember(path, sha, origin.url("tiny.gguf"))
    assert cache.set_public(path, sha, None, sent_token=True)
    catalog = ModelCatalog(data_dir)
    await catalog.async_scan([(path, "data_dir")])
    assert _unchecked(catalog) == [(path.resolve(), sha, origin.url("tiny.gguf"), True)]
    announced: list[int] = []

    async def announce() -> None:
        announced.append(1)

    checks = OriginChecks(config, catalog, announce)
    try:
        checks.recheck_unchecked()  # as a later start does
        await wait_until(lambda: "DIAG: model origin checked" in caplog.text, 30, 0.05, "the check made again")
        assert origin.handshakes, "the origin was not asked"
        await checks.async_stop()  # waits for the check's record to be written
        assert "why=tls_certificate" in caplog.text, caplog.text
        assert _public(data_dir, path) == UNCHECKED  # not False: asked again at the next start
        assert _unchecked(catalog) == [(path.resolve(), sha, origin.url("tiny.gguf"), True)]
        assert not announced and not catalog.entries[next(iter(catalog.entries))].origin_public
        # right after a download the same failure is the origin's: not public, for good
        assert await async_origin_public(origin.url("tiny.gguf"), sent_token=True, lan_ok=True) is False
        assert await async_origin_public(origin.url("tiny.gguf"), sent_token=True, lan_ok=True, recheck=True) is None
    finally:
        await checks.async_stop()
        await asyncio.shield(origin.stop())
