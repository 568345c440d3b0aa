"""What the HTTP handlers may use of the node: a narrow, typed view (`Node` implements it).

Handlers call these and nothing else, so the API room depends on the node's behaviour, not on how
the node is put together (no reaching into its model manager, slice host or downloader).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from node.contribute import Contributions
    from node.inference.choices import ChoicesRun
    from node.inference.generate import CompletionRun
    from node.inference.request import CompletionRequest
    from node.metrics import NodeMetrics
    from node.models.download import DownloadJob
    from node.trace import RequestTrace, TraceHub


class NodeView(Protocol):
    """The node as the API sees it."""

    @property
    def traces(self) -> TraceHub:
        """Opens and closes every request's trace; the recent and failure rings."""

    @property
    def metrics(self) -> NodeMetrics:
        """The node's Prometheus registry."""

    @property
    def contributions(self) -> Contributions:
        """What this node serves for the swarm by choice (help serve a model, pause)."""

    def is_ready(self) -> bool:
        """True once this node's own models and slices are loaded and something can serve."""

    def waiting_on(self) -> list[str]:
        """What the start left under way (a model URL whose origin has not answered)."""

    @property
    def stopping(self) -> bool:
        """True once the node has begun to stop (new requests get a 503)."""

    def list_openai_models(self) -> list[dict[str, Any]]:
        """/v1/models entries (models served whole here, models the swarm covers)."""

    def openai_model(self, name: str) -> dict[str, Any]:
        """One /v1/models entry by id or readable name; ModelNotFound otherwise."""

    def new_run(self, request: CompletionRequest, trace: RequestTrace) -> CompletionRun | ChoicesRun:
        """The run that serves one completion (OpenAI's `n` > 1: its choices, one run each)."""

    async def async_report(self, *, full: bool) -> str:
        """The diagnostics report (redacted unless full)."""

    def model_summaries(self) -> list[dict[str, Any]]:
        """Every model this node serves (whole, and slices), with state and placement."""

    async def async_load_model(self, model_id: str) -> dict[str, Any]:
        """Load a model now; its summary once loaded."""

    async def async_unload_model(self, model_id: str, *, force: bool) -> dict[str, Any]:
        """Free a model's weights (Conflict while in use unless forced); its summary."""

    async def async_add_model_path(self, path: str, *, load: bool = False) -> tuple[dict[str, Any], bool]:
        """Serve the GGUF file at an absolute path for this run: (its summary, whether it is new)."""

    def start_download(self, url: str, *, sha256: str | None, file_name: str | None) -> DownloadJob:
        """Start (or join) a download of a file's URL into the data dir's models/."""

    async def async_start_download(self, url: str, *, sha256: str | None, file_name: str | None) -> DownloadJob:
        """Start (or join) a download into models/; a Hugging Face repo[:QUANT] is looked up first."""

    def download_jobs(self) -> list[DownloadJob]:
        """Every download of this run, oldest first."""

    def download_job(self, job_id: str) -> DownloadJob:
        """One download (NotFound if unknown)."""

    async def async_cancel_download(self, job_id: str) -> DownloadJob:
        """Stop a download and remove its partial file (a paused or failed one's too)."""

    def resume_download(self, job_id: str) -> DownloadJob:
        """Go on with a paused download (or a failed one whose partial file is kept): a new job."""

    def peer_rows(self) -> list[dict[str, Any]]:
        """The peer table as JSON rows ([] when the peer network is off)."""

    def swarm_status(self) -> dict[str, Any]:
        """This node's swarm (public id, open, members connected, refusals; never the secret)."""

    async def async_invite(self, ttl_s: float) -> tuple[str, float]:
        """A one-time invite code and its expiry (epoch seconds)."""

    async def async_join(self, code: str) -> str:
        """Join the swarm of the node that made `code`; the new swarm's public id."""

    async def async_leave(self) -> str:
        """Leave the swarm for a new private one of this node alone; its public id."""

    async def async_remove_member(self, node_id: str) -> int:
        """Remove a member (id or prefix); how many linked members got the new secret."""

    def stats(self) -> dict[str, Any]:
        """Node counters (node id, uptime, requests, in_flight, tok/s, ...)."""
