"""The order of this host's addresses (node.net._mdns.local_ipv4_addresses): the default route's
first, container and VM bridges last, whatever the platform calls them. On Windows adapters are
named by GUID, so only their display names ("vEthernet (WSL)", "VirtualBox Host-Only Network")
say they are virtual: a WSL or VirtualBox address went ahead of the Wi-Fi's in invites (found
in review). The adapters are ifaddr's own objects; the multi-host ordering is tested for real in
test_netns_addrorder.py."""

from __future__ import annotations

import ifaddr

from node.net import _mdns


def _adapter(name: str, nice: str, ip: str) -> ifaddr.Adapter:
    return ifaddr.Adapter(name, nice, [ifaddr.IP(ip, 24, nice)])


def test_virtual_adapters_go_last_by_name_or_display_name(monkeypatch):
    adapters = [
        _adapter("{7A1C5D2E-0000-4C4B-9F00-000000000001}", "vEthernet (WSL)", "172.24.0.1"),
        _adapter("{7A1C5D2E-0000-4C4B-9F00-000000000002}", "VirtualBox Host-Only Ethernet Adapter", "192.168.56.1"),
        _adapter("docker0", "docker0", "172.17.0.1"),
        _adapter("{7A1C5D2E-0000-4C4B-9F00-000000000003}", "Tailscale", "100.64.0.5"),
        _adapter("{7A1C5D2E-0000-4C4B-9F00-000000000004}", "Wi-Fi", "192.168.1.20"),
        _adapter("lo", "lo", "127.0.0.1"),
    ]
    monkeypatch.setattr(_mdns.ifaddr, "get_adapters", lambda: adapters)
    monkeypatch.setattr(_mdns, "default_route_ipv4", lambda: "192.168.1.20")
    assert _mdns.local_ipv4_addresses() == ["192.168.1.20", "100.64.0.5", "172.24.0.1", "192.168.56.1",
                                            "172.17.0.1"]
