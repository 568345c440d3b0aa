"""Ollama's model routes: GET /api/version, /api/tags, /api/ps, POST /api/show, and the model-store
routes this node does not have (/api/pull, /api/push, /api/create, /api/copy, /api/delete, which
answer what to do instead). Models are listed under the ids /v1/models gives with Ollama's `:latest`
tag (`tiny-1a2b3c4d:latest`), as Ollama lists every model: Open WebUI adds the tag to an untagged name
and looks it up among the listed names. A name sent with `:latest` is the model; with another tag
(`llama3:8b-q4`) it is another model, as on Ollama: not found (`served.untagged`, /v1's rule too).
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from node.api.appkeys import NODE
from node.api.errors import read_json
from node.errors import InvalidRequest
from node.inference.reasoning import think_tags
from node.inference.served import LATEST_TAG, ServedModel
from node.inference.tools.harmony import is_harmony

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

# the Ollama API version this dialect follows (docs/api.md as of Ollama 0.13); apps read it to
# know a server speaks Ollama, some to pick newer fields
OLLAMA_API_VERSION = "0.13.0"
_NEVER = "9999-12-31T23:59:59Z"  # /api/ps' expires_at: a model stays loaded here (no keep_alive timer)
TAG = LATEST_TAG  # the tag Ollama lists an untagged model under


def model_name(value: Any, param: str = "model") -> str:
    """An Ollama request's model name, its tag kept: ModelManager.get reads it by the rule /v1 reads
    names by (`served.untagged`: `:latest` is the model, another tag another model)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"`{param}` is required and must be a model name (GET /api/tags lists them)",
                             param=param)
    return value.strip()


def _rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat().replace("+00:00", "Z")


def _parameter_size(n: int) -> str:
    """Ollama's `parameter_size`: 7.2B, 494.03M, 125K."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.{1 if unit == 'B' else 2}f}{unit}"
    return str(n)


def details(served: ServedModel) -> dict[str, Any]:
    """Ollama's `details`: the file's format, architecture, parameter count and quantization."""
    entry = served.entry
    arch = entry.architecture
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
            "parameter_size": _parameter_size(entry.header.n_params),
            "quantization_level": entry.quantization.upper()}


def _listed(served: ServedModel) -> dict[str, Any]:
    """What /api/tags and /api/ps say of every model."""
    return {"name": served.id + TAG, "model": served.id + TAG, "size": served.entry.size_bytes, "digest": served.entry.sha256,
            "details": details(served)}


def _modified(served: ServedModel) -> str:
    """The file's mtime (blocking: an executor)."""
    path = served.entry.path
    return _rfc3339(path.stat().st_mtime if path.exists() else 0)


def _listed_models(request: web.Request) -> list[ServedModel]:
    """The models /v1/models lists, in its order."""
    node = request.app[NODE]
    ids = [m["id"] for m in node.list_openai_models()]
    by_id = {m.id: m for m in node.models.all()}
    return [by_id[i] for i in ids if i in by_id]


@routes.get("/")
async def banner(request: web.Request) -> web.Response:
    """What Ollama answers at its root, which apps probe to see a server is there. Open, as /health:
    it says only that the server is up."""
    return web.Response(text="Ollama is running")


@routes.get("/api/version")
async def version(request: web.Request) -> web.Response:
    """The Ollama API version this node answers as."""
    return web.json_response({"version": OLLAMA_API_VERSION})


@routes.get("/api/tags")
async def tags(request: web.Request) -> web.Response:
    """The models this node serves (as /v1/models), in Ollama's shape."""
    served = _listed_models(request)
    modified = await asyncio.get_running_loop().run_in_executor(None, lambda: [_modified(s) for s in served])
    return web.json_response({"models": [{**_listed(s), "modified_at": m} for s, m in zip(served, modified, strict=True)]})


@routes.get("/api/ps")
async def ps(request: web.Request) -> web.Response:
    """The models loaded here now, in Ollama's shape."""
    loaded = [s for s in _listed_models(request) if s.engine is not None]
    return web.json_response({"models": [
        {**_listed(s), "expires_at": _NEVER, "context_length": s.n_ctx,
         "size_vram": s.entry.size_bytes if s.device not in (None, "cpu") else 0} for s in loaded]})


def thinks(served: ServedModel) -> bool:
    """Whether a model writes thoughts: a template with think tags, or gpt-oss's harmony channels."""
    template = (served.tokenizer.chat_template if served.tokenizer is not None else None) or ""
    return think_tags(template) is not None or is_harmony(template)


# the template variables `think` sets (extras._think: true is enable_thinking, an effort reasoning_effort)
def takes_think(served: ServedModel, think: bool | str) -> bool:
    """Whether this `think` reaches the model: it thinks (`thinks`), or its template reads the switch
    this value sets — `true` sets `enable_thinking` (Apertus), an effort `reasoning_effort` (Tencent Hy3,
    Upstage Solar Open) — though its thoughts are not split off here. (Review r52: such models' efforts
    were a 400 "does not support thinking"; review r56: `true` on a template reading only
    reasoning_effort was then taken and did nothing — it is Ollama's 400 again.)"""
    template = (served.tokenizer.chat_template if served.tokenizer is not None else None) or ""
    switch = "enable_thinking" if think is True else "reasoning_effort"
    return thinks(served) or re.search(rf"\b{switch}\b", template) is not None


def capabilities(served: ServedModel) -> list[str]:
    """Ollama's `capabilities`: completion (a model that chats), tools (a template that renders
    them), thinking (one that writes thoughts: `thinks`), embedding (a model declaring its pooling: an embedder)."""
    tok = served.tokenizer
    header = served.entry.header
    pooling = header.arch_get("pooling_type")
    out = []
    if tok is None or not tok.reranker:
        out.append("completion")
    template = (tok.chat_template if tok is not None else None) or ""
    if "tools" in template:
        out.append("tools")
    if thinks(served):
        out.append("thinking")
    if pooling is not None and (tok is None or not tok.reranker):
        out.append("embedding")
    return out


def _model_info(served: ServedModel) -> dict[str, Any]:
    """The GGUF's scalar metadata (arrays and templates left out, as Ollama leaves arrays out unless
    verbose); `<arch>.context_length` is the context this node serves, which apps size prompts by."""
    header = served.entry.header
    info = {k: v for k, v in header.metadata.items()
            if not isinstance(v, list | tuple | bytes) and not k.startswith("tokenizer.chat_template")}
    info["general.architecture"] = header.architecture
    info["general.parameter_count"] = header.n_params
    if served.n_ctx:
        info[f"{header.architecture}.context_length"] = served.n_ctx
    return info


def _parameters(served: ServedModel) -> str:
    """Ollama's `parameters` text (a Modelfile's PARAMETER lines): `num_ctx`, the context this node
    serves, which Continue reads from here (not from model_info) to size its prompts."""
    return f"{'num_ctx':<30} {served.n_ctx}" if served.n_ctx else ""


@routes.post("/api/show")
async def show(request: web.Request) -> web.Response:
    """One model's details, template, metadata and capabilities (`model`, or the older `name`)."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    key = "model" if body.get("model") is not None else "name"
    served = await request.app[NODE].models.async_get(model_name(body.get(key), key))
    tok = served.tokenizer
    modified = await asyncio.get_running_loop().run_in_executor(None, _modified, served)
    return web.json_response({
        "modelfile": "", "parameters": _parameters(served), "template": (tok.chat_template if tok is not None else None) or "",
        "license": "", "details": details(served), "model_info": _model_info(served),
        "capabilities": capabilities(served), "modified_at": modified})


_INSTEAD = {
    "/api/pull": "pulling models from Ollama's registry is not supported by SwarmLLM: download a GGUF with "
                 "`swarmllm download <url or hf://owner/repo:QUANT>` or the app's Models page",
    "/api/push": "pushing models to a registry is not supported by SwarmLLM: share a model with your swarm "
                 "instead (the app's Models page)",
    "/api/create": "creating models from a Modelfile is not supported by SwarmLLM: put a GGUF file in the data "
                   "dir's models/ folder, or use `swarmllm download` or the app's Models page",
    "/api/copy": "copying models under a new name is not supported by SwarmLLM: a model is named by its GGUF "
                 "file's name (rename the file in the models/ folder)",
    "/api/delete": "deleting models through this API is not supported by SwarmLLM: remove the model in the app's "
                   "Models page or delete its GGUF file from the data dir's models/ folder",
}


class NotOffered(InvalidRequest):
    """An Ollama model-store route SwarmLLM does not offer (400, saying what to do instead): the
    client's call, not the node's failure (no WARNING per app retry)."""

    code = "not_supported"


async def _not_offered(request: web.Request) -> web.Response:
    """What to do instead of Ollama's model-store routes."""
    raise NotOffered(_INSTEAD[request.path])


for _path in _INSTEAD:
    routes.post(_path)(_not_offered)
routes.delete("/api/delete")(_not_offered)
