"""A bootstrap address that does not answer (the node it names is off for the night) is retried
with backoff for ever. Each retry was a WARNING in node.log: 120 an hour at the 30 s cap, 720 for
a relay (5 s cap), and after a day the file was that line. Now the first failure of a run (and a
different error) is the WARNING; the retries are DEBUG; a success starts a new run."""

from __future__ import annotations

import logging

from tests.support.ports import free_port
from tests.support.waiting import wait_until

from .test_links import linked
from .util import addr


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "bootstrap dial failed" in r.getMessage()]


async def test_a_dead_bootstrap_is_one_warning_not_one_per_retry(make_manager, fast_net, caplog):
    caplog.set_level(logging.DEBUG, logger="node.net")
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    await make_manager("a", bootstrap=[dead])

    def retries() -> int:
        return sum(1 for r in caplog.records if "bootstrap dial failed" in r.getMessage())
    await wait_until(lambda: retries() >= 6, 30, 0.05, "six failed dials of the dead bootstrap address")
    assert len(_warnings(caplog)) == 1, _warnings(caplog)
    assert "failures=1" in _warnings(caplog)[0]


async def test_a_bootstrap_that_comes_back_and_goes_again_warns_again(make_manager, fast_net, caplog):
    caplog.set_level(logging.DEBUG, logger="node.net")
    b = await make_manager("b")
    port = b.listen_port
    a = await make_manager("a", bootstrap=[addr(b)])
    await wait_until(lambda: linked(a, b), 20, 0.05, "a and b linked")
    await b.async_stop()

    def failed() -> int:
        return sum(1 for r in caplog.records if "bootstrap dial failed" in r.getMessage())
    await wait_until(lambda: failed() >= 4, 30, 0.05, "a redialling the stopped bootstrap")
    assert len(_warnings(caplog)) == 1, _warnings(caplog)
    b2 = await make_manager("b", peer_port=port)  # the same node back on its port
    await wait_until(lambda: linked(a, b2), 30, 0.05, "a and b linked again")
    await b2.async_stop()
    await wait_until(lambda: len(_warnings(caplog)) == 2, 30, 0.05, "a new run of failures warned once more")
    assert "failures=1" in _warnings(caplog)[1], _warnings(caplog)
