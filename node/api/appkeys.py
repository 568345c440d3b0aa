"""Typed application keys (aiohttp `web.AppKey`) shared by the handlers."""

from __future__ import annotations

from typing import Any

from aiohttp import web

NODE: web.AppKey[Any] = web.AppKey("node")  # the node.node.Node serving this app
MAX_BODY: web.AppKey[int] = web.AppKey("max_body", int)
