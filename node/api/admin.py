"""Admin endpoints (always need the API key): diagnostics, models, peers, stats, requests."""

from __future__ import annotations

from aiohttp import web

from node.api.appkeys import NODE
from node.diagnostics import build_report

routes = web.RouteTableDef()


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes", "on")


@routes.get("/api/admin/diagnostics")
async def diagnostics(request: web.Request) -> web.Response:
    """The plain-text report; addresses redacted unless ?full=1."""
    node = request.app[NODE]
    text = await build_report(node, full=_truthy(request.query.get("full")))
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


@routes.get("/api/admin/models")
async def models(request: web.Request) -> web.Response:
    """Every model this node serves, with state, device and cpu_placement_reason."""
    node = request.app[NODE]
    rows = [m.summary() for m in node.models.models.values() if m.whole]
    rows += [s.summary() for s in node.host.slices.values()]
    return web.json_response({"models": rows})


@routes.post("/api/admin/models/{model_id}/unload")
async def unload(request: web.Request) -> web.Response:
    """Free a model's weights (409 while in use unless ?force=1)."""
    node = request.app[NODE]
    served = await node.models.async_unload(request.match_info["model_id"],
                                            force=_truthy(request.query.get("force")))
    node.note_activity(f"model {served.id} unloaded")
    return web.json_response({"model": served.summary()})


@routes.post("/api/admin/models/{model_id}/load")
async def load(request: web.Request) -> web.Response:
    """Load a model now (waits until loaded)."""
    node = request.app[NODE]
    served = await node.models.async_load(request.match_info["model_id"])
    node.note_activity(f"model {served.id} loaded on {served.device}")
    return web.json_response({"model": served.summary()})


@routes.get("/api/admin/peers")
async def peers(request: web.Request) -> web.Response:
    """The peer table."""
    node = request.app[NODE]
    rows = [p.as_dict() for p in node.peers.peers()] if node.peers is not None else []
    return web.json_response({"peers": rows})


@routes.get("/api/admin/stats")
async def stats(request: web.Request) -> web.Response:
    """Node counters (node_id, uptime, requests, in_flight, tok/s)."""
    return web.json_response(request.app[NODE].stats())


@routes.get("/api/admin/requests")
async def requests(request: web.Request) -> web.Response:
    """Recent requests (newest last), the ones in flight and recent failures."""
    hub = request.app[NODE].traces
    return web.json_response({
        "in_flight": [t.as_dict() for t in hub.in_flight_traces()],
        "recent": [t.as_dict() for t in hub.recent],
        "failures": [t.as_dict() for t in hub.failures],
    })
