"""A peer linked through a relay is tried directly at the listen addresses its HELLO announced
(relayed → direct). Those are its word, and it is on another machine (a relayed link): its loopback
is not ours, and a name resolves to what its owner likes. 2026-12-07: they were dialled as given, so
a member behind a relay announcing 127.0.0.1:PORT (or `localhost:PORT`) had this node send the peer
preamble to its own local service, at every upgrade attempt (UPGRADE_BACKOFF_MIN_S..MAX_S); every
node's HELLO lists 127.0.0.1 among its addresses, so any port a remote peer listens on was dialled
on this machine. They now pass the rule PEX addresses pass (`_addr.dialable`, not from loopback)."""

from __future__ import annotations

import asyncio

from node import const
from tests.support.waiting import wait_until

from .test_relay import relayed
from .util import addr


async def test_a_relayed_peer_s_loopback_listen_addresses_are_never_dialled(make_manager, fast_net, monkeypatch):
    monkeypatch.setattr(const, "UPGRADE_FIRST_S", 0.0)
    accepted: list[int] = []

    async def count(_reader, writer):
        accepted.append(1)
        writer.close()

    service = await asyncio.start_server(count, "127.0.0.1", 0)  # this machine's own local service
    port = service.sockets[0].getsockname()[1]
    try:
        r = await make_manager("r", relay=True)
        a = await make_manager("a", relays=[addr(r)], no_direct=True)
        b = await make_manager("b", relays=[addr(r)], no_direct=True)
        b.listen_addrs = [f"127.0.0.1:{port}", f"localhost:{port}", "192.0.2.10:9"]  # (before any HELLO to a)
        await wait_until(lambda: relayed(a, b), what="a and b linked through the relay")
        rec = a.table.get(b.node_id)
        rec.addrs.clear()  # what the relay's PEX shared (it is on this machine): only b's word is left
        a.config.no_direct = False
        rounds = a.discovery.dialer.rounds
        a.discovery.dialer.wake()
        await wait_until(lambda: a.discovery.dialer.rounds >= rounds + 5 or accepted, 10, what="upgrade rounds")
        await wait_until(lambda: not any(k.startswith("upgrade:") for k in a.discovery.dialer._dialing)  # noqa: SLF001
                         or accepted, 10, what="the upgrade attempt over")
        assert not accepted, "the node dialled its own loopback at a relayed peer's word"
        assert a.discovery.dialer._upgrade_candidates(rec, a.link(b.node_id)) == ["192.0.2.10:9"]  # noqa: SLF001
    finally:
        service.close()
        await service.wait_closed()
