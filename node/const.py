"""Timing and size constants in one place (tests patch these instead of sleeping).

Units are in the names: _S seconds, _MS milliseconds, _BYTES bytes.
"""

# --- HTTP API ---
DEFAULT_API_PORT = 8800
PEER_PORT_OFFSET = 10  # peer listener = api port + 10 (seed 000: TCP P2P on port+10)
MAX_REQUEST_BODY_BYTES = 8 * 1024 * 1024
# a connection with no request under way (idle keep-alive, or request headers still not complete) is
# closed after this long; aiohttp's own default is 3630 s, so leaked or trickling sockets held fds an hour
API_IDLE_CONNECTION_S = 75.0
# a complete reply carrying more logprob entries than this (tokens + their alternatives, ~70 bytes
# each) is built and JSON-encoded on a worker thread, not on the loop the peer links share
REPLY_ON_LOOP_MAX_LOGPROBS = 2000
# ... and so is one of more tokens than this (its text, and a Responses body's stored copy: ~4 bytes each)
REPLY_ON_LOOP_MAX_TOKENS = 4096
JSON_SLICE_ITEMS = 128  # such a reply's long lists are encoded this many items at a time (~5 ms each)
REPLY_MIN_RATE_BYTES_S = 32 * 1024  # a whole reply's send may take STREAM_WRITE_STALL_S + its length at this rate
API_BODY_STALL_S = 30.0  # a request body that sends no byte for this long is a 408 and its connection ends
API_BODY_READ_MAX_S = 300.0  # and one still not complete after this long (a trickle) is too
# a request whose Host is refused is said at WARNING at most once per name per REPEAT_S, and at most
# PER_WINDOW names per WINDOW_S (a rebinding page's fresh subdomains); the rest at DEBUG, counted
API_REFUSED_HOST_REPEAT_S = 600.0
API_REFUSED_HOST_WINDOW_S = 60.0
API_REFUSED_HOST_PER_WINDOW = 10
API_REFUSED_HOST_NAMES_KEPT = 256  # names remembered for REPEAT_S (the oldest forgotten first)
# the process's soft limit of open files is raised to its hard limit, at most this: the default soft
# limit (1024 on Linux, 256 on macOS) let a few hundred local sockets lock every client out (EMFILE)
OPEN_FILES_SOFT_LIMIT_MAX = 8192
TRACE_RING_SIZE = 50  # recent requests kept for diagnostics
FAILURE_RING_SIZE = 50
ACTIVITY_RING_SIZE = 100  # lines of recent activity kept for the diagnostics report

# --- event loop health ---
LOOP_STALL_THRESHOLD_MS = 100  # DIAG: network event loop stalled when late by more than this
LOOP_WATCHDOG_INTERVAL_S = 0.05
# a stall of the loop this long is this node pausing (SIGSTOP, a laptop's lid, a VM paused): peers'
# missed deadlines and link drops within it are not charged to them (watchdog.paused_since)
SELF_PAUSE_MIN_S = 1.0
# a link drop or failure this soon after such a pause ended is counted as the pause's doing
SELF_PAUSE_GRACE_S = 2.0
SELF_PAUSE_REARMS = 2  # a step's deadline is pushed back for such pauses this many times at most
NODE_DRAIN_S = 5.0  # on stop, requests under way get this long to finish; then they end with a 503 error
NODE_DRAIN_POLL_S = 0.1  # how often the drain looks whether the work for other nodes has ended
STREAM_WRITE_STALL_S = 60.0  # a streaming client that takes nothing for this long (buffers full) is cut off
NODE_STOP_STEP_S = 20.0  # one step of Node.stop (the API, the peers, the slices...) waits at most this

# --- inference ---
DEFAULT_MAX_TOKENS = 512
MODEL_QUEUE_MAX = 64  # requests waiting per model before 429
LOAD_FAILURE_RETRY_S = 300.0  # a whole model's failed load is refused to requests this long at most (memory short then may not be now)
CANCEL_POLL_TOKENS = 1  # check the cancel flag after every token
HASH_CHUNK_BYTES = 4 * 1024 * 1024
HASH_CACHE_MAX_RECORDS = 4096  # files model_hashes.json remembers; past it the least recently hashed go first (a
# record of a file deleted or moved stayed for ever, each download under a new name added one; gone files are dropped at start)
# a data-dir file (swarm.json, identity.key, api_key, model_hashes.json) whose read fails for a reason
# that may pass (a sync tool's or an antivirus' lock, a rename under way, EIO) is read again this often
DATA_FILE_READ_TRIES = 3
DATA_FILE_READ_RETRY_S = 0.1  # between two of those reads (~200 ms in all)
# embeddings: one input is at most this many tokens (and the model's context), OpenAI's limit per
# input; the embedding context is sized to the longest input seen, from EMBED_MIN_CONTEXT_TOKENS up
# in powers of two (llama.cpp's attention scratch grows with its square: node/inference/embedder.py)
EMBED_MAX_INPUT_TOKENS = 8192
EMBED_MIN_CONTEXT_TOKENS = 512
# token ids of a client's input whose text check_client_ids tokenizes again (~3 us an id, on an
# executor): the first ones tell a foreign tokenizer's ids
EMBED_CHECK_IDS = 1024
# documents in one /v1/rerank request (each one query/document pair decoded alone)
RERANK_MAX_DOCUMENTS = 2048

# --- peer network ---
MAX_FRAME_BYTES = 256 * 1024 * 1024
MAX_HEADER_BYTES = 1024 * 1024
# A model's GGUF header fetched from a peer (MODEL_HEADER frames) or its origin (Range request):
MODEL_HEADER_MAX_BYTES = 64 * 1024 * 1024  # cap: a peer cannot make us hold more (big vocabs are ~10 MB)
MODEL_HEADER_CHUNK_BYTES = 1024 * 1024  # per MODEL_HEADER reply: no head-of-line block on a busy link
MODEL_HEADER_TIMEOUT_S = 30.0  # one chunk from a peer; the whole header from an origin
MODEL_HEADER_FETCHES = 2  # headers fetched at once (models that appear together)
MODEL_HEADER_RETRY_S = 30.0  # after every holder failed, the next attempt waits at least this
MODEL_SWARM_MAX = 32  # models known here by their header only (registered + being fetched); more are skipped
MODEL_HEADER_QUEUE = 8  # header fetches running or waiting their turn; the rest wait for the next scan
MODEL_HEADER_CACHE_MAX = 64  # headers kept in <data_dir>/headers/ (the least recently used go first)
MODEL_HEADER_CACHE_MAX_AGE_S = 30 * 86400  # a cached header not used for this long is removed
PING_INTERVAL_S = 2.0
RTO_INITIAL_S = 1.0  # RFC 6298 §2.1
RTO_MIN_S = 0.2  # RFC 6298 says 1 s; LAN links justify lower, bounded for safety
RTO_MAX_S = 60.0
PEER_GONE_MISSED_PINGS = 3
RECONNECT_BACKOFF_MIN_S = 0.5
RECONNECT_BACKOFF_MAX_S = 30.0
RELAY_RECONNECT_BACKOFF_MAX_S = 5.0  # a relay (configured, or known to be one) is redialled at least this
# often: one address, and a NATed node reaches nobody without it (2026-12-06: it waited up to 36 s)

# --- peer network: links, discovery, relay (node/net; owned by the peer-network module) ---
CONNECT_TIMEOUT_S = 5.0  # TCP connect to a peer or relay
HANDSHAKE_TIMEOUT_S = 10.0  # preamble + TLS + HELLO, each stage
PEER_MAX_ADDRS = 16  # direct addresses remembered per peer (most recently good first; the oldest go)
PEER_ADDR_STALE_S = 86400.0  # a peer's address failing this long, and never working since, is dropped...
PEER_ADDR_STALE_FAILURES = 3  # ...once this many dials to it have failed (its most recently good one stays)
DIAL_ATTEMPT_DELAY_S = 0.25  # a peer's next address is dialled this long after the last, not after it fails (RFC 8305)
PREAMBLE_MAX_BYTES = 16 * 1024  # plaintext preamble body (carries the dialler's certificate)
MAX_PENDING_HANDSHAKES = 64  # inbound connections still setting up; more are refused
MAX_HANDSHAKES_PER_HOST = 8  # of those, from one remote host (not loopback, not relayed)
CONTROL_FRAMES_BURST = 1000  # a link's frames that are not pipeline work (PING, PEX, ERROR, stray replies)...
CONTROL_FRAMES_PER_S = 100.0  # ...refilled at this rate; a peer past the budget is flooding: the link closes
PONG_MAX_BACKLOG_BYTES = 1024 * 1024  # a PING is not answered while more than this waits to go to its sender
HANDSHAKE_FRAME_MAX_BYTES = 1024 * 1024  # a HELLO / MEMBER frame (its JSON header: adverts, a proof)
TLS_MAX_TRUST_ANCHORS = 4096  # announced certificates trusted before the server context is rebuilt
PING_TIMEOUT_MIN_S = 0.5  # a PING waits max(RTO, this): a loaded loop must not look like a dead peer
# A retired duplicate link closes once both ends said they have nothing in flight on it (_link.py
# retire()); this bounds it for a peer that never says so (older versions close on their own timer)
DUPLICATE_LINK_DRAIN_MAX_S = 60.0  # past every request's own deadline (MODEL_HEADER / PARTIAL_PEER: 30 s)
DUPLICATE_LINKS_DRAINING_MAX = 4  # retired links per peer left to drain; beyond, the oldest is closed
ENDED_BOOTS_KEPT = 4  # per peer: boot_ids of processes a restart ended (their late handshakes lose)
DIAL_MAINTENANCE_INTERVAL_S = 1.0  # how often the dial loop looks for peers to (re)dial
UPGRADE_FIRST_S = 2.0  # a relayed link tries a direct one this long after it came up
UPGRADE_BACKOFF_MIN_S = 30.0  # then, after failures, at this interval doubling up to the max
UPGRADE_BACKOFF_MAX_S = 600.0
PEER_FORGET_S = 3600.0  # a peer unreachable this long leaves the table
ROSTER_AWAY_S = 7 * 86400.0  # a roster member linked this recently counts as away, not gone (swarm remove)
PEX_INTERVAL_S = 30.0
PEX_MAX_PEERS = 64
PEX_MAX_UNLINKED = 128  # peers learnt only from PEX and never linked that the table holds; more are not learnt
MDNS_MAX_UNLINKED = 64  # peers learnt from mDNS alone and never linked that the table holds (anyone on the LAN
# can copy the swarm's public tag into made-up announcements); a new one takes the place of the oldest not being dialled
PEX_EVICT_PER_PEER = PEX_MAX_PEERS  # a full pool: never-linked records one member's PEX may push out (those the
# largest other sharer taught), refilled over PEX_INTERVAL_S: a full honest frame every interval gets in whole
PEER_CACHE_SAVE_DELAY_S = 2.0  # debounce for peers.json writes
PEER_CACHE_MAX = 256
FOREIGN_PEERS_MAX = 1024  # entries: addresses (peers.json too) and, apart, node ids known not to speak SwarmLLM;
# past it the oldest go first (one entry per misdialled address, never forgotten, grew without end)
REFUSED_ADDRS_MAX = 1024  # addresses this node dialled and was refused at (not dialled again as a bootstrap or
# relay); past it the least recently refused goes first (one per refused address, kept for the whole run, grew without end)
PEER_LACKS_MAX = 1024  # peer processes (node ids) whose refused, or answered, frame types are kept (each of the two
# tables); past it the least recently noted goes first (a client churning identities grew them until forgotten)
MDNS_RESOLVE_TIMEOUT_MS = 3000
MDNS_DAY_S = 86400  # the mDNS tag changes every UTC day (Clock.day)
CLOCK_SKEW_WARN_S = 300.0  # a peer's HELLO time this far from ours: WARNING once (nothing in a link needs
# clocks to agree, but a machine this far off has no time sync, and a day off hides it from mDNS)
# an mDNS tag for a day this far from ours is not accepted: a member's recorded announcement could
# otherwise be replayed forever (a clock reset to 1970 or 2000 is not found by mDNS; bootstrap works)
MDNS_CLOCK_SKEW_MAX_DAYS = 366
MDNS_ADDRESS_CHECK_S = 5.0  # how often the host's IPv4 addresses are compared with what mDNS announces
RELAY_MAX_REGISTRATIONS = 1024
RELAY_MAX_CIRCUITS = 64  # spliced circuits open at once on a relay
# circuits (open, being set up, or ticketed and not yet used) one member may hold at a relay: until
# 2026-12-06 one member could take all RELAY_MAX_CIRCUITS and every other got too_many_circuits
RELAY_MAX_CIRCUITS_PER_MEMBER = 8
# a circuit's bytes (both directions) are rate-limited, never capped over its lifetime: a token bucket
# of RELAY_CIRCUIT_BURST_BYTES refilled at RELAY_CIRCUIT_BYTES_PER_S; past it the relay stops reading
# (TCP pushes back on the sender) until the bucket refills. Until 2026-12-06 a circuit was closed after
# 4 GiB in all, so a busy relayed link (a split model's hidden states) was dropped once per 4 GiB.
RELAY_CIRCUIT_BURST_BYTES = 256 * 1024 * 1024
RELAY_CIRCUIT_BYTES_PER_S = 32 * 1024 * 1024
RELAY_CIRCUIT_IDLE_S = 120.0  # a circuit with no bytes this long is dropped (links ping every 2 s)
RELAY_CIRCUIT_SETUP_TIMEOUT_S = 10.0  # target must answer an incoming circuit within this
RELAY_LIST_INTERVAL_S = 10.0  # rendezvous: ask each relay who is registered
RELAY_REGISTER_RETRY_S = 30.0  # a relay that refused our registration (full) is asked again this often
RELAY_MAX_UNLINKED = 128  # peers learnt only from relays' lists and never linked that the table holds

# --- model downloads (node/models/download/) ---
DOWNLOAD_CONNECT_TIMEOUT_S = 15.0
DOWNLOAD_READ_TIMEOUT_S = 60.0  # no byte for this long: the attempt failed (then resumes)
DOWNLOAD_RETRIES = 6  # attempts per download (network errors, 5xx, 429), resuming with Range
DOWNLOAD_RETRY_BASE_S = 1.0  # backoff: base * 2^(attempt-1), at most 30 s
DOWNLOAD_RETRY_AFTER_MAX_S = 120.0  # a 429/503's Retry-After is honoured up to this long
DOWNLOAD_PUBLIC_CHECK_S = 20.0  # a finished download's origin check (DNS + one HEAD): longer = not public
DOWNLOAD_PROGRESS_S = 0.25  # progress events at most this often
DOWNLOAD_LOG_S = 30.0  # a download's progress is logged (info) at most this often
DOWNLOAD_STALLED_S = 10.0  # the GUI's downloads panel says "stalled" after no byte arrived for this long
DOWNLOAD_STALL_CHECK_S = 1.0  # how often the panel looks for stalled downloads (no events come then)
# finished downloads (done, failed, cancelled, resumed as another) kept for GET /api/admin/downloads,
# the oldest forgotten first; paused and running ones are always kept (2026-12-07 soak: every one of
# the run was kept, so a script retrying a bad link grew the node by a job per try)
DOWNLOADS_FINISHED_KEPT = 64
HF_LISTING_TIMEOUT_S = 30.0  # a Hub repo's file listing (hf://owner/repo:QUANT), each page, all in all
HF_LISTING_ATTEMPTS = 3  # asks of the listing on a 429/5xx or a dropped connection
HF_LISTING_RETRY_AFTER_MAX_S = 20.0  # the listing's Retry-After is honoured up to this long (a request waits)
HF_LISTING_PAGES_MAX = 50  # pages of a repo's listing followed (the Hub's Link: rel="next")
HF_LISTING_NAMES_SHOWN = 8  # files named in an error that lists what a repo has
MODELS_WATCH_S = 5.0  # the models folder is looked at (stat only) this often while the node runs: a new
# .gguf is taken once two looks find its size and mtime unchanged, a removed one's model leaves
PARTIAL_HELD_PROBE_S = 10.0  # a partial model with layers here: its origin's probe at start waits at most this,
# then the node serves what it holds (an origin that accepts and never answers held the start for
# DOWNLOAD_READ_TIMEOUT_S, the API down for a minute)
PARTIAL_COALESCE_GAP = 1 << 20  # tensors of a partial model this close in the file: one Range request
PARTIAL_PROGRESS_LOG_S = 2.0  # a layer fetch's progress line at INFO this often (DEBUG in between)
PARTIAL_STATE_EVERY = 8 << 20  # bytes between two records of a layer fetch's progress (resume point)
# A partial model's tensors from a peer that holds them (MODEL_PART frames), checked against the
# peer's per-tensor sha256s and one random range of them against the origin (node/models/partial/peers.py):
PARTIAL_PEER_CHUNK = 1 << 20  # per MODEL_PART reply: no head-of-line block on a busy link
PARTIAL_PEER_WINDOW = 4  # chunk requests in flight to one peer (flow control: ≤ 4 MiB unread)
PARTIAL_PEER_TIMEOUT_S = 30.0  # one chunk
PARTIAL_SPOT_CHECK_BYTES = 64 << 10  # the range refetched from the origin and compared
# a node holding a model's whole file answers MODEL_PART too (node/inference/pipeline/wholeparts.py):
ADVERT_FILES_MAX = 64  # whole files a HELLO lists as held (`files`: 64-hex sha256 each, ~4.3 KB at most)
PARTIAL_WHOLE_HASH_BYTES = 256 << 20  # tensor bytes hashed for one `hashes` request at most (the rest: asked again)

# --- distributed pipeline (node/inference/pipeline) ---
PREFILL_CHUNK_TOKENS = 256  # prompt tokens per WORK step, at most
PIPELINE_MIN_CHUNK_TOKENS = 64  # a shorter prefill on a chain is cut into one step per segment while each
# keeps this many rows: the segments work on different steps at once (run.prefill_steps). Set when a
# step of 32 rows or fewer lost qgemm's 8-bit prompt products (3 x 21 rows: a 62-row turn lost there
# what it gained in overlap); prompt rows are now marked and keep them in any step (not re-measured)
SESSION_TTL_S = 300.0  # an idle KV session on a segment is freed after this
KEPT_SESSION_TTL_S = 900.0  # a finished one kept for its conversation's next turn, after this
BATCH_MAX_STEPS = 16  # a segment runs at most this many sessions' queued steps as one forward
BATCH_MAX_ROWS = 512  # ... of at most this many rows together (a longer prefill chunk runs alone)
SLICE_RESIDUAL_MAX_ROWS = 8  # int8 slices (fbgemm): inputs up to this many rows take the residual pass (weights/linear.py)
# payload bytes of one sender's steps queued for a slice: past it a further step is refused 429-style
# (`overloaded`, back-pressure) rather than held (2026-12-07: a member's 64 MiB WORKs queued without bound);
# a sender with nothing queued always gets one step in
SLICE_QUEUE_SENDER_MAX_BYTES = 256 << 20
KEPT_ROUTE_MAX_SLOWDOWN = 1.5  # a conversation's next turn keeps its chain (its KV) unless that chain's
CHAIN_LOAD_WEIGHT = 0.25  # a holder's ms/layer for a new request grows by this per request of ours it runs:
# equal holders share the requests (a tie-breaker; a segment batches its sessions, so a second costs it far less than one)
# estimate per token is this many times the cheapest's (then it prefills in full on the cheaper one)
CHAIN_PREFIX_MIN_TOKENS = 16  # a chain resumes a kept session only for a common prefix this long
SESSION_SWEEP_INTERVAL_S = 10.0
SESSION_MIN_CAPACITY = 256  # positions a slice session's KV cache allocates on its first forward (grows by doubling)
KV_BUDGET_BYTES = 4 * 1024**3  # KV bytes a node keeps across sessions before LRU eviction
KV_RESERVE_IDLE_S = 30.0  # a session in use not stepped this long counts its KV, not its admission's reserve
SLICE_DTYPES = ("auto", "f32", "bf16", "f16", "int8")  # a slice's weight format (auto: int8 on CPU, f16 on CUDA)
SLICE_KV_DTYPES = ("auto", "f16", "f32")  # a slice's KV cache element type (auto: f16 where the kernels read it)
WEIGHT_CACHE_BYTES = 16 * 1024**3  # converted slice weights kept on disk (data dir's cache/weights)
ACK_DEADLINE_MIN_S = 0.5  # never expect an ACK faster than this (plus the peer's RTO)
ACK_HOLD_S = 0.1  # a segment sends its ACK with the step's output, or this long after receipt if the
# step is slower: an ACK at receipt delays the step's start (GIL), and one mid-compute wakes two
# loops while the slice's threads run (on shared cores that stalls the thread team: 110M model,
# 3 segments on 2 vCPUs, 73-80 tok/s with a 2 ms hold, 85-92 with this)
ACK_DONE_MAX_BYTES = 64 * 1024  # an ACK is `done` (the next hop's ACK clock starts) only when the
# forwarded hidden states are this small and nothing larger waits on the link: a big prefill chunk
# on a slow or busy link needs transfer time the ACK budget (an RTT figure) does not include
STEP_COMPUTE_MIN_S = 10.0  # a segment's compute allowance per step, before the estimate scales it
STEP_COMPUTE_FACTOR = 20.0  # allowance = max(min, factor * estimated compute)
MAX_ASSEMBLIES = 3  # attempts per request (first + failovers)
# A request with no route because a holder's link dropped (this request's, or one heard from this
# long ago) waits this long for it to link again (a restarting peer, a Wi-Fi blip) before failing
ROUTE_REGAIN_S = 15.0
ROUTE_GONE_MAX = 1024  # peers whose link dropped remembered for regain before the expired ones are pruned
ROUTE_REGAIN_POLL_S = 0.2
SESSION_TOMBSTONE_S = 120.0  # an ended (or cancelled) session id is refused this long (late WORK must not recreate it)
# CANCEL / SESSION_END naming a session this node does not hold in use for its sender (never opened
# here yet, already ended, kept) cost a tombstone and a job on each slice's executor: charged to a
# per-sender token bucket (an honest coordinator sends one per session and segment); past it they
# are dropped. Ending a session its sender opened here is never charged.
SESSION_CONTROL_BURST = 512
SESSION_CONTROL_PER_S = 50.0
SESSION_CONTROL_MAX_SENDERS = 1024  # buckets kept; past it refilled ones, then the least recently charged, go
GENERATE_KEEPALIVE_S = 0.5  # a remote-generate holder with no TOKENS to send for this long sends an
# empty one (queued, loading, prefill): so silence means a stalled or lost holder, not a long prompt
GENERATE_SILENCE_S = 1.5  # the coordinator fails a holder silent this long (plus its ACK budget)
ADVERT_RATE_CHANGE = 1.5  # a whole model's decode rate first measured, or changed by this factor: HELLO again
# Remote embeddings (EMBED / EMBEDDED frames): what one peer may ask of a whole holder at once
EMBED_REMOTE_MAX_INPUTS = 2048  # inputs in one EMBED (OpenAI's limit per request)
EMBED_REMOTE_MAX_TOKENS = 1 << 20  # token ids in one EMBED, all inputs together (4 MiB of payload)
EMBED_REMOTE_MAX_REPLY_BYTES = 64 * 1024 * 1024  # float32 vectors in one EMBEDDED: inputs x n_embd x 4
# EMBEDs one peer may have running or queued on a holder at once (each holds up to 4 MiB of ids and
# a reply of up to EMBED_REMOTE_MAX_REPLY_BYTES): more are refused `overloaded`
EMBED_REMOTE_MAX_PER_ASKER = 8
# the asker's wait for one EMBED's vectors, keepalives or not: a holder that keeps the request
# alive for longer is left out and the next one asked
EMBED_REMOTE_MAX_WAIT_S = 600.0
SERVED_COORDINATORS_MAX = 64  # coordinators remembered per slice for `served for others`

# --- automatic layer choice (node/inference/pipeline/autoserve.py, `--serve auto`) ---
AUTO_SERVE_REEVALUATE_S = 120.0  # periodic re-check of the served range (jittered ±20 %; config
# serve_reevaluate_s overrides it, tests shorten it), besides on peers joining or leaving
AUTO_SERVE_START_DELAY_S = 2.0  # the first choice waits a random 0..this, so nodes starting together
# see each other's choices instead of all taking the same window
AUTO_SERVE_LOOK_S = 1.5  # ... and at least this long after the peer network started (links come up)
AUTO_SERVE_REACT_S = 0.5  # a peer joining or leaving is acted on after 1-3× this (jittered)
AUTO_SERVE_CLAIM_STALE_S = 60.0  # a peer's claim (a range advertised loading) whose fetch has not moved for
# this long no longer counts as their holder: the nodes that can cover them do (a stalled origin held a claim,
# and the model uncovered, for as long as its fetch lasted)
AUTO_SERVE_CLAIM_MAX_S = 3600.0  # ... nor one seen this long, however its fetch moves (a trickle, or a member
# that makes its numbers up)
CLAIM_PROGRESS_ANNOUNCE_S = 20.0  # a loading slice's fetch progress goes to peers (HELLO) at most this often
AUTO_SERVE_DEFER_ROUNDS = 3  # evaluations a node waits for the first mover (same coverage) before moving itself
AUTO_SERVE_BALANCE_ROUNDS = 3  # a move for throughput alone is made once found on this many periodic rounds in a
# row (~6 min): measured speeds that alternate by ±25 % moved a spare node back and forth every round
PARTIAL_START_OPEN_WAIT_S = 2.0  # a --model URL's origin probe holds the start at most this; a slower one goes on in
# the background, the node up without it (an origin that accepted and never answered held the API for 60 s)
PARTIAL_OPEN_RETRY_MIN_S = 5.0  # a --model URL unreachable at start (nothing of it here) is tried again after this,
PARTIAL_OPEN_RETRY_MAX_S = 300.0  # doubling up to this
SLICE_LOAD_TOUCHED_TRIES = 3  # loads of a slice whose file was touched (hashed again: the same bytes) as it loaded
SLICE_RECHECK_TOUCHED_TRIES = 3  # re-hashes of a loaded slice's file touched again during each (then: at its next step)
AUTO_SERVE_RETRY_MIN_S = 5.0  # a slice that failed to load is chosen again after this, doubling to the re-check period
AUTO_SERVE_DRAIN_S = 30.0  # after a move, the old range is freed once no session uses it, or after this
AUTO_SERVE_DRAIN_POLL_S = 0.5
AUTO_SERVE_HEADROOM_MB = 1024  # free memory kept back when no --slice-budget-mb is given

# --- OpenAI Responses API: conversations kept for previous_response_id (node/api/response_store.py) ---
RESPONSE_STORE_MAX = 256  # stored responses, least recently used dropped first
RESPONSE_STORE_MAX_BYTES = 16 * 1024 * 1024  # their size (JSON of body + conversation), same order
RESPONSE_STORE_TTL_S = 3600.0  # a stored response expires this long after it was written

# --- peer network: what a HELLO may say of the peer (node/net/_messages.py) ---
REGION_MAX_CHARS = 32  # a peer's advertised region; longer is a protocol error
# a peer's refusal text (ERROR not_a_member) as this node keeps it for the report, the admin API and
# the GUI's Peers table: one line, at most this long (a stranger wrote up to 1024 chars, newlines kept)
REFUSAL_REASON_MAX_CHARS = 160

# --- sampling: what every engine's penalties see (batch_engine, pipeline sampler, api/extras) ---
PENALTY_LAST_N_TOKENS = 64  # tokens the repeat/frequency/presence penalties look back on (llama.cpp's default)

# --- Ollama's API (node/api/ollama.py): unknown field and option names, ignored and said once at DEBUG ---
OLLAMA_IGNORED_NAMES_MAX = 256  # names remembered as said (a body of 20,000 made-up keys grew the set for good)
OLLAMA_IGNORED_NAME_CHARS = 40  # a name in that log line, at most this long
