"""A peer that completes TCP and TLS and then never sends its HELLO (a frozen or overloaded node, a
proxy holding the connection): the dial times out after HANDSHAKE_TIMEOUT_S, and the log and the
peer's last_error said "closed the connection during set-up", which it never did. They say it
timed out, naming the timeout."""

from __future__ import annotations

import asyncio
import logging

from node import const
from node.net._peercache import PEER_CACHE_FILE
from tests.support.waiting import wait_until

from .test_links import linked
from .util import addr


async def test_a_peer_that_never_sends_its_hello_is_said_to_time_out(make_manager, fast_net, monkeypatch, caplog,
                                                              tmp_path):
    monkeypatch.setattr(const, "HANDSHAKE_TIMEOUT_S", 0.5)
    caplog.set_level(logging.DEBUG, logger="node.net")
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b), what="a and b linked")
    port, b_id = b.listen_port, b.node_id
    await b.async_stop()
    (tmp_path / "b" / PEER_CACHE_FILE).unlink(missing_ok=True)  # it does not dial a itself
    # b again (same identity, same port): it takes connections and does TLS, then sends nothing
    mute = await make_manager("b", start=False, peer_port=port)
    assert mute.node_id == b_id

    async def never_hello(stream, node_id, **_kw):
        try:
            await asyncio.Event().wait()
        finally:
            stream.abort()
    mute.inbound._establish = never_hello
    await mute.async_start()

    def said() -> str | None:
        err = (a.peer(b_id).last_error or "") if a.peer(b_id) else ""
        return err if "HELLO" in err or "set-up" in err else None
    err = await wait_until(said, 20, 0.05, "a's redial of b failing in set-up")
    assert "closed the connection" not in err, err
    assert f"sent no HELLO within {const.HANDSHAKE_TIMEOUT_S:g} s" in err and "timed out" in err, err
    assert err.startswith("no answer since "), err  # a timeout: it says since when it was heard
    logged = [r.getMessage() for r in caplog.records if "dial failed" in r.getMessage()]
    assert logged and all("closed the connection" not in m for m in logged), logged
    assert any("sent no HELLO" in m for m in logged), logged
