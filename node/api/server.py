"""The aiohttp application, embedded on the node's loop with AppRunner + TCPSite."""

from __future__ import annotations

import errno
import logging
import os
import socket

from aiohttp import web

from node import const
from node.api import (
    admin,
    anthropic,
    cors,
    embed_routes,
    llama_native,
    ollama,
    ollama_models,
    openai,
    openai_responses,
    rerank_routes,
)
from node.api.appkeys import MAX_BODY, NODE
from node.api.auth import allowed_names, bind_name, is_loopback_host, make_auth_middleware
from node.api.errors import error_middleware
from node.api.streaming import bounded_send_middleware
from node.api.view import NodeView
from node.config import NodeConfig
from node.errors import NodeError

log = logging.getLogger(__name__)


class ApiPortUnavailable(NodeError):
    """The API cannot listen on its host:port; the message says which and what to do."""

    code = "api_port_unavailable"


def listen_error_text(host: str, port: int, exc: OSError) -> str:
    """What to tell a user whose API port cannot be listened on, by the reason: a port in use, a
    port below 1024 without the rights for it, a --host this machine does not have."""
    if isinstance(exc, socket.gaierror):  # a --host name that does not resolve (it was "choose another port")
        return (f"cannot listen on {host}:{port} (this machine cannot find the address {host}: "
                f"{exc.strerror or exc}): give --host an IP address, 127.0.0.1 (this machine only) or 0.0.0.0 "
                "(every network)")
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} is already in use (another SwarmLLM node, or another program): "
                "stop it, or choose another with -p")
    if exc.errno in (errno.EACCES, errno.EPERM):
        if port < 1024:
            return (f"cannot listen on {host}:{port} (permission denied: ports below 1024 need administrator "
                    "rights): choose another with -p, e.g. the default 8800")
        # Windows reserves port ranges (Hyper-V, WSL, Docker: `netsh interface ipv4 show
        # excludedportrange protocol=tcp`) and says WinError 10013, EACCES; a policy may forbid one
        return (f"cannot listen on {host}:{port} (permission denied: the system reserves or forbids this port): "
                "choose another with -p")
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"cannot listen on {host}:{port} (this machine has no address {host}): give --host one of "
                "its addresses, 127.0.0.1 (this machine only) or 0.0.0.0 (every network)")
    return f"cannot listen on {host}:{port} ({exc.strerror or exc}): choose another port with -p"


def _dual_stack_socket(port: int) -> socket.socket | None:
    """A listening socket on `::` that takes IPv4 too (IPV6_V6ONLY off): what a user giving `--host ::`
    means. asyncio turns V6ONLY on, so `::` was IPv6 only: 127.0.0.1 and IPv4 LAN clients were refused,
    and the printed http://localhost:PORT/v1 too where localhost is 127.0.0.1 only (2026-12-07, review
    r35). None where V6ONLY cannot be turned off (the plain bind then says why); a socket on 0.0.0.0,
    every IPv4 network, where this machine has no IPv6 (ipv6.disable=1): the plain bind there listened
    on nothing and the start said it listened (2026-12-07, review r37)."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as exc:
        log.warning("DIAG: --host :: but this machine has no IPv6 (%s): listening on 0.0.0.0, every IPv4 "
                    "network, instead", exc.strerror or exc)
        return _ipv4_any_socket(port)
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        if os.name != "nt":  # as asyncio: a restart binds at once; on Windows it would share the port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EPERM):
            raise
        return None
    return sock


def _ipv4_any_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if os.name != "nt":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def health(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return web.json_response({"status": "ok"})


async def health_ready(request: web.Request) -> web.Response:
    """Readiness: 200 only when a model can serve."""
    node = request.app[NODE]
    ready = node.is_ready()
    log.debug("DIAG: health_ready probe ready=%s", ready)
    body: dict = {"status": "ready" if ready else "not_ready", "models_loaded": ready}
    if waiting := node.waiting_on():  # what the start left under way: a model URL whose origin has not answered
        body["waiting_on"] = waiting
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition."""
    node = request.app[NODE]
    node.metrics.in_flight.set(node.traces.in_flight)
    log.debug("DIAG: metrics scrape")
    body, content_type = node.metrics.render()
    return web.Response(body=body, headers={"Content-Type": content_type})


def build_app(node: NodeView, config: NodeConfig, api_key: str) -> web.Application:
    """The application with its middlewares and routes."""
    cfg = config
    app = web.Application(
        middlewares=[
            bounded_send_middleware,
            error_middleware,
            make_auth_middleware(api_key, inference_needs_key=cfg.require_api_key_for_inference,
                                 allowed_hosts=allowed_names([*cfg.allowed_hosts, *bind_name(cfg.host)]),
                                 cors_origins=cors.allowed_origins(cfg.cors_origins)),
        ],
        client_max_size=cfg.max_request_body_bytes,
    )
    app[NODE] = node
    app[MAX_BODY] = cfg.max_request_body_bytes
    app.router.add_get("/health", health)
    app.router.add_get("/v1/health", health)  # llama-server answers both
    app.router.add_get("/health/ready", health_ready)
    app.router.add_get("/metrics", metrics)
    app.add_routes(openai.routes)
    app.add_routes(embed_routes.routes)
    app.add_routes(rerank_routes.routes)
    app.add_routes(anthropic.routes)
    app.add_routes(llama_native.routes)
    app.add_routes(ollama.routes)  # Ollama's API, /api/... (errors in its shape: api/errors.py)
    app.add_routes(ollama_models.routes)
    app.add_routes(openai_responses.routes)
    openai_responses.install(app)
    app.add_routes(admin.routes)
    cors.install(app, cfg.cors_origins)
    return app


class ApiServer:
    """Owns the runner and site; `port` is the bound port (useful with port 0 in tests)."""

    def __init__(self, node: NodeView, config: NodeConfig):
        self.node = node
        self.config = config
        self.runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, api_key: str) -> None:
        """Bind and serve on config.host:config.port."""
        cfg = self.config
        self.runner = web.AppRunner(build_app(self.node, cfg, api_key), access_log=None, handler_cancellation=True,
                                    shutdown_timeout=2.0, keepalive_timeout=const.API_IDLE_CONNECTION_S,
                                    auto_decompress=False)  # read_json decodes, off the loop (body_decode.py)
        await self.runner.setup()
        # reuse_address left to asyncio: SO_REUSEADDR on POSIX (a restart binds at once), not on
        # Windows, where it lets a second program bind the same port and take its connections
        try:
            sock = _dual_stack_socket(cfg.port) if cfg.host == "::" else None
            site = web.SockSite(self.runner, sock) if sock else web.TCPSite(self.runner, cfg.host, cfg.port)
            await site.start()
        except OSError as exc:  # not the data dir's fault: run.py took any OSError for one
            raise ApiPortUnavailable(listen_error_text(cfg.host, cfg.port, exc)) from exc
        sockets = self.runner.addresses
        if not sockets:  # asyncio skips an address family it cannot make a socket of, silently
            await self.runner.cleanup()
            self.runner = None
            raise ApiPortUnavailable(
                f"cannot listen on {cfg.host}:{cfg.port} (this machine cannot make a socket for that address: "
                "no IPv6?): give --host 127.0.0.1 (this machine only) or 0.0.0.0 (every network)")
        self.port = sockets[0][1]
        log.info("DIAG: server startup addr=%s:%s", cfg.host, self.port)
        if not cfg.require_api_key_for_inference and not is_loopback_host(cfg.host):
            # said at start: a setup that let the LAN in without the key before 2026-12-07 now gets 401s
            log.warning("DIAG: require_api_key_for_inference = false covers apps on this machine only: apps on "
                        "other devices, in containers or behind a proxy reaching addr=%s:%s must send the API key "
                        "(the data dir's api_key file)", cfg.host, self.port)
        if not cfg.require_api_key_for_inference and "*" in cors.allowed_origins(cfg.cors_origins):
            # the browser lets every page's preflight through and no key is asked of this machine:
            # any site the user visits could use the node and read its replies, silently (2026-12-07)
            log.warning("DIAG: cors_origins = [\"*\"] with require_api_key_for_inference = false: any web page "
                        "opened in a browser on this machine can run generations on this node and read them; "
                        "name the origins of your web apps in cors_origins instead of \"*\", or keep the key "
                        "required (the data dir's api_key file) addr=%s:%s", cfg.host, self.port)

    async def stop(self) -> None:
        """Stop accepting, finish or cancel handlers, free the port."""
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
