"""Timing and size constants in one place (tests patch these instead of sleeping).

Units are in the names: _S seconds, _MS milliseconds, _BYTES bytes.
"""

# --- HTTP API ---
DEFAULT_API_PORT = 8800
PEER_PORT_OFFSET = 10  # peer listener = api port + 10 (seed 000: TCP P2P on port+10)
MAX_REQUEST_BODY_BYTES = 8 * 1024 * 1024
TRACE_RING_SIZE = 50  # recent requests kept for diagnostics
FAILURE_RING_SIZE = 50
ACTIVITY_RING_SIZE = 100

# --- event loop health ---
LOOP_STALL_THRESHOLD_MS = 100  # DIAG: network event loop stalled when late by more than this
LOOP_WATCHDOG_INTERVAL_S = 0.05

# --- inference ---
DEFAULT_MAX_TOKENS = 512
MODEL_QUEUE_MAX = 64  # requests waiting per model before 429
CANCEL_POLL_TOKENS = 1  # check the cancel flag after every token
HASH_CHUNK_BYTES = 4 * 1024 * 1024

# --- peer network ---
MAX_FRAME_BYTES = 256 * 1024 * 1024
MAX_HEADER_BYTES = 1024 * 1024
PING_INTERVAL_S = 2.0
RTO_INITIAL_S = 1.0  # RFC 6298 §2.1
RTO_MIN_S = 0.2  # RFC 6298 says 1 s; LAN links justify lower, bounded for safety
RTO_MAX_S = 60.0
PEER_GONE_MISSED_PINGS = 3
RECONNECT_BACKOFF_MIN_S = 0.5
RECONNECT_BACKOFF_MAX_S = 30.0
