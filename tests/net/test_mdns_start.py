"""mDNS registration runs beside the node's start (node.net._mdns.MdnsDiscovery): zeroconf probes the
name and announces it for ~1.6 s, which the API used to wait for at every start. Real zeroconf on this
host's own non-loopback address."""

from __future__ import annotations

import asyncio
import logging

import pytest

from node.net._mdns import MdnsDiscovery, local_ipv4_addresses
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio

NODE_ID = "ab" * 32


def _discovery(addresses: list[str], port: int = 40999) -> MdnsDiscovery:
    return MdnsDiscovery(NODE_ID, port, lambda node_id, addrs: None, addresses,
                         tag=lambda: ("tag", 1), accept=lambda *a: False)


@pytest.fixture
def addresses():
    found = local_ipv4_addresses()
    if not found:
        pytest.skip("no non-loopback IPv4 address on this host")
    return found[:1]


async def test_start_returns_before_the_announcement_and_it_follows(addresses, caplog):
    caplog.set_level(logging.INFO, logger="node.net._mdns")
    mdns = _discovery(addresses)
    await mdns.async_start()
    try:
        # probing alone takes three 250 ms rounds (RFC 6762): start returned while it runs
        assert not any("mdns started" in r.getMessage() for r in caplog.records)
        assert mdns._registering is not None and not mdns._registering.done()
        await wait_until(lambda: any("DIAG: mdns started" in r.getMessage() for r in caplog.records), 20, 0.05,
                         "the announcement")
        assert not mdns.failed
        await mdns.async_update_tag()  # registered: the tag update goes out
    finally:
        await mdns.async_stop()
    assert mdns._azc is None


async def test_stop_while_still_probing_closes_everything(addresses, caplog):
    caplog.set_level(logging.DEBUG, logger="node.net._mdns")
    mdns = _discovery(addresses, 40998)
    await mdns.async_start()
    assert not mdns._registering.done()
    await asyncio.wait_for(mdns.async_stop(), 10)
    assert mdns._azc is None and mdns._registering.cancelled()
    messages = [r.getMessage() for r in caplog.records]
    assert not any("mdns started" in m or "unregister failed" in m or "failed to register" in m for m in messages)


async def test_a_tag_update_cancelled_while_registering_is_cancelled(addresses, caplog):
    """A swarm change (or the daily retag) cancelled in the first seconds after a start: the cancel
    reaches it (it used to be swallowed, and the update went out to a name still being probed)."""
    caplog.set_level(logging.DEBUG, logger="node.net._mdns")
    mdns = _discovery(addresses, 40997)
    await mdns.async_start()
    try:
        update = asyncio.create_task(mdns.async_update_tag())
        await asyncio.sleep(0.05)
        assert not update.done() and not mdns._registering.done()
        update.cancel()
        with pytest.raises(asyncio.CancelledError):
            await update
        assert not mdns._registering.done()  # the registration itself goes on
        await wait_until(lambda: mdns._registering.done(), 20, 0.05, "the registration")
        assert not mdns.failed
        assert not any("swarm tag updated" in r.getMessage() for r in caplog.records)
    finally:
        await mdns.async_stop()
