"""Typed application keys (aiohttp `web.AppKey`) shared by the handlers."""

from __future__ import annotations

from aiohttp import web

from node.api.view import NodeView

NODE: web.AppKey[NodeView] = web.AppKey("node", NodeView)  # the node serving this app
MAX_BODY: web.AppKey[int] = web.AppKey("max_body", int)
