"""`swarmllm peers` prints what peers advertise: a model's name is a member's word (a HELLO's
`models` are objects of any content), and it went to the user's terminal as sent (2026-12-07): a
hostile member's name with terminal escapes (clear the screen, set the window title, OSC 52 writes
the clipboard on some terminals) or a newline (a forged row: `abcd1234 connected ...`) reached the
terminal of whoever listed the peers. Printed now as logs and reports quote a peer's text
(`clean_text`: one line, control characters escaped)."""

from __future__ import annotations

import pytest

from node.net._messages import Hello
from tests.support.processes import NodeProcess
from tests.support.waiting import wait_until_sync

from .rawclient import RawPeer
from .test_refusal_hint import _cli

pytestmark = pytest.mark.slow

EVIL = "evil\x1b[2J\x1b]0;pwned\x07\nfeedbeef connected  direct     0.1 127.0.0.1:1 forged[0-1]"


class AdvertisingPeer(RawPeer):
    """A member whose full HELLO (the second it sends) advertises a model named EVIL."""

    sent = 0

    def hello_frame(self, nonce: str = "0" * 32):
        self.sent += 1
        if self.sent == 1:
            return super().hello_frame(nonce)  # the minimal one, before admission
        return Hello(node_id=self.identity.node_id, boot_id="fuzz", agent="fuzzer/1", listen_port=0,
                     link_nonce="fuzz", swarm=self.swarm.public_id, epoch=self.swarm.epoch, member_nonce=nonce,
                     models=({"name": EVIL, "whole": True},)).to_frame()


def test_swarmllm_peers_never_prints_a_peer_s_control_characters(tmp_path):
    node = NodeProcess(tmp_path / "victim", args=["--no-default-model", "--no-mdns"])
    try:
        node.wait_ready(path="/health")
        raw = AdvertisingPeer(tmp_path, "127.0.0.1", node.peer_port)
        sock, _ = raw.linked()
        wait_until_sync(lambda: (node.peer(raw.identity.node_id) or {}).get("models"), 20, 0.2, "the advert")
        out = _cli(node, "peers")
        assert "\x1b" not in out and "\x07" not in out, repr(out)
        assert not any(line.startswith("feedbeef") for line in out.splitlines()), out  # no forged row
        assert "evil" in out and "forged[0-1]" in out  # the name is shown, escaped, on its own row
        sock.close()
    finally:
        node.terminate()
