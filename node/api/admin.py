"""Admin endpoints (always need the API key): diagnostics, models, peers, stats, requests."""

from __future__ import annotations

from aiohttp import web

from node.api.appkeys import NODE
from node.api.errors import read_json
from node.errors import InvalidRequest

routes = web.RouteTableDef()


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes", "on")


@routes.get("/api/admin/diagnostics")
async def diagnostics(request: web.Request) -> web.Response:
    """The plain-text report; addresses redacted unless ?full=1."""
    text = await request.app[NODE].async_report(full=_truthy(request.query.get("full")))
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


@routes.get("/api/admin/models")
async def models(request: web.Request) -> web.Response:
    """Every model this node serves, with state, device and cpu_placement_reason."""
    return web.json_response({"models": request.app[NODE].model_summaries()})


@routes.post("/api/admin/models/{model_id}/unload")
async def unload(request: web.Request) -> web.Response:
    """Free a model's weights (409 while in use unless ?force=1)."""
    summary = await request.app[NODE].async_unload_model(request.match_info["model_id"],
                                                         force=_truthy(request.query.get("force")))
    return web.json_response({"model": summary})


@routes.post("/api/admin/models/{model_id}/load")
async def load(request: web.Request) -> web.Response:
    """Load a model now (waits until loaded)."""
    return web.json_response({"model": await request.app[NODE].async_load_model(request.match_info["model_id"])})


@routes.post("/api/admin/models/add")
async def add(request: web.Request) -> web.Response:
    """Serve a GGUF file from anywhere on disk for this run, as `--model PATH` at start (registered;
    loaded too with "load": true). Body: {"path": absolute path, "load"?: bool}. 201 with the model
    when it is new here (or gives a model whose file is gone its file), 200 when this file (or one
    of the same id) is served already; 400 for a
    missing, non-GGUF or truncated file."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    path, load = body.get("path"), body.get("load", False)
    if not isinstance(path, str) or not path:
        raise InvalidRequest("path is required (the absolute path of a .gguf file)", param="path")
    if not isinstance(load, bool):
        raise InvalidRequest("load must be a boolean", param="load")
    unknown = sorted(set(body) - {"path", "load"})
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}", param=unknown[0])
    summary, added = await request.app[NODE].async_add_model_path(path, load=load)
    return web.json_response({"model": summary, "added": added}, status=201 if added else 200)


@routes.post("/api/admin/models/download")
async def download(request: web.Request) -> web.Response:
    """Start downloading a GGUF into the data dir's models/ (202; poll /api/admin/downloads/{id}).
    Body: {"url": "https://…/x.gguf" | "hf://owner/repo/x.gguf" | "hf://owner/repo[:QUANT]", "sha256"?: hex,
    "filename"?: name}; a repo is looked up on the Hub first (400 naming its files if the quant is not one)."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    url, sha256, filename = body.get("url"), body.get("sha256"), body.get("filename")
    if not isinstance(url, str) or not url:
        raise InvalidRequest("url is required (a string)", param="url")
    for name, value in (("sha256", sha256), ("filename", filename)):
        if value is not None and not isinstance(value, str):
            raise InvalidRequest(f"{name} must be a string", param=name)
    unknown = sorted(set(body) - {"url", "sha256", "filename"})
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}", param=unknown[0])
    job = await request.app[NODE].async_start_download(url, sha256=sha256, file_name=filename)
    return web.json_response({"download": job.summary()}, status=202)


@routes.get("/api/admin/downloads")
async def downloads(request: web.Request) -> web.Response:
    """This run's downloads, newest last (the last DOWNLOADS_FINISHED_KEPT finished ones), and those an
    earlier run left unfinished (paused)."""
    return web.json_response({"downloads": [j.summary() for j in request.app[NODE].download_jobs()]})


@routes.get("/api/admin/downloads/{job_id}")
async def download_status(request: web.Request) -> web.Response:
    """One download's progress."""
    return web.json_response({"download": request.app[NODE].download_job(request.match_info["job_id"]).summary()})


@routes.post("/api/admin/downloads/{job_id}/cancel")
async def download_cancel(request: web.Request) -> web.Response:
    """Stop a download and remove its partial file (a paused one's, a failed one's kept file, one an
    earlier run left: 409 if it was resumed, cancel that one)."""
    job = await request.app[NODE].async_cancel_download(request.match_info["job_id"])
    return web.json_response({"download": job.summary()})


@routes.post("/api/admin/downloads/{job_id}/pause")
async def download_pause(request: web.Request) -> web.Response:
    """Stop a download keeping its partial file (`swarmllm download --resume`'s Ctrl-C): it ends
    `paused`, and …/resume goes on from the bytes kept."""
    job = request.app[NODE].pause_download(request.match_info["job_id"])
    return web.json_response({"download": job.summary()})


@routes.post("/api/admin/downloads/{job_id}/resume")
async def download_resume(request: web.Request) -> web.Response:
    """Go on with a paused download (one an earlier run left too) or a failed one whose partial file
    is kept: 202 with the new download (Range from the bytes on disk); 409 if there is nothing to resume."""
    job = request.app[NODE].resume_download(request.match_info["job_id"])
    return web.json_response({"download": job.summary()}, status=202)


@routes.get("/api/admin/peers")
async def peers(request: web.Request) -> web.Response:
    """The peer table, and the peers refused for not being in this swarm."""
    node = request.app[NODE]
    return web.json_response({"peers": node.peer_rows(), "refused": node.refused_rows()})


@routes.get("/api/admin/swarm")
async def swarm(request: web.Request) -> web.Response:
    """Which swarm this node is in, members connected, refusals (never the secret or a code)."""
    return web.json_response(request.app[NODE].swarm_status())


@routes.post("/api/admin/swarm/invite")
async def swarm_invite(request: web.Request) -> web.Response:
    """A one-time invite code for another device. Body: {"ttl_s"?: seconds, 60..30 days}."""
    body = await read_json(request) if request.can_read_body else {}
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    ttl = body.get("ttl_s", 24 * 3600)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 60 <= ttl <= 30 * 86400:
        raise InvalidRequest("ttl_s must be a number of seconds from 60 to 30 days", param="ttl_s")
    code, expires_at = await request.app[NODE].async_invite(float(ttl))
    return web.json_response({"code": code, "expires_at": expires_at})


@routes.post("/api/admin/swarm/join")
async def swarm_join(request: web.Request) -> web.Response:
    """Join the swarm of the node that made the code. Body: {"code": "swarmllm1-…"}."""
    body = await read_json(request)
    code = body.get("code") if isinstance(body, dict) else None
    if not isinstance(code, str) or len(code) > 512:
        raise InvalidRequest("code is required (an invite code string)", param="code")
    return web.json_response({"swarm": await request.app[NODE].async_join(code)})


@routes.post("/api/admin/swarm/leave")
async def swarm_leave(request: web.Request) -> web.Response:
    """Leave the swarm: this node starts a new private swarm of its own."""
    return web.json_response({"swarm": await request.app[NODE].async_leave()})


@routes.post("/api/admin/swarm/remove")
async def swarm_remove(request: web.Request) -> web.Response:
    """Remove a member: rotate the secret, hand it to the others. Body: {"node_id": id or prefix}."""
    body = await read_json(request)
    node_id = body.get("node_id") if isinstance(body, dict) else None
    if not isinstance(node_id, str) or not 4 <= len(node_id) <= 64:
        raise InvalidRequest("node_id must be the member's node id or a prefix of it of at least 4 characters "
                             "(`swarmllm swarm` lists the members)", param="node_id")
    return web.json_response({"members_told": await request.app[NODE].async_remove_member(node_id.lower())})


@routes.get("/api/admin/contribute")
async def contribute(request: web.Request) -> web.Response:
    """What this node serves for the swarm by choice: per model its budget and slices, the pause."""
    return web.json_response(request.app[NODE].contributions.summary())


@routes.post("/api/admin/contribute")
async def contribute_change(request: web.Request) -> web.Response:
    """Body: {"model": id, "budget_mb": MB (0 = free memory)} to help serve a model (again: a new
    budget); {"model": id, "stop": true} to stop; {"paused": bool} to pause or resume contributing."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    unknown = sorted(set(body) - {"model", "budget_mb", "stop", "paused"})
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}", param=unknown[0])
    contributions = request.app[NODE].contributions
    if "paused" in body:
        if set(body) != {"paused"} or not isinstance(body["paused"], bool):
            raise InvalidRequest("paused is a boolean, given alone", param="paused")
        return web.json_response(await contributions.async_set_paused(body["paused"]))
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required (a model id)", param="model")
    if body.get("stop") is True:
        return web.json_response(await contributions.async_stop(model))
    if "stop" in body and body["stop"] is not False:
        raise InvalidRequest("stop is a boolean", param="stop")
    return web.json_response(await contributions.async_help(model, body.get("budget_mb", 0)))


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
