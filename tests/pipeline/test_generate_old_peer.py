"""A peer of a version before remote generate (2026-12-02) advertising a model whole: it answers
GENERATE (22) with an ERROR `unsupported_frame_type` that names no type and carries no request id.
The coordinator fails that attempt as soon as the ERROR comes (with no other holder: a 503 saying
the peer's version has no remote generation) and does not send that peer GENERATE (nor
GENERATE_CANCEL) again while it runs the same process, not even once a holder of this version
joins and the old peer still advertises the cheapest route. Until 2026-12-07 no one listened for that ERROR
in the coordinator: every request sent the old peer GENERATE, waited out its silence budget
(GENERATE_SILENCE_S + its ACK budget), charged it `tokens_deadline`, sent it GENERATE_CANCEL, and
only then failed over (or, alone, ended in `503 … no TOKENS from … for 2.1 s`). (Remote embeddings
do the same for EMBED: test_embed_old_peer.py.)"""

from __future__ import annotations

import hashlib
import threading

import openai
import pytest

from node.net import Frame, FrameType, Hello
from node.net._frames import frame_bytes
from tests.net.rawclient import RawPeer, read_frame
from tests.pipeline.swarm import (
    llama_greedy,
    run,
    start_slice_node,
    start_whole_node,
    wait_for_route,
    wait_peers,
)
from tests.pipeline.test_remote_generate import PROMPT, WHOLE, whole_model
from tests.support.processes import NodeProcess
from tests.support.swarm import TEST_SWARM

pytestmark = [pytest.mark.llama, pytest.mark.slow]


class OldPeer:
    """A raw peer answering as a node before 2026-12-02 did: PING with PONG, every frame type it
    lacks (GENERATE, GENERATE_CANCEL) with ERROR {code, message} and request id 0; it counts them."""

    def __init__(self, tmp_path, node: NodeProcess, adverts: list[dict]):
        self.raw = RawPeer(tmp_path, "127.0.0.1", node.peer_port)
        self.sock, _ = self.raw.linked()
        self.node_id = self.raw.identity.node_id
        self.sock.sendall(frame_bytes(Hello(node_id=self.node_id, boot_id="old", agent="swarmllm/old", listen_port=0,
                                            models=tuple(adverts), swarm=TEST_SWARM.public_id,
                                            epoch=TEST_SWARM.epoch, member_nonce="0" * 32).to_frame()))
        self.got: list[int] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            while True:
                frame = read_frame(self.sock)
                if frame.type == FrameType.PING:
                    self.sock.sendall(frame_bytes(frame.reply(FrameType.PONG)))
                elif frame.type in (FrameType.GENERATE, FrameType.GENERATE_CANCEL):
                    self.got.append(frame.type)
                    self.sock.sendall(frame_bytes(Frame(FrameType.ERROR, {
                        "code": "unsupported_frame_type",
                        "message": f"frame type UNKNOWN({frame.type}) is not served by this node"},
                        b"", frame.request_id, 1 if frame.request_id else 0)))
        except OSError:
            return  # closed


def test_an_old_whole_holder_refusing_generate_fails_at_once_and_is_not_asked_again(tmp_path):
    model = whole_model(tmp_path)
    expected = llama_greedy(model, PROMPT, 8)
    # the coordinator holds one layer only (for its tokenizer): the whole holders are the routes
    c = start_slice_node(tmp_path, "c", model, "0-0")
    h = old = None
    try:
        run(c.async_wait_ready())
        sha = hashlib.sha256(model.read_bytes()).hexdigest()
        # the only holder at first; far cheaper than any real one, so planned on first if it were asked again
        old = OldPeer(tmp_path, c, [{"sha256": sha, "name": "whole6", "n_layers": WHOLE.n_layers, "whole": True,
                                     "ms_per_token": 0.001}])
        model_id = run(wait_for_route(c, "whole6"))
        api = openai.OpenAI(base_url=c.base + "/v1", api_key=c.api_key, max_retries=0, timeout=60)

        def ask():
            return api.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                               max_tokens=8, temperature=0)

        for n in (1, 2):
            with pytest.raises(openai.APIStatusError) as err:
                ask()
            message = err.value.body["message"] if isinstance(err.value.body, dict) else str(err.value.body)
            assert err.value.status_code == 503, (n, err.value.status_code, message)
            assert "without remote generation" in message or "has no remote generation" in message, (n, message)
            assert "update" in message and old.node_id[:8] in message, (n, message)
            assert "no TOKENS" not in message, message  # (its silence was waited out)
            # asked once, on the first request only; no GENERATE_CANCEL after its refusal either
            assert old.got == [FrameType.GENERATE], (n, old.got)
        failed = [line for line in c.node_log().splitlines() if "pipeline attempt failed" in line]
        assert len(failed) == 1 and "cause=old_version" in failed[0], failed

        h = start_whole_node(tmp_path, "h", model, bootstrap=[c.peer_port])  # a holder of this version joins
        run(h.async_wait_ready())
        run(wait_peers(c, 2))
        assert (c.peer(old.node_id) or {}).get("state") == "connected"  # still linked, its advert still known
        assert ask().choices[0].message.content == expected
        assert old.got == [FrameType.GENERATE], old.got
        assert "remote generate TIMED OUT" not in c.node_log()
    finally:
        if old is not None:
            old.sock.close()
        for p in (c, h):
            if p is not None:
                p.terminate()
