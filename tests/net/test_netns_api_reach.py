"""An app on another machine (a phone on the Wi-Fi, a container on a bridge) reaching a node whose
API listens on every network: a namespace joined to this one by a veth pair stands for it, and
runs the official openai client there. require_api_key_for_inference = false must not open
inference to it, and a Host the node does not know is refused with the setting to change."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
import pytest_asyncio

from tests.support.nodes import node_config, running_node, tiny_model

from .netns import Namespaces, netns_unavailable

pytestmark = [pytest.mark.netns, pytest.mark.llama, pytest.mark.asyncio(loop_scope="module")]
_why = netns_unavailable()
if _why:
    pytestmark.append(pytest.mark.skip(reason=_why))

HOST_IP = "10.231.41.1"  # this machine's end of the link (the root namespace: the node runs in the test)
PHONE_IP = "10.231.41.2"

CLIENT = """
import json, sys, openai
base, key, host = sys.argv[1], sys.argv[2] or "none", sys.argv[3]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=30,
                       default_headers={"Host": host} if host else None)
try:
    reply = client.chat.completions.create(model=sys.argv[4], max_tokens=2,
                                           messages=[{"role": "user", "content": "hi"}])
    print(json.dumps({"status": 200, "finish": reply.choices[0].finish_reason}))
except openai.APIStatusError as exc:
    print(json.dumps({"status": exc.status_code, "body": exc.body}))
"""


@pytest.fixture(scope="module")
def phone():
    spaces = Namespaces("rch")
    ours = f"rch{os.getpid() % 100000}"  # this namespace's end, removed with the namespace's
    try:
        ns = spaces.add("p")
        spaces.run_host("ip", "link", "add", ours, "type", "veth", "peer", "name", "eth0", "netns", ns)
        spaces.run_host("ip", "addr", "add", f"{HOST_IP}/24", "dev", ours)
        spaces.run_host("ip", "link", "set", ours, "up")
        spaces.address(ns, "eth0", f"{PHONE_IP}/24")
        spaces.run(ns, "ip", "link", "set", "eth0", "up")
        yield ns
    finally:
        spaces.close()
        subprocess.run(["ip", "link", "del", ours], capture_output=True)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory, phone):
    base = tmp_path_factory.mktemp("reach")
    cfg = node_config(base / "data", tiny_model(base), host="0.0.0.0", require_api_key_for_inference=False)
    async with running_node(cfg) as n:
        yield n


async def chat_from(ns: str | None, base: str, key: str, host: str, model: str) -> dict:
    cmd = [sys.executable, "-c", CLIENT, base, key, host, model]
    if ns:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


async def test_no_key_from_another_machine_is_refused_even_with_inference_open_locally(node, phone):
    model = node.models.all()[0].id
    base = f"http://{HOST_IP}:{node.api.port}/v1"
    # from this machine the setting holds: no key needed
    assert (await chat_from(None, f"http://127.0.0.1:{node.api.port}/v1", "", "", model))["status"] == 200
    # the phone writes Host: localhost (any client can): still its address decides
    got = await chat_from(phone, base, "", f"localhost:{node.api.port}", model)
    assert got["status"] == 401, got
    assert "other machines" in got["body"]["message"]
    got = await chat_from(phone, base, "wrong", f"localhost:{node.api.port}", model)
    assert got["status"] == 401, got
    got = await chat_from(phone, base, node.api_key, f"localhost:{node.api.port}", model)
    assert got["status"] == 200, got


async def test_the_phone_gets_in_by_the_lan_address_with_the_key_and_a_name_needs_allowing(node, phone):
    model = node.models.all()[0].id
    base = f"http://{HOST_IP}:{node.api.port}/v1"
    got = await chat_from(phone, base, node.api_key, "", model)  # Host: the address, as the app writes it
    assert got["status"] == 200, got
    got = await chat_from(phone, base, node.api_key, f"mylaptop.lan:{node.api.port}", model)
    assert got["status"] == 403, got
    assert got["body"]["code"] == "forbidden_host"
    assert 'allowed_hosts = ["mylaptop.lan"]' in got["body"]["message"]
    assert "--allow-host mylaptop.lan" in got["body"]["message"]


async def test_the_url_shown_for_every_network_is_one_this_machine_can_use(node, phone):
    """`swarmllm run` prints node.api_url and the tray app copies it: with --host 0.0.0.0 it was
    http://0.0.0.0:PORT/v1, whose Host the node itself refused (403)."""
    assert node.api_url == f"http://localhost:{node.api.port}/v1"
    got = await chat_from(None, node.api_url, node.api_key, "", node.models.all()[0].id)
    assert got["status"] == 200, got
