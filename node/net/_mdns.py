"""LAN discovery with zeroconf's asyncio API: service `_swarmllm._tcp.local.`.

We announce one service per node, TXT `id` (node id), `pv` (protocol version), `port` (peer
port), `sw` (the day's keyed hash of our swarm id: only members can compute or recognise it), `d`
(the day `sw` is for, on the sender's clock), on the node's non-loopback IPv4 addresses, and browse
for others; a node whose `sw` is not one of our swarm's is not dialled at all (one whose `sw` is our
swarm's for a `d` far from our day is a member with a wrong clock: dialled, and warned about once
its HELLO is admitted, see `_clock.py`). Our own announcement is
recognised by its node id and ignored. zeroconf binds every interface with an IPv4 address
(`InterfaceChoice.All`), which is what a network namespace with veth links needs; loopback has
no multicast, so two nodes on 127.0.0.1 only find each other through bootstrap or the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Callable

import ifaddr
from zeroconf import IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from node import const
from node.logs import kv

from ._addr import format_addr
from ._identity import is_node_id, short_id
from ._messages import PROTOCOL_VERSION

log = logging.getLogger(__name__)

SERVICE_TYPE = "_swarmllm._tcp.local."

Found = Callable[[str, list[str]], None]  # (node id, ["host:port", ...])


# interfaces that are rarely how another machine reaches this one: container and VM bridges, veth ends
_VIRTUAL_PREFIXES = ("docker", "br-", "veth", "virbr", "vboxnet", "vmnet", "cni", "flannel", "podman", "lxc", "lxd")
# Windows names adapters by GUID: their display names say it ("vEthernet (WSL)", "VirtualBox Host-Only ...")
_VIRTUAL_WORDS = ("vethernet", "virtualbox", "vmware", "hyper-v", "wsl")


def _virtual(name: str, nice_name: str) -> bool:
    name, nice = name.lower(), nice_name.lower()
    return name.startswith(_VIRTUAL_PREFIXES) or nice.startswith(_VIRTUAL_PREFIXES) \
        or any(w in nice for w in _VIRTUAL_WORDS)
_ROUTE_PROBE = ("198.51.100.1", 9)  # TEST-NET-2: routed like any internet address, never sent to


def local_ipv4_addresses() -> list[str]:
    """This host's IPv4 addresses other than loopback and link-local (blocking, fast), most likely
    reachable first: the default route's source address, then the other interfaces in the host's
    order, container/VM bridges last. Start-up and the address-change check both use this order;
    an invite keeps the first four (until 2026-12-06 a change sorted them as text, so 10.x, 100.64.x
    and 172.x bridges and VPNs went ahead of 192.168.x and invites could lack the LAN address)."""
    found: list[tuple[str, bool]] = []  # (address, a container/VM bridge)
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if not isinstance(ip.ip, str):
                continue
            addr = ipaddress.ip_address(ip.ip)
            if addr.is_loopback or addr.is_link_local:
                continue
            if all(ip.ip != a for a, _ in found):
                found.append((ip.ip, _virtual(str(adapter.name), str(getattr(adapter, "nice_name", "") or ""))))
    default = default_route_ipv4()
    found.sort(key=lambda f: (f[0] != default, f[1]))
    return [a for a, _ in found]


def default_route_ipv4() -> str | None:
    """The address this host sends from to the internet (its default route), or None without one.
    A UDP connect only picks the route: nothing is sent."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(_ROUTE_PROBE)
            return sock.getsockname()[0]
    except OSError:
        return None


class MdnsDiscovery:
    """Announce this node and report others through `on_found`."""

    def __init__(self, node_id: str, peer_port: int, on_found: Found, addresses: list[str], *,
                 tag: Callable[[], tuple[str, int]], accept: Callable[[str, str, str | None], bool]):
        self.node_id = node_id
        self._tag = tag  # this node's swarm tag for today and the day it is for (TXT "sw", "d")
        self._accept = accept  # (node id, TXT "sw", TXT "d"): is it a member of our swarm?
        self.peer_port = peer_port
        self.addresses = addresses
        self._on_found = on_found
        self._azc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._registering: asyncio.Task[None] | None = None
        self.failed = False  # the registration failed (browsing still works)

    async def async_start(self) -> None:
        """Bind zeroconf and start browsing; the registration (probing for the name, then announcing:
        ~1.6 s) goes on in the background, so the node's API does not wait for it. `failed` is set
        when it did not succeed (the address check tries again)."""
        self._azc = AsyncZeroconf(ip_version=IPVersion.V4Only)
        try:
            name = f"swarmllm-{self.node_id[:16]}.{SERVICE_TYPE}"
            self._info = self._service_info(name)
            self._browser = AsyncServiceBrowser(self._azc.zeroconf, SERVICE_TYPE, handlers=[self._on_change])
        except BaseException:  # failed or cancelled: its sockets and thread go (a restart may follow)
            azc, self._azc, self._info = self._azc, None, None
            await asyncio.shield(azc.async_close())
            raise
        self._registering = asyncio.create_task(self._async_register(), name="mdns-register")

    async def _async_register(self) -> None:
        assert self._azc is not None and self._info is not None
        started = time.monotonic()
        try:
            await (await self._azc.async_register_service(self._info, allow_name_change=True))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - browsing goes on; the address check registers again
            self.failed = True
            log.warning("DIAG: mdns failed to register %s", kv(error=f"{type(exc).__name__}: {exc}"))
            return
        log.info("DIAG: mdns started %s", kv(service=SERVICE_TYPE, addresses=",".join(self.addresses),
                                            port=self.peer_port, elapsed_ms=round((time.monotonic() - started) * 1000)))

    async def _async_registered(self) -> bool:
        """Wait for the background registration; True when it succeeded."""
        if self._registering is not None:
            await asyncio.wait({self._registering})  # the caller's own cancel still reaches it
        return not self.failed and self._registering is not None and not self._registering.cancelled()

    def _service_info(self, name: str) -> AsyncServiceInfo:
        tag, day = self._tag()
        return AsyncServiceInfo(
            SERVICE_TYPE, name, port=self.peer_port,
            properties={"id": self.node_id, "pv": str(PROTOCOL_VERSION), "port": str(self.peer_port),
                        "sw": tag, "d": str(day)},
            addresses=[socket.inet_aton(a) for a in self.addresses],
            server=f"swarmllm-{short_id(self.node_id)}.local.",
        )

    async def async_update_tag(self) -> None:
        """Announce the current swarm tag (the swarm changed, or a new day began)."""
        if self._azc is None or self._info is None or not await self._async_registered():
            return  # not announced: nothing to update (a new registration takes the tag then)
        self._info = self._service_info(self._info.name)
        await (await self._azc.async_update_service(self._info))
        log.debug("DIAG: mdns swarm tag updated")

    async def async_stop(self) -> None:
        """Unregister, stop browsing, close zeroconf."""
        for task in list(self._tasks):
            task.cancel()
        registered = False
        if self._registering is not None:
            self._registering.cancel()  # still probing: nothing to say goodbye for
            with contextlib.suppress(asyncio.CancelledError):
                await self._registering
            registered = not self._registering.cancelled() and not self.failed
        if self._browser is not None:
            await self._browser.async_cancel()
        if self._azc is not None:
            try:
                if self._info is not None and registered:
                    await (await self._azc.async_unregister_service(self._info))
            except Exception:  # closing anyway; a failed goodbye only delays others' cache expiry
                log.debug("mdns unregister failed", exc_info=True)
            await self._azc.async_close()
        self._azc = self._browser = None

    def _on_change(self, zeroconf: Zeroconf, service_type: str, name: str,
                   state_change: ServiceStateChange) -> None:
        if state_change in (ServiceStateChange.Added, ServiceStateChange.Updated):
            task = asyncio.create_task(self._async_resolve(service_type, name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _async_resolve(self, service_type: str, name: str) -> None:
        assert self._azc is not None
        info = AsyncServiceInfo(service_type, name)
        if not await info.async_request(self._azc.zeroconf, const.MDNS_RESOLVE_TIMEOUT_MS):
            log.debug("DIAG: mdns service did not resolve %s", kv(name=name))
            return
        props = {k.decode(errors="replace"): (v or b"").decode(errors="replace")
                 for k, v in (info.properties or {}).items()}
        node_id = props.get("id")
        if not is_node_id(node_id) or node_id == self.node_id:
            return  # our own announcement, or not one of ours
        if props.get("pv") != str(PROTOCOL_VERSION):
            log.debug("Not dialling a peer that does not speak SwarmLLM %s",
                      kv(peer_id=short_id(node_id), site="mdns", protocol_version=props.get("pv")))
            return
        if not self._accept(node_id, props.get("sw", ""), props.get("d")):
            log.debug("DIAG: mdns found a node of another swarm, not dialling it %s", kv(peer_id=short_id(node_id)))
            return
        port = info.port or 0
        addrs = [format_addr(a, port) for a in info.parsed_addresses(IPVersion.V4Only)]
        log.debug("DIAG: mdns found peer %s", kv(peer_id=short_id(node_id), addrs=",".join(addrs)))
        if addrs:
            self._on_found(node_id, addrs)
