"""A remote generation that ran to the end the coordinator asked for (max_tokens, or an
end-of-generation token) is not cancelled on its holder: the holder stops there by itself and
sends its end frame. Until 2026-12-07 the coordinator returned on the last batch and, the end
frame not in yet, sent GENERATE_CANCEL: the holder logged `reason=cancelled` for a generation that
ended normally (test_remote_generate's `reason=length` check failed ~1 run in 6) and got one frame
more per request. A raw holder sends the last batch and holds its end frame back until the request
is over; a PING/PONG after that orders the link, so any GENERATE_CANCEL would have arrived."""

from __future__ import annotations

import hashlib
import queue
import threading

import openai
import pytest

from node.inference.pipeline.remote_wire import Generate, GenerateCancel, Tokens
from node.net import Frame, FrameType, Hello
from node.net._frames import frame_bytes
from tests.net.rawclient import RawPeer, read_frame
from tests.pipeline.swarm import run, start_slice_node, wait_for_route
from tests.pipeline.test_remote_generate import PROMPT, WHOLE, whole_model
from tests.support.swarm import TEST_SWARM
from tests.support.waiting import wait_until_sync

pytestmark = [pytest.mark.slow]

TOKEN = 300  # an ordinary token of the test vocabulary (not an end of generation)


class HeldEndHolder:
    """A raw peer advertising the model whole: GENERATE gets one TOKENS batch of `max_new` tokens
    and no end frame until `finish()`; it records what else the coordinator sends."""

    def __init__(self, tmp_path, node, sha: str):
        self.raw = RawPeer(tmp_path, "127.0.0.1", node.peer_port)
        self.sock, _ = self.raw.linked()
        self.node_id = self.raw.identity.node_id
        self.sock.sendall(frame_bytes(Hello(
            node_id=self.node_id, boot_id="held-end", agent="swarmllm/test", listen_port=0,
            models=({"sha256": sha, "name": "whole6", "n_layers": WHOLE.n_layers, "whole": True,
                     "ms_per_token": 0.001},),
            swarm=TEST_SWARM.public_id, epoch=TEST_SWARM.epoch, member_nonce="0" * 32).to_frame()))
        self.generates: queue.Queue[Generate] = queue.Queue()
        self.cancels: list[str] = []
        self.pongs: queue.Queue[int] = queue.Queue()
        threading.Thread(target=self._serve, daemon=True).start()

    def _send(self, msg: Tokens) -> None:
        self.sock.sendall(frame_bytes(Frame(FrameType.TOKENS, msg.to_header(), msg.payload())))

    def _serve(self) -> None:
        try:
            while True:
                frame = read_frame(self.sock)
                if frame.type == FrameType.PING:
                    self.sock.sendall(frame_bytes(frame.reply(FrameType.PONG)))
                elif frame.type == FrameType.PONG:
                    self.pongs.put(frame.request_id)
                elif frame.type == FrameType.GENERATE:
                    gen = Generate.from_frame(frame.header, frame.payload, check_ids=False)
                    self.generates.put(gen)
                    self._send(Tokens(gen.sid, 0, (TOKEN,) * gen.max_new_tokens, eval_us=1000))
                elif frame.type == FrameType.GENERATE_CANCEL:
                    self.cancels.append(GenerateCancel.from_header(frame.header).sid)
        except OSError:
            return  # closed

    def ordered(self) -> None:
        """A PING answered: every frame the coordinator sent before its PONG has been read."""
        self.sock.sendall(frame_bytes(Frame(FrameType.PING, {}, b"", 77, 0)))
        assert self.pongs.get(timeout=20) == 77

    def finish(self, gen: Generate) -> None:
        self._send(Tokens(gen.sid, gen.max_new_tokens, end="length"))


def test_a_generation_run_to_max_tokens_is_not_cancelled_on_its_holder(tmp_path):
    model = whole_model(tmp_path)
    c = start_slice_node(tmp_path, "c", model, "0-0")  # one layer only: the whole holder is the route
    holder = None
    try:
        run(c.async_wait_ready())
        holder = HeldEndHolder(tmp_path, c, hashlib.sha256(model.read_bytes()).hexdigest())
        model_id = run(wait_for_route(c, "whole6"))
        api = openai.OpenAI(base_url=c.base + "/v1", api_key=c.api_key, max_retries=0, timeout=60)
        for stream in (False, True):
            reply = api.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=4, temperature=0, stream=stream)
            if stream:
                chunks = list(reply)
                assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
            else:
                assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 4
            gen = holder.generates.get(timeout=5)
            assert gen.max_new_tokens == 4
            n = 1 + (1 if stream else 0)
            wait_until_sync(lambda n=n: c.node_log().count("DIAG: request complete") >= n, 20, 0.05, "the request's end")
            holder.ordered()
            assert holder.cancels == [], (stream, holder.cancels)
            holder.finish(gen)
    finally:
        if holder is not None:
            holder.sock.close()
        c.terminate()
