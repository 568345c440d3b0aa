"""A peer that went silent (a laptop asleep, off the Wi-Fi) is redialled; its last_error says when
it was last heard and the likely why, not only "ADDR: timed out"."""

from __future__ import annotations

import socket
import time

from node import const
from tests.support.waiting import wait_until

from .test_links import linked
from .util import addr


async def test_a_silent_peers_last_error_says_since_when(make_manager, fast_net, monkeypatch):
    monkeypatch.setattr(const, "HANDSHAKE_TIMEOUT_S", 0.5)  # a redial into silence gives up soon
    a = await make_manager("a")
    b = await make_manager("b", bootstrap=[addr(a)])
    await wait_until(lambda: linked(a, b), what="a and b linked")
    port, b_id = b.listen_port, b.node_id
    await b.async_stop()
    # b's address now takes connections and never answers, as a machine whose process is frozen
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    silent.bind(("127.0.0.1", port))
    silent.listen(64)
    try:
        def said() -> str | None:
            err = a.peer(b_id).last_error or ""
            return err if "timed out" in err else None
        err = await wait_until(said, 20, 0.05, "a redial of b timing out")
        heard = a.peer(b_id).last_seen
        assert heard is not None
        since = time.strftime("%H:%M:%SZ", time.gmtime(heard))  # (UTC, as node.log and the report)
        assert err.startswith(f"no answer since {since} (asleep or off the network?): "), err
        assert err.endswith(f"127.0.0.1:{port}: timed out"), err
    finally:
        silent.close()


def test_a_peer_last_heard_on_another_day_is_said_with_its_date():
    """`last_seen` may come from peers.json (a peer heard days ago, redialled after a restart): a bare
    time read as today (found in review)."""
    import time as _time

    from node.net._hints import no_answer_since

    now = _time.time()
    assert _time.strftime("%Y-%m-%d", _time.localtime(now - 3 * 86400)) in no_answer_since(now - 3 * 86400, "x")
    for _ in range(2):  # (a run across midnight: the second try is on the new day)
        now = _time.time()
        today = no_answer_since(now, "x")
        if _time.localtime(now)[:3] == _time.localtime()[:3]:
            break
    assert _time.strftime("%H:%M", _time.localtime(now)) in today and _time.strftime("%Y-", _time.localtime(now)) not in today
