"""A peer of a version before remote embeddings (e709e55, 2026-12-05) advertising a model whole:
it answers EMBED (26) with an ERROR `unsupported_frame_type` that names no type and carries no
request id. The asker fails the attempt as soon as that ERROR comes (until 2026-12-07 it waited
out its silence deadline: `503 … deadline: sent nothing for 2.1 s` and a WARNING on every
request), ends with a 503 saying the peer's version has no remote embeddings, and does not send
that peer EMBED again while it runs the same process."""

from __future__ import annotations

import threading

import openai
import pytest

from node.net import Frame, FrameType, Hello
from node.net._frames import frame_bytes
from tests.net.rawclient import RawPeer, read_frame
from tests.pipeline.swarm import run, start_coordinator, start_whole_node, wait_for_route, wait_peers
from tests.pipeline.test_remote_generate import whole_model
from tests.support.processes import NodeProcess
from tests.support.swarm import TEST_SWARM
from tests.support.waiting import wait_until_sync

pytestmark = [pytest.mark.llama, pytest.mark.slow]


class OldPeer:
    """A raw peer answering as e709e55 did: PING with PONG, every other frame type it lacks
    (EMBED, EMBED_CANCEL) with ERROR {code, message} and request id 0; it counts what it got."""

    def __init__(self, tmp_path, node: NodeProcess, adverts: list[dict]):
        self.raw = RawPeer(tmp_path, "127.0.0.1", node.peer_port)
        self.sock, _ = self.raw.linked()
        me = self.raw.identity.node_id
        self.sock.sendall(frame_bytes(Hello(node_id=me, boot_id="fuzz", agent="swarmllm/old", listen_port=0,
                                            models=tuple(adverts), swarm=TEST_SWARM.public_id,
                                            epoch=TEST_SWARM.epoch, member_nonce="0" * 32).to_frame()))
        self.got: list[int] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while True:
                frame = read_frame(self.sock)
                if frame.type == FrameType.PING:
                    self.sock.sendall(frame_bytes(frame.reply(FrameType.PONG)))
                elif frame.type in (FrameType.EMBED, FrameType.EMBED_CANCEL):
                    self.got.append(frame.type)
                    self.sock.sendall(frame_bytes(Frame(FrameType.ERROR, {
                        "code": "unsupported_frame_type",
                        "message": f"frame type UNKNOWN({frame.type}) is not served by this node"},
                        b"", frame.request_id, 1 if frame.request_id else 0)))
        except OSError:
            return  # closed


def test_an_old_holder_refusing_embed_is_left_out_at_once_with_a_clear_503(tmp_path):
    model = whole_model(tmp_path)
    h1 = start_whole_node(tmp_path, "h1", model)
    c = start_coordinator(tmp_path, h1)
    old = None
    try:
        async def ready():
            await h1.async_wait_ready()
            await c.async_wait_ready()
            await wait_peers(c, 1)
            return await wait_for_route(c, "whole6")
        model_id = run(ready())
        advert = next(dict(m) for p in c.peers() for m in p["models"] if m.get("whole"))
        old = OldPeer(tmp_path, c, [advert])
        me = old.raw.identity.node_id
        wait_until_sync(lambda: bool((c.peer(me) or {}).get("models")), 30, 0.1, "the old peer's advert")
        h1_id = next(p["node_id"] for p in c.peers() if p["node_id"] != me)
        h1.terminate()  # the old peer is the only holder now (its header stays known here)
        wait_until_sync(lambda: (c.peer(h1_id) or {}).get("state") != "connected", 30, 0.1, "h1 gone")

        api = openai.OpenAI(base_url=c.base + "/v1", api_key=c.api_key, max_retries=0, timeout=60)
        for attempt in (1, 2):
            with pytest.raises(openai.APIStatusError) as err:
                api.embeddings.create(model=model_id, input="an old peer")
            message = err.value.body["message"] if isinstance(err.value.body, dict) else str(err.value.body)
            assert err.value.status_code == 503, (attempt, err.value.status_code, message)
            assert "without remote embeddings" in message and "update" in message, (attempt, message)
            assert me[:8] in message, message
            assert "sent nothing" not in message, message
            # asked once, on the first request only; no EMBED_CANCEL after its refusal either
            assert old.got == [FrameType.EMBED], (attempt, old.got)
        failed = [line for line in c.node_log().splitlines() if "remote embeddings attempt failed" in line]
        assert len(failed) == 1 and "cause=old_version" in failed[0], failed
    finally:
        if old is not None:
            old.sock.close()
        for p in (c, h1):
            p.terminate()
