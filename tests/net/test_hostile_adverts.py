"""What a member's HELLO advertises is its word: the diagnostics report shows it, never fails on it.

Found by hand: a member of the open swarm advertising one model as {"start": 0} (no "end") made
`GET /api/admin/diagnostics` (and `swarmllm diagnostics`) answer 500 with a KeyError traceback in
the log, for as long as the peer stayed in the table (an hour after it left: its last HELLO is
kept); a name with a newline in it forged lines of the report (its peers and swarm coverage
sections), and one of 100 KB was printed whole.
"""

from __future__ import annotations

import pytest

from node.net._frames import frame_bytes
from node.net._messages import Hello
from tests.support.processes import NodeProcess
from tests.support.swarm import TEST_SWARM
from tests.support.waiting import wait_until_sync

from .rawclient import RawPeer

pytestmark = pytest.mark.slow

ADVERTS = (
    {"sha256": "a" * 64, "name": "no end\nFORGED by a peer's model name", "start": 0, "n_layers": 4},
    {"sha256": "b" * 64, "name": "a slice\nFORGED by a coverage name", "start": 0, "end": 4, "n_layers": 4},
    {"sha256": "c" * 64, "name": "x" * 100_000, "whole": True, "n_layers": 4},
    {"sha256": "d" * 64, "name": 5, "start": "0", "end": None, "n_layers": -3},
)


def test_malformed_and_forging_adverts_do_not_break_the_report(tmp_path):
    node = NodeProcess(tmp_path / "victim", args=["--no-default-model", "--no-mdns"])
    try:
        node.wait_ready(path="/health")
        raw = RawPeer(tmp_path, "127.0.0.1", node.peer_port)
        sock, _ = raw.linked()
        me = raw.identity.node_id
        update = Hello(node_id=me, boot_id="fuzz", agent="agent\nFORGED by an agent", listen_port=0,
                       models=ADVERTS, region="r\nFORGED", swarm=TEST_SWARM.public_id,
                       epoch=TEST_SWARM.epoch, member_nonce="0" * 32).to_frame()
        sock.sendall(frame_bytes(update))
        wait_until_sync(lambda: len((node.peer(me) or {}).get("models", [])) == 4, 20, 0.1, "the HELLO update")

        def report() -> str:
            status, body = node.get("/api/admin/diagnostics")
            assert status == 200, body[:500]
            return body.decode()

        text = report()
        assert not [line for line in text.splitlines() if line.startswith("FORGED")], text
        assert "x" * 1000 not in text
        assert me[:8] in text.split("-- peers --")[1].split("--")[0]
        sock.close()
        wait_until_sync(lambda: (node.peer(me) or {}).get("state") == "gone", 30, 0.2, "the peer gone")
        report()  # its last HELLO stays in the table
        assert "Traceback" not in node.output()
    finally:
        node.terminate()
