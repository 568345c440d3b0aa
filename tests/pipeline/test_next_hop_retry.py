"""A holder linked to the coordinator but not yet to the hop before it (back from a blip, it relinked
to the coordinator first): the hop before fails the step "next hop unreachable", and the request
tries that holder again after NEXT_HOP_RETRY_S while the regain wait lasts, instead of a 503 at once
(found by CI, 2026-12-06: which of its peers the holder relinked to first decided).

Three real nodes in the test's process (a [0-1] coordinating, b [2-3], c [4-5]); the test holds
b and c apart (each leaves the other alone, as a refused peer, and their link is closed) and lets
them link once b has failed the request's first step."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from node.node import Node
from tests.pipeline.swarm import split_model
from tests.support.nodes import _build_sdk_models, node_config, running_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow]


@pytest.fixture
def sdk():
    """The official openai client, made outside the nodes' loop (its types and its TLS context took
    0.5-0.9 s of that loop's CPU); `with_options(base_url=, api_key=)` points it at a node."""
    import openai

    _build_sdk_models("openai.types", "openai.types.chat")
    return openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="-", max_retries=0)


def _linked(x: Node, y: Node) -> bool:
    return x.peers.link(y.node_id) is not None and y.peers.link(x.node_id) is not None


@contextlib.contextmanager
def held_apart(x: Node, y: Node):
    """x and y do not dial each other (as if each had refused the other) and lose their link; on
    leaving, they dial each other again at once."""
    originals = {n: n.peers.membership.is_refused for n in (x, y)}
    for n, other in ((x, y), (y, x)):
        n.peers.membership.is_refused = (lambda node_id, _o=other.node_id, _f=originals[n]:
                                         node_id == _o or _f(node_id))
    link = x.peers.link(y.node_id)
    if link is not None:
        link.close("held apart by the test")
    try:
        yield
    finally:
        for n, other in ((x, y), (y, x)):
            n.peers.membership.is_refused = originals[n]
            n.peers.discovery.dialer.dial_soon(n.peers.table.record(other.node_id))


async def test_a_holder_its_previous_hop_has_no_link_to_is_tried_again_once_linked(tmp_path, sdk):
    model = split_model(tmp_path)
    common = dict(slice_dtype="f32", slice_kv_dtype="f32", activation_bits=32)
    async with running_node(node_config(tmp_path / "a", model, layers="0-1", **common)) as a:
        boot = [f"127.0.0.1:{a.peers.listen_port}"]
        async with running_node(node_config(tmp_path / "b", model, layers="2-3", bootstrap=boot, **common)) as b, \
                running_node(node_config(tmp_path / "c", model, layers="4-5", bootstrap=boot, **common)) as c:
            auth = {"Authorization": f"Bearer {a.api_key}"}
            async with aiohttp.ClientSession() as s:
                async def routed() -> str | None:
                    async with s.get(f"http://127.0.0.1:{a.api.port}/v1/models", headers=auth) as r:
                        ids = [m["id"] for m in (await r.json())["data"] if m["name"] == "split6"]
                    return ids[0] if ids and _linked(b, c) else None
                model_id = await wait_until(routed, 60, 0.1, "a routing split6 over b and c")

            with held_apart(b, c):
                await wait_until(lambda: not _linked(b, c), 10, 0.02, "b and c unlinked")
                assert a.peers.link(b.node_id) and a.peers.link(c.node_id)  # both still linked to a
                client = sdk.with_options(base_url=f"http://127.0.0.1:{a.api.port}/v1", api_key=a.api_key)
                request = asyncio.create_task(client.chat.completions.create(
                    model=model_id, messages=[{"role": "user", "content": "hello"}], max_tokens=8, temperature=0))

                def unreached() -> bool:  # b found no link to c: the request now waits for c
                    if request.done():
                        return True
                    return any("next_hop_unreachable" in t.failure_causes for t in a.traces.in_flight_traces())
                await wait_until(unreached, 30, 0.01, "b failing the first step: c unreachable")
            await wait_until(lambda: _linked(b, c), 10, 0.02, "b and c linked again")
            reply = await request  # was a 503 "left out after failing this request: c (next hop unreachable)"
            assert reply.choices[0].message.content is not None
            [trace] = [t for t in a.traces.recent if t.route == "distributed"]
            assert trace.failure_causes == ["next_hop_unreachable"], trace.failure_causes
            assert [how for _s, how in trace.regain_waits] == ["regained"], trace.regain_waits
