"""`require_api_key_for_inference = false` (`--no-auth-inference`) is for apps on this machine: who
counts as one. The middleware with a client address as the connection gives it (a LAN address,
loopback), and a real node on 127.0.0.1 asked through the official openai client and raw HTTP."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest
import pytest_asyncio
from aiohttp import web

from node.api.auth import make_auth_middleware
from node.errors import AuthenticationFailed
from tests.support.fake_remote import request_from
from tests.support.nodes import node_config, running_node, tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]

KEY = "sk-test-key"
APP = "http://localhost:3000"  # a browser app the user listed in cors_origins


request = request_from


async def answered(req, **kw) -> bool:
    middleware = make_auth_middleware(KEY, inference_needs_key=False, allowed_hosts=frozenset(), **kw)

    async def handler(_request):
        return web.Response(text="ok")

    try:
        await middleware(req, handler)
    except AuthenticationFailed:
        return False
    return True


@pytest.mark.parametrize("remote", ["127.0.0.1", "::1", "::ffff:127.0.0.1"])
async def test_loopback_client_needs_no_key(remote):
    assert await answered(request(remote))


@pytest.mark.parametrize("remote", ["192.168.1.20", "172.17.0.2", "fe80::2"])
async def test_other_machine_needs_the_key(remote):
    assert not await answered(request(remote))
    assert await answered(request(remote, {"Authorization": f"Bearer {KEY}"}))


@pytest.mark.parametrize("header", [{"X-Forwarded-For": "192.168.1.30"}, {"Forwarded": "for=192.168.1.30"},
                                    {"X-Real-IP": "192.168.1.30"}, {"Via": "1.1 caddy"}])
async def test_a_proxy_on_this_machine_does_not_make_its_clients_local(header):
    """nginx or Caddy for TLS, `tailscale serve`: the connection is from loopback, the client may
    be anywhere (2026-12-07, review r35: LAN clients had inference without the key)."""
    assert not await answered(request("127.0.0.1", header))
    assert await answered(request("127.0.0.1", {**header, "x-api-key": KEY}))


async def test_a_web_page_needs_the_key_unless_its_origin_is_listed():
    """Any page could POST text/plain (no preflight) to the keyless API and run generations here
    (CSRF; 2026-12-07, review r35): a browser sends Origin on it, apps do not."""
    chat = dict(path="/v1/chat/completions", method="POST")
    for content_type in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", None):
        simple = {"Content-Type": content_type} if content_type else {}
        assert not await answered(request("127.0.0.1", {"Origin": "https://evil.example", **simple}, **chat))
        assert not await answered(request("127.0.0.1", {"Origin": "null", **simple}, **chat))  # sandboxed frame
    plain = {"Content-Type": "text/plain"}
    assert await answered(request("127.0.0.1", {"Origin": "https://evil.example", "x-api-key": KEY, **plain}, **chat))
    listed = frozenset({APP})
    assert await answered(request("127.0.0.1", {"Origin": APP + "/", **plain}, **chat), cors_origins=listed)
    assert not await answered(request("127.0.0.1", {"Origin": "https://evil.example", **plain}, **chat),
                              cors_origins=listed)


@pytest.mark.parametrize("origin", ["chrome-extension://jfgfiigpkhlkbnfnbobbkinehhfdhndo",
                                    "moz-extension://4b1c2a5e-0c59-4c5e-9d3c-6e1b2f0a7d11", "null", "file://",
                                    "app://obsidian.md", "vscode-webview://1a2b3c"])
async def test_an_extension_or_app_sending_json_needs_no_key(origin):
    """Browser extensions (Page Assist, ChatGPTBox) and Electron apps send an Origin but skip CORS:
    their JSON request, which a web page could send only after a preflight the node refuses, is
    an app's (2026-12-07, review r37: 401 under the keyless setting, though it worked before)."""
    chat = dict(path="/v1/chat/completions", method="POST")
    assert await answered(request("127.0.0.1", {"Origin": origin, "Content-Type": "application/json"}, **chat))
    assert await answered(request("127.0.0.1", {"Origin": origin}, path="/v1/models"))
    assert not await answered(request("127.0.0.1", {"Origin": origin, "Content-Type": "text/plain"}, **chat))
    assert not await answered(request("192.168.1.20", {"Origin": origin, "Content-Type": "application/json"},
                                      **chat))  # another machine still needs the key


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("keyless")
    cfg = node_config(base / "data", tiny_model(base), require_api_key_for_inference=False, cors_origins=[APP])
    async with running_node(cfg) as n:
        yield n


def keyless_client(node, **headers):
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{node.api.port}/v1", api_key="none", max_retries=0,
                              default_headers=headers)


async def test_real_node_proxied_request_needs_the_key(node):
    async with keyless_client(node) as client:
        assert [m.id async for m in client.models.list()]
    async with keyless_client(node, **{"X-Forwarded-For": "192.168.1.30"}) as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            await client.models.list()
    assert "proxy" in caught.value.body["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/chat/completions"])
async def test_real_node_cross_site_text_plain_post_needs_the_key(node, path):
    """What a page's `fetch(url, {method: "POST", mode: "no-cors", body})` or a form sends."""
    body = json.dumps({"model": node.models.all()[0].id, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 1})
    url = f"http://127.0.0.1:{node.api.port}{path}"
    async with aiohttp.ClientSession() as s:
        for origin, status in (("https://evil.example", 401), (APP, 200)):
            async with s.post(url, data=body, headers={"Content-Type": "text/plain;charset=UTF-8",
                                                       "Origin": origin}) as r:
                assert r.status == status, (origin, await r.text())
        async with s.post(url, data=body, headers={"Content-Type": "text/plain", "Origin": "https://evil.example"}) as r:
            assert "cors_origins" in (await r.json())["error"]["message"]


@pytest.mark.parametrize(("host", "warned"), [("0.0.0.0", True), ("127.0.0.1", False)])
async def test_a_keyless_node_on_the_network_says_at_start_that_others_need_the_key(tmp_path, caplog, host, warned):
    """Until 2026-12-07 `--host 0.0.0.0 --no-auth-inference` let the LAN in without the key; a node
    set up that way says at start that other devices must now send it (its 401s say so too)."""
    cfg = node_config(tmp_path / "data", tiny_model(tmp_path), require_api_key_for_inference=False, host=host)
    with caplog.at_level("INFO", logger="node.api.server"):
        async with running_node(cfg):
            pass
    said = [r.getMessage() for r in caplog.records if "covers apps on this machine only" in r.getMessage()]
    assert len(said) == (1 if warned else 0), said


@pytest.mark.parametrize(("cors", "keyless", "page_gets"), [
    (["*"], True, 200), (["http://localhost:3000"], True, "preflight refused"), (["*"], False, 401)])
async def test_any_origin_with_a_keyless_node_says_at_start_that_any_web_page_can_use_it(
        tmp_path, caplog, cors, keyless, page_gets):
    """`cors_origins = ["*"]` with `--no-auth-inference` (2026-12-07): the browser lets every page's
    preflight through and the node asks no key of a request from this machine, so any web page the
    user visits runs generations here and reads them, silently. The node says so at start, as a
    keyless node beyond loopback does. What such a page gets is shown as a browser asks: the
    preflight, then the JSON POST."""
    cfg = node_config(tmp_path / "data", tiny_model(tmp_path), require_api_key_for_inference=not keyless,
                      cors_origins=cors)
    page = "https://evil.example"
    with caplog.at_level("INFO", logger="node.api.server"):
        async with running_node(cfg) as node, aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{node.api.port}/v1/completions"
            async with s.options(url, headers={"Origin": page, "Access-Control-Request-Method": "POST",
                                               "Access-Control-Request-Headers": "content-type"}) as r:
                got = "preflight refused" if r.status == 403 else r.status
            if got == 204:
                async with s.post(url, json={"model": "tiny", "prompt": "hi", "max_tokens": 1},
                                  headers={"Origin": page}) as r:
                    got = r.status
                    assert r.headers.get("Access-Control-Allow-Origin") == page  # the page reads the reply
            assert got == page_gets
    said = [r.getMessage() for r in caplog.records if "any web page" in r.getMessage()]
    assert len(said) == (1 if page_gets == 200 else 0), said
    if said:
        assert "cors_origins" in said[0] and "api_key" in said[0], said
