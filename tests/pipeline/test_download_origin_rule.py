"""A `public: true` hash cache record decided under an older origin-check rule is not trusted after
the upgrade (review of 2026-12-07): until then only `unchecked` records were checked again at start,
so a file recorded public under the rule that called any redirect to another host public (a private
mirror sending strangers to its SSO's login page) stayed listed in HELLO `files` and handed out for
good. Such a record is not shared and is checked again, once, at start, without a token; one decided
under the current rule (`rule`: PUBLIC_RULE) is trusted as before. A real node on the Hub stand-in
(127.0.0.1: `public_lan_origins`); a real TLS peer on 127.0.0.1 reads its HELLO's `files`."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from node.models.catalog import HASH_CACHE_FILE
from tests.net.rawclient import RawPeer
from tests.pipeline.test_download_origin_public import TOKEN, _checked
from tests.pipeline.test_download_origin_unchecked import PATH, _recorded, _unauthenticated_heads
from tests.pipeline.test_held_file_changed import _files
from tests.support.hubserver import HubServer
from tests.support.nodes import TINY, node_config, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.llama]


def _as_older_rule(data_dir, name: str) -> None:
    """Drop models/<name>'s `rule`, as a record written before the rule was kept (node.models.hash_cache
    PUBLIC_RULE)."""
    path = data_dir / HASH_CACHE_FILE
    records = json.loads(path.read_text(encoding="utf-8"))
    for key, record in records.items():
        if key.endswith("/" + name):
            record.pop("rule", None)
    path.write_text(json.dumps(records), encoding="utf-8")


async def test_a_public_record_of_an_older_rule_is_not_shared_and_is_checked_again(tmp_path):
    hub = HubServer(b"", PATH)  # only its answer to a reader without the token matters
    data_dir = tmp_path / "data"
    private_spec, public_spec = dataclasses.replace(TINY, seed=51), dataclasses.replace(TINY, seed=52)
    # private behind an SSO: a reader without the token is sent to a login page (the older rule: public)
    await hub.start()
    hub.token, hub.login_redirect = TOKEN, True
    hub.hold_head = asyncio.Event()  # the check's HEAD waits: what is shared before it answers
    try:
        private = _recorded(data_dir, "private.gguf", private_spec, hub.hub + PATH, True)
        _as_older_rule(data_dir, "private.gguf")
        current = _recorded(data_dir, "current.gguf", public_spec, hub.hub + "/org/other/resolve/main/c.gguf", True)
        async with running_node(node_config(data_dir, public_lan_origins=True)) as node:
            await wait_until(lambda: _unauthenticated_heads(hub) == 1, 30, 0.05, "the older record checked again")
            peer = RawPeer(tmp_path / "peer", "127.0.0.1", node.peers.listen_port)
            files = await asyncio.to_thread(_files, peer)
            assert private not in files, "a file found public under an older rule was shared before its new check"
            assert current in files  # the current rule's record is trusted, not asked
            hub.hold_head.set()
            await wait_until(lambda: _checked(data_dir, "private.gguf") is False, 30, 0.05, "the new check's record")
            assert await asyncio.to_thread(_files, peer) == (current,)
            assert _unauthenticated_heads(hub) == 1  # the current rule's record was not asked
    finally:
        hub.hold_head.set()
        await hub.stop()
