"""One exception tree for the node, mapped once to HTTP status and the OpenAI error shape.

Code raises a typed subclass; `node.api.errors` turns it into
`{"error": {"message", "type", "param", "code"}}` with `http_status`.
Never match on message text: match on the class.
"""

from __future__ import annotations


class NodeError(Exception):
    """Base of every error the node raises on purpose."""

    http_status = 500
    error_type = "server_error"
    code: str | None = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def to_openai(self) -> dict:
        """The OpenAI error body for this error."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


# --- client errors -------------------------------------------------------------------------


class InvalidRequest(NodeError):
    """The request body is malformed or has a wrong/unsupported value (400)."""

    http_status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class SplitModelServedWhole(InvalidRequest):
    """Layers (slices) asked of a model split in parts by gguf-split: it is served whole on this
    node only (file_kinds.py)."""

    code = "split_model_served_whole"


class ContextLengthExceeded(InvalidRequest):
    """The prompt (plus the requested completion) does not fit the model's context (400)."""

    code = "context_length_exceeded"


class Unsupported(InvalidRequest):
    """A valid OpenAI option this node does not implement (400, never silently ignored)."""

    code = "unsupported_parameter"


class AuthenticationFailed(NodeError):
    """Missing or wrong API key (401)."""

    http_status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class ForbiddenHost(NodeError):
    """The Host header is not a loopback name (DNS-rebinding defence) (403)."""

    http_status = 403
    error_type = "permission_error"
    code = "forbidden_host"


class HubAccessDenied(NodeError):
    """Hugging Face refused a repo's listing (401/403: gated or private) (403; never the node's own
    401, which the CLI reads as a wrong API key)."""

    http_status = 403
    error_type = "permission_error"
    code = "hub_access_denied"


class NotFound(NodeError):
    """A route or resource that does not exist (404)."""

    http_status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    """The requested model is not known to this node or the swarm (404). `model`: the name as the
    client sent it, when no model answers to it (not for an ambiguous name or one not ready yet):
    the Ollama dialect answers in Ollama's words then (api/errors.py)."""

    code = "model_not_found"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 model: str | None = None):
        super().__init__(message, param=param, code=code)
        self.model = model


class MethodNotAllowed(NodeError):
    """HTTP method not allowed on this route (405)."""

    http_status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(NodeError):
    """Request body over the configured limit (413)."""

    http_status = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class Conflict(NodeError):
    """The request conflicts with the resource's state, e.g. unloading a model in use (409)."""

    http_status = 409
    error_type = "invalid_request_error"
    code = "conflict"


# --- server / capacity errors ----------------------------------------------------------------


class ModelUnavailable(NodeError):
    """The model exists but cannot serve right now (not loaded, failed to load) (503)."""

    http_status = 503
    error_type = "server_error"
    code = "model_unavailable"

    @classmethod
    def stopping(cls, model_id: str) -> ModelUnavailable:
        """The model refused because the node is stopping: its one wording, whichever part refuses."""
        return cls(f"model {model_id} cannot be served: the node is stopping")


class FileChangedOnDisk(ModelUnavailable):
    """A model's file holds other bytes than its sha256 names (node.models.changed): not loaded (503)."""


class InsufficientCapacity(NodeError):
    """No route through the swarm can serve this model right now (503)."""

    http_status = 503
    error_type = "server_error"
    code = "insufficient_capacity"


class SamplingUnsupportedBySwarm(InsufficientCapacity):
    """Every node that could serve the request refused its sampling parameters: they name a field
    (or grammar type) its version does not know, and no newer node serves the model (503 with
    `x-should-retry: false`: the openai and anthropic SDKs retried it twice with backoff, and the same
    swarm refuses it the same way until a node is updated)."""

    code = "sampling_unsupported"
    should_retry = False


class ShuttingDown(NodeError):
    """The node is stopping: a request it could not finish in the drain, or one that came during it (503)."""

    http_status = 503
    error_type = "server_error"
    code = "node_stopping"


class Overloaded(NodeError):
    """The admission queue is full (429)."""

    http_status = 429
    error_type = "rate_limit_error"
    code = "overloaded"
    retry_after_s = 1  # the Retry-After header: the SDKs wait this long before their retry


class KvBudgetFull(Overloaded):
    """A segment's sessions in use fill its KV budget (`slice_kv_budget_mb`): it opens no new one
    now (429). Its code stays `overloaded`: the coordinator tries another holder of those layers,
    or gives its client this 429 with Retry-After."""


class BodyTimeout(NodeError):
    """The client did not finish sending its request body in time (408)."""

    http_status = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class RequestTimeout(NodeError):
    """The request did not complete before its deadline (504)."""

    http_status = 504
    error_type = "server_error"
    code = "timeout"


class EngineError(NodeError):
    """An inference engine failed while executing (500)."""

    code = "engine_error"


class ModelLoadError(NodeError):
    """A model file could not be opened, parsed or loaded (500)."""

    code = "model_load_error"


class ModelLoadFailed(ModelLoadError):
    """A whole model failed to load and its file has not changed since: a request is refused at once
    (500 with `x-should-retry: false`, which the openai and anthropic SDKs obey: the same file fails
    the same way, so their retries of a 503 only loaded it again)."""

    code = "model_load_failed"
    should_retry = False


class UnsupportedArchitecture(ModelLoadError):
    """The GGUF's architecture is not implemented by the slice engine."""

    code = "unsupported_architecture"


class KvPositionMismatch(EngineError):
    """A forward asked for index_pos != the session's KV length (seed 000, gotcha #400)."""

    code = "kv_position_mismatch"

    def __init__(self, index_pos: int, kv_len: int, *, session: str | None = None):
        where = f" session={session}" if session else ""
        super().__init__(
            f"KV position mismatch: index_pos={index_pos} but kv_len={kv_len}{where}; "
            "refusing to compute from a gap"
        )
        self.index_pos = index_pos
        self.kv_len = kv_len


class KvCacheMiss(EngineError):
    """A WORK asked to resume a kept KV session (prefix reuse on a chain) that this segment no
    longer holds, or not for that coordinator and those layers: the coordinator prefills in full."""

    code = "kv_miss"

    def __init__(self, session: str, reason: str):
        super().__init__(f"kept KV session {session} cannot be resumed here ({reason})")
        self.reason = reason


# --- peer network ----------------------------------------------------------------------------


class DownloadFailed(NodeError):
    """The download could not complete (network, HTTP status, content, size, hash, disk).
    `discard`: what is on disk is wrong, not merely incomplete (the .part goes); `origin_status`: the
    origin's refusal (401, 403, …), when that is what failed."""

    http_status = 502
    error_type = "download_error"
    code = "download_failed"

    def __init__(self, message: str, *, discard: bool = False, origin_status: int | None = None):
        super().__init__(message)
        self.discard = discard
        self.origin_status = origin_status


class PeerError(NodeError):
    """Base of peer-network failures."""

    http_status = 502
    error_type = "server_error"
    code = "peer_error"


class ProtocolError(PeerError):
    """A peer sent a malformed or unexpected frame; closes that link only."""

    code = "protocol_error"


class SamplingUnsupported(ProtocolError):
    """A peer's sampling parameters name a field (or grammar type) this node's version does not
    know: refused, not ignored (the reply would break what the client asked for). The sender is
    newer, not faulty: it tries another node, and the link stays. The message reads after a node's
    name ("node ab12cd34 does not support ..."); `field` is the request's parameter."""

    code = "sampling_unsupported"

    def __init__(self, message: str, *, field: str):
        super().__init__(message, param=field)
        self.field = field


class PeerIdentityMismatch(PeerError):
    """The peer's TLS certificate key does not hash to the node id we dialled."""

    code = "peer_identity_mismatch"


class PeerUnreachable(PeerError):
    """Could not connect to a peer (direct or relayed)."""

    code = "peer_unreachable"
    timed_out = False  # True: nothing answered (no refusal, no reset): asleep or off the network


class SetupTimedOut(PeerUnreachable):
    """A link's set-up (HELLO, admission) got no answer within HANDSHAKE_TIMEOUT_S."""

    timed_out = True


class SelfConnection(PeerError):
    """We dialled an address that turned out to be this node."""

    code = "self_connection"


class NotAMember(PeerError):
    """A peer could not prove membership of this node's swarm (or refused ours): the link closes,
    the peer is not dialled again while this node stays in its swarm."""

    code = "not_a_member"

    def __init__(self, message: str, *, node_id: str, swarm: str | None, by_us: bool):
        super().__init__(message)
        self.node_id = node_id
        self.swarm = swarm  # the peer's swarm as it named it (public form), if it said
        self.by_us = by_us  # True: we refused it; False: it refused us


class AdmissionEnded(PeerError):
    """Not a failure: an admission handed a swarm over (an invite was used) and the link closed."""

    code = "admission_ended"


class SegmentFailed(PeerError):
    """A pipeline segment failed a step (error RESULT, link drop, missed ACK or RESULT deadline).
    `node_id` is the node to route around; `cause` says what happened (`link_drop`, `ack_deadline`,
    `result_deadline`, `protocol`, or the RESULT's error code). The coordinator fails over on it;
    it reaches a client only as the InsufficientCapacity that ends the retries."""

    code = "segment_failed"

    def __init__(self, message: str, *, node_id: str, cause: str, since: float | None = None):
        super().__init__(message)
        self.node_id = node_id
        self.cause = cause
        # a silence (a missed deadline): when what went unanswered was sent, or the last frame
        # came (time.monotonic()); a pause of this node's own before it explains nothing
        self.since = since
