"""IPv6 addresses that carry an IPv4 address are judged by it (review r31, 2026-12-07): only
::ffff:a.b.c.d was unwrapped, so NAT64's 64:ff9b::a00:1 (10.0.0.1 on an IPv6-only network with
NAT64), 6to4's 2002:7f00:1::1 (127.0.0.1), the IPv4-compatible ::127.0.0.1 and the IPv4-translated
::ffff:0:7f00:1 counted as global hosts: an origin there, or a redirect there, was asked and could
be public while it reached a LAN or loopback IPv4 host. Forms whose IPv4 address is global still
count; deprecated or local-use forms never do."""

from __future__ import annotations

import pytest

from node.models.download.public import _global, async_origin_public

NOT_GLOBAL = [
    "64:ff9b::a00:1",  # NAT64 to 10.0.0.1
    "64:ff9b::7f00:1",  # NAT64 to 127.0.0.1
    "64:ff9b::c0a8:105",  # NAT64 to 192.168.1.5
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a00:1::1",  # 6to4 of 10.0.0.1
    "::127.0.0.1",  # IPv4-compatible
    "::8.8.8.8",  # IPv4-compatible (deprecated): not global whatever it holds
    "::ffff:0:7f00:1",  # IPv4-translated
    "::ffff:0:808:808",
    "64:ff9b:1::a00:1",  # local-use NAT64 (RFC 8215)
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    "::ffff:10.0.0.1",  # IPv4-mapped (as before)
]
GLOBAL = ["64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8", "2606:4700::1111", "8.8.8.8"]


@pytest.mark.parametrize("address", NOT_GLOBAL)
def test_an_ipv6_form_of_a_private_ipv4_is_not_global(address):
    assert not _global(address)


@pytest.mark.parametrize("address", GLOBAL)
def test_an_ipv6_form_of_a_global_ipv4_is_global(address):
    assert _global(address)


@pytest.mark.parametrize("address", NOT_GLOBAL)
async def test_an_origin_there_is_not_public(address):
    """Decided from the address alone (`lan_host`), without connecting anywhere."""
    assert await async_origin_public(f"https://[{address}]/m.gguf", sent_token=False, size=10) is False
