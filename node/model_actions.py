"""What the API and the GUI do to this node's models and downloads (Node's part): /v1/models,
load and unload, downloads into models/."""

from __future__ import annotations

from typing import Any

from node.errors import ModelNotFound, ModelUnavailable
from node.inference.served import untagged
from node.models.download import DownloadJob
from node.stopping import end_runs


class ModelActions:
    """Mixed into Node: needs its models, pipeline, slice_host, peers, remote_server, downloads,
    _runs and note_activity."""

    models: Any
    pipeline: Any
    slice_host: Any
    peers: Any
    remote_server: Any
    downloads: Any
    _runs: Any

    def note_activity(self, text: str) -> None:  # Node's
        raise NotImplementedError

    def list_openai_models(self) -> list[dict[str, Any]]:
        """/v1/models entries: models served whole here, and models the swarm covers layer by layer."""
        out = []
        swarm = self.pipeline.swarm_models() if self.pipeline is not None else {}
        for served in self.models.all():
            if served.state == "failed" or (not served.whole and served.entry.sha256 not in swarm):
                continue
            out.append({
                "id": served.id,
                "object": "model",
                "created": int(served.entry.path.stat().st_mtime) if served.entry.path.exists() else 0,
                "owned_by": "swarmllm",
                "name": served.entry.name,
                "state": served.state,
                "context_length": served.n_ctx,
                "route": "local" if served.whole else "distributed",
            })
        return out

    def openai_model(self, name: str) -> dict[str, Any]:
        """One /v1/models entry by id or readable name; ModelNotFound otherwise."""
        wanted = untagged(name)  # (Ollama's listing of it: review r47)
        for model in self.list_openai_models():
            if model["id"] == wanted or model.get("name") == wanted:
                return model
        raise ModelNotFound(f"The model `{name}` does not exist on this node", param="model")

    def model_summaries(self) -> list[dict[str, Any]]:
        """Every model this node serves: whole ones, then layer slices."""
        return [m.summary() for m in self.models.whole_models()] + \
            [s.summary() for s in self.slice_host.slices.values()]

    async def async_load_model(self, model_id: str) -> dict[str, Any]:
        """Load a model now (waits until loaded)."""
        served = await self.models.async_load(model_id, after_unload=True)
        self.note_activity(f"model {served.id} loaded on {served.device}")
        if self.peers is not None:
            await self.peers.async_announce()  # peers may run it here (remote generate)
        return served.summary()

    async def async_unload_model(self, model_id: str, *, force: bool = False) -> dict[str, Any]:
        """Free a model's weights (Conflict while in use unless forced: then its requests, running
        or queued, end with a 503 rather than a reply that looks finished, or after the queue)."""
        held = self.models.get(model_id)
        if force and held.whole:
            end_runs(self._runs, ModelUnavailable(f"model {held.id} was unloaded: the reply was cut short"), held)
            if self.remote_server is not None:  # and those it runs for other nodes, queued ones too
                self.remote_server.end_model(held, f"model {held.id} was unloaded on {self.short_id}")
        served = await self.models.async_unload(model_id, force=force)
        self.note_activity(f"model {served.id} unloaded")
        if self.peers is not None:
            await self.peers.async_announce()
        return served.summary()

    def start_download(self, url: str, *, sha256: str | None = None, file_name: str | None = None) -> DownloadJob:
        """Start (or join) a download of a file's URL into models/."""
        job = self.downloads.start(url, sha256=sha256, file_name=file_name)
        self.note_activity(f"downloading {job.file_name}")
        return job

    async def async_start_download(self, url: str, *, sha256: str | None = None,
                                   file_name: str | None = None) -> DownloadJob:
        """Start (or join) a download into models/; a Hugging Face repo[:QUANT] is looked up first."""
        job = await self.downloads.async_start(url, sha256=sha256, file_name=file_name)
        self.note_activity(f"downloading {job.file_name}")
        return job

    def download_jobs(self) -> list[DownloadJob]:
        """Every download of this run, oldest first."""
        return self.downloads.all()

    def download_job(self, job_id: str) -> DownloadJob:
        """One download (NotFound if unknown)."""
        return self.downloads.get(job_id)

    async def async_cancel_download(self, job_id: str) -> DownloadJob:
        """Stop a download and remove its partial file; a paused one (or a failed one's kept partial
        file, or one an earlier run left) has its partial file removed."""
        job = self.downloads.get(job_id)
        if job.resumable or job.resumed_as is not None:
            return await self.downloads.async_discard(job_id)
        return self.downloads.cancel(job_id)

    def pause_download(self, job_id: str) -> DownloadJob:
        """Stop a download keeping its partial file (paused: resume_download goes on from it)."""
        return self.downloads.pause(job_id)

    def resume_download(self, job_id: str) -> DownloadJob:
        """Go on with a paused download (or a failed one whose partial file is kept): a new job."""
        job = self.downloads.resume(job_id)
        self.note_activity(f"downloading {job.file_name}")
        return job
