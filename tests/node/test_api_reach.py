"""Apps that reach the API by another name than localhost (a container's host.docker.internal, a
LAN address, an mDNS name): the Host check's normalisation, its refusal saying which setting admits
the name, and --allow-host. A real node on 127.0.0.1, raw HTTP with the Host headers those apps send."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket

import aiohttp
import pytest
import pytest_asyncio

from node import const
from node.api.auth import RefusedHosts, make_auth_middleware
from node.cli import parse_args
from node.commands.run import cli_overrides
from node.config import load_config
from node.errors import ForbiddenHost
from tests.support.fake_remote import request_from
from tests.support.nodes import node_config, running_node, tiny_model
from tests.support.swarm import join_test_swarm

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.llama]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("reach")
    model = tiny_model(base)
    # written as users write them: with a port, in upper case, an IPv6 address in brackets
    allowed = ["Host.Docker.Internal:8800", "MyLaptop.local", "[fe80::1]", "172.17.0.1:8800"]
    async with running_node(node_config(base / "data", model, allowed_hosts=allowed)) as n:
        yield n


async def get_models(node, host: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(
            f"http://127.0.0.1:{node.api.port}/v1/models",
            headers={"Host": host, "Authorization": f"Bearer {node.api_key}"}) as r:
        return r.status, await r.text()


@pytest.mark.parametrize("host", [
    "localhost.:8800", "LOCALHOST", "[::1]", "127.0.0.1.",  # loopback, as browsers may write it
    "host.docker.internal:8800", "host.docker.internal", "HOST.DOCKER.INTERNAL.:1234",
    "mylaptop.local.", "[fe80::1%25eth0]:8800", "[FE80::1]", "172.17.0.1", "172.17.0.1:9"])
async def test_allowed_names_match_however_written(node, host):
    status, text = await get_models(node, host)
    assert status == 200, text


@pytest.mark.parametrize("host", ["evil.example.com", "docker.internal", "host.docker.internal.evil.com",
                                  "mylaptop.lan", "172.17.0.2.nip.io:8800"])
async def test_other_names_still_refused(node, host):
    status, text = await get_models(node, host)
    assert status == 403 and json.loads(text)["error"]["code"] == "forbidden_host"


async def test_refusal_names_the_host_and_the_setting(node):
    status, text = await get_models(node, "mylaptop.lan:8800")
    assert status == 403
    message = json.loads(text)["error"]["message"]
    assert "'mylaptop.lan'" in message
    assert 'allowed_hosts = ["mylaptop.lan"]' in message and "--allow-host mylaptop.lan" in message


@pytest.mark.parametrize("host", ["192.168.1.20:8800", "[fe80::2]", "[FE80::2%25eth0]:8800", "10.0.0.7"])
async def test_an_address_as_host_needs_no_allowing(node, host):
    """A phone or WSL reaching a LAN bind by the node's address: an address is no DNS-rebinding
    risk (only a name can be re-pointed), so only the key is asked (2026-12-07: a 403 until the
    address was in allowed_hosts)."""
    status, text = await get_models(node, host)
    assert status == 200, text


async def test_allow_host_flag_sets_allowed_hosts(tmp_path):
    args = parse_args(["run", "--data-dir", str(tmp_path), "--host", "0.0.0.0",
                       "--allow-host", "host.docker.internal", "--allow-host", "192.168.1.20"])
    cfg = load_config(cli_overrides(args), environ={})
    assert cfg.host == "0.0.0.0" and cfg.allowed_hosts == ["host.docker.internal", "192.168.1.20"]


async def test_allow_host_flag_adds_to_config_toml(tmp_path):
    """--allow-host adds to config.toml's allowed_hosts (2026-12-07, review r35: it replaced them, so
    `--allow-host mylaptop.local` left the containers of a config's host.docker.internal with a 403)."""
    (tmp_path / "config.toml").write_text('allowed_hosts = ["host.docker.internal", "mylaptop.local"]\n')
    args = parse_args(["run", "--data-dir", str(tmp_path), "--allow-host", "mylaptop.local",
                       "--allow-host", "nas.lan"])
    cfg = load_config(cli_overrides(args), environ={})
    assert cfg.allowed_hosts == ["host.docker.internal", "mylaptop.local", "nas.lan"]


async def test_allowed_hosts_from_the_file_the_environment_and_the_flag_all_add_up(tmp_path):
    """SWARMLLM_ALLOWED_HOSTS adds to config.toml's allowed_hosts, as --allow-host does (2026-12-07: the
    variable replaced the file's list, so a container setting it left the name config.toml allowed
    with a 403 whose message said to add the name to config.toml, where it was). A real node started
    from the three: each name is answered."""
    data = join_test_swarm(tmp_path / "data")
    model = tiny_model(tmp_path)
    (data / "config.toml").write_text(
        'allowed_hosts = ["mylaptop.local"]\nport = 0\nmdns = false\nlog_to_file = false\n'
        'include_default_model = false\npeer_host = "127.0.0.1"\nn_threads = 1\n')
    args = parse_args(["run", "--data-dir", str(data), "--model", str(model), "--allow-host", "nas.lan"])
    cfg = load_config(cli_overrides(args), environ={"SWARMLLM_ALLOWED_HOSTS": "host.docker.internal"})
    assert cfg.allowed_hosts == ["mylaptop.local", "host.docker.internal", "nas.lan"]
    async with running_node(cfg) as n:
        for host in ("mylaptop.local", "host.docker.internal", "nas.lan"):
            status, text = await get_models(n, host)
            assert status == 200, (host, text)
        assert (await get_models(n, "other.lan"))[0] == 403


async def test_refused_names_are_said_again_later_whatever_came_before(caplog):
    """A rebinding page or a LAN scanner retrying wrote a WARNING per request (2026-12-07); then
    (review r35) the first 64 refused names were said for good, so a rebinding page's
    fresh random subdomains (filling them in seconds) left a later real misconfiguration unsaid.
    A name is said once per REPEAT_S, at most PER_WINDOW names per window, the rest counted."""
    caplog.set_level(logging.DEBUG, logger="node.api.auth")
    now = [1000.0]
    refused = RefusedHosts(clock=lambda: now[0])
    middleware = make_auth_middleware("k", inference_needs_key=True, allowed_hosts=frozenset(), refused=refused)

    async def refuse(host):
        await asyncio.sleep(0)  # let the loop run between requests, as a server's would
        with pytest.raises(ForbiddenHost):
            await middleware(request_from("192.168.1.9", host=host), None)

    def warned():
        found = [r.getMessage() for r in caplog.records
                 if r.levelno == logging.WARNING and "rejected request with a Host" in r.getMessage()]
        caplog.clear()
        return found

    for _ in range(20):  # a page retrying: said once
        await refuse("again.example.com")
    said = warned()
    assert len(said) == 1 and "again.example.com" in said[0], said
    for i in range(300):  # a rebinding page's random subdomains, a second's worth
        await refuse(f"x{i}.rebind.example")
    assert len(warned()) == const.API_REFUSED_HOST_PER_WINDOW - 1
    now[0] += const.API_REFUSED_HOST_WINDOW_S
    await refuse("mylaptop.lan:8800")  # the user's own app, a name not yet allowed
    said = warned()
    assert len(said) == 1 and "mylaptop.lan" in said[0] and "291 more refused" in said[0], said
    await refuse("mylaptop.lan")
    assert warned() == []  # said once per name per REPEAT_S
    now[0] += const.API_REFUSED_HOST_REPEAT_S
    await refuse("mylaptop.lan")
    assert len(warned()) == 1
    assert len(refused._said) <= const.API_REFUSED_HOST_NAMES_KEPT


def _resolves_to_loopback(name: str) -> bool:
    try:
        return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(name, None))
    except OSError:
        return False


async def _get(url: str, key: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url, headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
async def test_host_all_ipv6_takes_ipv4_and_its_printed_url_works(tmp_path):
    """`--host ::` listened on IPv6 only (asyncio sets IPV6_V6ONLY): 127.0.0.1 and IPv4 LAN clients
    were refused, and so was the printed http://localhost:PORT/v1 where localhost is 127.0.0.1 only
    (2026-12-07, review r35). It is dual-stack now, as a user giving `::` means."""
    async with running_node(node_config(tmp_path / "data", tiny_model(tmp_path), host="::")) as n:
        assert n.api_url == f"http://localhost:{n.api.port}/v1"
        assert await _get(f"http://127.0.0.1:{n.api.port}/v1/models", n.api_key) == 200
        assert await _get(f"http://[::1]:{n.api.port}/v1/models", n.api_key) == 200
        assert await _get(f"{n.api_url}/models", n.api_key) == 200


async def test_host_by_name_allows_the_name_its_url_carries(tmp_path):
    """`--host mylaptop.local` printed http://mylaptop.local:PORT/v1, whose Host the node refused."""
    name = socket.gethostname().lower()
    if not name or _is_address(name) or not _resolves_to_loopback(name):
        pytest.skip("this machine's name does not resolve to a loopback address")
    async with running_node(node_config(tmp_path / "data", tiny_model(tmp_path), host=name)) as n:
        assert n.api_url == f"http://{name}:{n.api.port}/v1"
        assert await _get(f"{n.api_url}/models", n.api_key) == 200


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _no_ipv6(monkeypatch):
    """This machine as one booted with ipv6.disable=1: no AF_INET6 socket can be made (asyncio's
    bind makes its sockets with the same socket.socket)."""
    real = socket.socket

    def make(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(97, "Address family not supported by protocol")
        return real(family, *args, **kwargs)

    monkeypatch.setattr(socket, "socket", make)


async def test_host_all_ipv6_without_ipv6_listens_on_ipv4(tmp_path, monkeypatch, caplog):
    """`--host ::` on a machine without IPv6 started "successfully", said `addr=:::8800` and listened
    on nothing (2026-12-07, review r37): it listens on 0.0.0.0 now, and says so."""
    from node.api.server import ApiServer

    _no_ipv6(monkeypatch)
    server = ApiServer(object(), node_config(tmp_path / "data", host="::"))
    with caplog.at_level(logging.WARNING, logger="node.api.server"):
        await server.start("sk-test")
    try:
        assert await _get(f"http://127.0.0.1:{server.port}/health", "sk-test") == 200
        assert "0.0.0.0" in caplog.text
    finally:
        await server.stop()


async def test_a_host_no_socket_can_be_made_for_fails_the_start(tmp_path, monkeypatch):
    """asyncio skips an address family it cannot make a socket of without raising: `--host ::1`
    without IPv6 listened on nothing and the start went on."""
    from node.api.server import ApiPortUnavailable, ApiServer

    _no_ipv6(monkeypatch)
    server = ApiServer(object(), node_config(tmp_path / "data", host="::1"))
    try:
        with pytest.raises(ApiPortUnavailable, match="::1"):
            await server.start("sk-test")
    finally:
        await server.stop()
