"""NodeConfig: every setting of a node in one object.

Precedence, lowest to highest: dataclass defaults < `config.toml` in the data dir <
`SWARMLLM_<FIELD>` environment variables < CLI flags. The config object is passed explicitly;
nothing else in the node reads `os.environ` for settings.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

import platformdirs

from node import const
from node.datadir import cannot_read
from node.errors import InvalidRequest
from node.logs import region_code

log = logging.getLogger(__name__)

ENV_PREFIX = "SWARMLLM_"
DATA_DIR_ENV = "SWARMLLM_NODE_DATA_DIR"  # seed 000 spelling, kept for compatibility


def default_data_dir() -> Path:
    """Platform data dir (`~/.local/share/swarmllm` on Linux)."""
    return Path(platformdirs.user_data_dir("swarmllm", appauthor=False))


@dataclass
class NodeConfig:
    """All node settings; units are in the field names."""

    # --- where things live ---
    data_dir: Path = field(default_factory=default_data_dir)  # api_key, identity.key, models/, node.log
    models: list[str] = field(default_factory=list)  # extra GGUF paths given with --model
    include_default_model: bool = True  # serve the embedded default model from resources/models
    default_model_name: str | None = None  # model id or name to use when a request names none

    # --- HTTP API ---
    host: str = "127.0.0.1"  # API bind address; loopback only by default
    port: int = const.DEFAULT_API_PORT
    require_api_key_for_inference: bool = True  # admin endpoints always need the key
    allowed_hosts: list[str] = field(default_factory=list)  # extra Host names accepted besides loopback names and IP addresses
    cors_origins: list[str] = field(default_factory=list)  # none by default
    max_request_body_bytes: int = const.MAX_REQUEST_BODY_BYTES

    # --- inference ---
    n_threads: int = 0  # llama.cpp / torch threads; 0 = number of physical cores
    n_ctx: int = 0  # context per loaded model; 0 = the model's trained context (capped by max_ctx)
    max_ctx: int = 8192  # cap for n_ctx when taken from the model
    max_queue_per_model: int = const.MODEL_QUEUE_MAX
    max_concurrent: int = 4  # requests one whole model decodes at once (one llama.cpp batch); more queue
    kv_cache_seqs: int = 4  # finished sequences whose KV stays cached per model (prefix reuse, LRU;
    # on a chain: the sessions this node coordinated, kept on their segments);
    # the KV is sized (max_concurrent + kv_cache_seqs + 1 spare) x n_ctx tokens per model, at most kv_total_tokens:
    kv_total_tokens: int = 16384  # a long context gets fewer sequences (cache ones first), never less than one
    speculative_max_draft: int = 8  # n-gram speculation (both routes): draft up to this many tokens per
    # decode step from the request's own context, verified in one forward; 0 = off
    flash_attention: bool = False  # whole models: llama.cpp's flash attention, as llama-server runs it:
    # faster with several requests at once (the 110M bench at 8 streams: 288 -> 310 tok/s here),
    # but its CPU kernel then depends on the batch (a lone decode over >= 512 cells splits the cells
    # across threads, a batch does not), so a seeded request's text may change with the load
    cpu_only: bool = False  # never place a model on the GPU (reason=configured_cpu_only)
    gpu_memory_budget_mb: int = 0  # 0 = free VRAM minus headroom
    layers: str | None = None  # "A-B" (inclusive): serve only these layers of --model (slice engine)
    serve: str = "whole"  # "whole": each --model whole (llama.cpp) unless --layers; "auto": the node
    # chooses which layers of each --model to serve from the swarm's coverage and its budget
    slice_budget_mb: int = 0  # memory for auto-chosen slices (weights + KV reserve), shared by the models; 0 = free minus headroom
    slice_kv_budget_mb: float = const.KV_BUDGET_BYTES / 2**20  # KV caches of served slices, all
    # sessions together (kept ones for prefix reuse go first, then the least recently used)
    serve_reevaluate_s: float = const.AUTO_SERVE_REEVALUATE_S  # --serve auto re-checks its range this
    # often (jittered ±20 %), besides on peers joining or leaving
    activation_bits: int = 16  # 32, 16 or 8: hidden-state precision on the wire
    slice_dtype: str = "auto"  # weights of served slices: auto (int8 on CPU, f16 on CUDA), f32, bf16, int8
    slice_kv_dtype: str = "auto"  # served slices' KV caches: auto (f16), f16, f32 (twice the memory)
    models_watch_s: float = const.MODELS_WATCH_S  # how often the models folder is looked at for .gguf
    # files added or removed while the node runs; 0 = never (a restart picks them up)
    slice_weight_cache_mb: float = const.WEIGHT_CACHE_BYTES / 2**20  # converted slice weights kept on disk
    # (data dir's cache/weights) so that loading a slice again skips the conversion; 0 = off

    # --- peer network ---
    peer_port: int = 0  # 0 = port + 10
    peer_host: str = "0.0.0.0"
    bootstrap: list[str] = field(default_factory=list)  # HOST:PORT peers dialled at start-up
    mdns: bool = True  # zeroconf discovery on the LAN
    relay: bool = False  # act as a relay and rendezvous for other nodes
    relays: list[str] = field(default_factory=list)  # relay HOST:PORT to register at
    no_direct: bool = False  # testing: reach peers through relays only
    public_lan_origins: bool = False  # testing, or a LAN mirror every member reaches: a download from a
    # loopback/LAN host may count as public (shared unloaded; download/public.py)
    region: str | None = None  # advertised region (e.g. "TH"), optional
    contribute: bool = True  # serve work for peers (the tray's "Pause contributing" clears it)
    contribute_models: dict[str, int] = field(default_factory=dict)  # model id -> MB: layers of it this node
    # chooses and serves for the swarm within that memory (0 = free memory minus headroom); the
    # desktop app's "Help serve this model" writes it, with `contribute`, to config.toml's [desktop]
    swarm: str = "private"  # "private": link only with members of this node's swarm (swarm.json);
    # "open" (opt-in): link with any other node of the open swarm

    # --- logging ---
    verbosity: int = 0  # 0 info, 1 -v debug, 2 -vv per frame/step, 3 -vvv trace
    log_to_file: bool = True  # rotating node.log in the data dir

    @property
    def effective_peer_port(self) -> int:
        """Peer listener port: explicit, else API port + 10 (ephemeral when the API port is 0)."""
        if self.peer_port or self.port == 0:
            return self.peer_port
        return self.port + const.PEER_PORT_OFFSET

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (paths as strings) for the diagnostics report and admin API."""
        out = dataclasses.asdict(self)
        out["data_dir"] = str(self.data_dir)
        return out


def _coerce(name: str, typ: Any, value: Any) -> Any:
    """Convert a TOML/env/CLI value to the field's type; a clear error names the field."""
    origin = getattr(typ, "__origin__", None)
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {value!r}")
        if typ is int or typ == (int | None):
            if value is None and typ is not int:
                return None
            return _whole_number(value)
        if typ is float:
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ValueError(f"expected a number, got {value!r}")
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"expected a number, got {value!r}") from None
        if typ is Path:
            return Path(value).expanduser()
        if origin is list:
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f'expected a list of strings, e.g. ["a", "b"], got {value!r}')
            return list(value)
        if origin is dict:
            return _budgets(value)
        if typ == (str | None) or typ is str:
            if isinstance(value, bool) or not isinstance(value, str | int | float | None):
                raise ValueError(f"expected a string, got {value!r}")
            return None if value is None else str(value)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"config field {name}: {exc}") from exc
    return value


def _whole_number(value: Any) -> int:
    """An int field's value: a whole number (TOML's 2.7 was cut to 2, `true` said "boolean given")."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a whole number, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"expected a whole number, got {value!r}")
        return int(value)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"expected a whole number, got {value!r}") from None


def _budgets(value: Any) -> dict[str, int]:
    """`{"model-id" = MB}` (TOML) or `model-id=MB,other=0` (environment, CLI)."""
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"expected model=MB pairs, got {value!r}")
        value = {k.strip(): v.strip() for k, v in pairs}
    if not isinstance(value, dict):
        raise ValueError(f"expected a table of model = MB, got {value!r}")
    out = {}
    for model, mb in value.items():
        if isinstance(mb, bool) or not isinstance(mb, int | str) or not str(mb).isdigit():
            raise ValueError(f"{model}: a memory budget is a whole number of MB (0 = free memory), got {mb!r}")
        out[str(model)] = int(mb)
    return out


def _field_types() -> dict[str, Any]:
    return get_type_hints(NodeConfig)


def apply_overrides(cfg: NodeConfig, values: dict[str, Any], source: str) -> None:
    """Set fields from a mapping; unknown keys are logged (not fatal) so old configs keep working."""
    types = _field_types()
    for key, value in values.items():
        if key not in types:
            near = difflib.get_close_matches(key, types, n=1)  # a typo: say which setting had no effect
            log.warning("ignoring unknown config key %s from %s%s", key, source,
                        f": did you mean {near[0]}?" if near else "")
            continue
        try:
            setattr(cfg, key, _coerce(key, types[key], value))
        except InvalidRequest as exc:  # say where the value came from: a stale export is not in config.toml
            where = f"{ENV_PREFIX}{key.upper()} in the environment" if source == "environment" else source
            raise InvalidRequest(f"{exc.message} (from {where})") from exc


def _flatten_toml(data: dict[str, Any]) -> dict[str, Any]:
    """Accept both flat keys and [section] tables (section names are only grouping)."""
    flat: dict[str, Any] = {}
    tables = {k for k, t in _field_types().items() if getattr(t, "__origin__", None) is dict}
    for key, value in data.items():
        if isinstance(value, dict) and key not in tables:  # `contribute_models = {...}` is a value
            flat.update(value)
        else:
            flat[key] = value
    return flat


def env_overrides(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """`SWARMLLM_<FIELD>` variables, plus SWARMLLM_NODE_DATA_DIR for the data dir."""
    environ = dict(os.environ if environ is None else environ)
    out: dict[str, Any] = {}
    types = _field_types()
    for name in types:
        key = ENV_PREFIX + name.upper()
        if key in environ:
            out[name] = environ[key]
    if DATA_DIR_ENV in environ:
        out["data_dir"] = environ[DATA_DIR_ENV]
    return out


SERVE_MODES = ("whole", "auto")


def validate(cfg: NodeConfig) -> None:
    """Settings that contradict each other or are out of range: a clear error naming them."""
    if cfg.serve not in SERVE_MODES:
        raise InvalidRequest(f"config field serve: expected one of {', '.join(SERVE_MODES)}, got {cfg.serve!r}")
    if cfg.serve == "auto" and cfg.layers:
        raise InvalidRequest(f"--layers {cfg.layers} and --serve auto conflict: --layers chooses the layers by "
                             "hand, --serve auto lets the node choose them; give one of the two")
    if cfg.layers and not cfg.models:  # else ignored: the default model is served whole, as without --layers
        raise InvalidRequest(f"--layers {cfg.layers} serves those layers of each --model: give the --model PATH "
                             "(or URL) to take them from")
    for name in ("port", "peer_port"):  # bind() would raise OverflowError, once the models are loaded
        if not 0 <= getattr(cfg, name) <= 65535:
            raise InvalidRequest(f"config field {name}: must be a TCP port 0..65535, got {getattr(cfg, name)}")
    if cfg.effective_peer_port > 65535:
        raise InvalidRequest(f"config field peer_port: the default, the API port + {const.PEER_PORT_OFFSET} "
                             f"({cfg.effective_peer_port}), is past 65535: give a lower port or a --peer-port")
    for name in ("n_ctx", "max_ctx"):
        if getattr(cfg, name) < 0:
            raise InvalidRequest(f"config field {name}: must be 0 (the model's own) or a number of tokens, "
                                 f"got {getattr(cfg, name)}")
    if not 1 <= cfg.max_concurrent <= 64:
        raise InvalidRequest(f"config field max_concurrent: must be 1..64, got {cfg.max_concurrent}")
    if not 0 <= cfg.kv_cache_seqs <= 64:
        raise InvalidRequest(f"config field kv_cache_seqs: must be 0..64, got {cfg.kv_cache_seqs}")
    if not 0 <= cfg.speculative_max_draft <= 32:
        raise InvalidRequest(f"config field speculative_max_draft: must be 0 (off) .. 32, got {cfg.speculative_max_draft}")
    if not cfg.slice_kv_budget_mb > 0:
        raise InvalidRequest(f"config field slice_kv_budget_mb: must be a size in MB above 0, got {cfg.slice_kv_budget_mb}")
    if not cfg.slice_weight_cache_mb >= 0:
        raise InvalidRequest(f"config field slice_weight_cache_mb: must be 0 (off) or a size in MB, "
                             f"got {cfg.slice_weight_cache_mb}")
    if cfg.slice_budget_mb < 0:
        raise InvalidRequest(f"config field slice_budget_mb: must be 0 (free memory) or a size in MB, "
                             f"got {cfg.slice_budget_mb}")
    if cfg.serve_reevaluate_s <= 0:
        raise InvalidRequest(f"config field serve_reevaluate_s: must be positive, got {cfg.serve_reevaluate_s}")
    if cfg.slice_dtype not in const.SLICE_DTYPES:  # the file and SWARMLLM_* skip the CLI's choices
        raise InvalidRequest(f"config field slice_dtype: expected one of {', '.join(const.SLICE_DTYPES)}, "
                             f"got {cfg.slice_dtype!r}")
    if cfg.activation_bits not in (32, 16, 8):  # peers refuse any other with every chained request
        raise InvalidRequest(f"config field activation_bits: expected one of 32, 16, 8, got {cfg.activation_bits}")
    if cfg.region and region_code(cfg.region, const.REGION_MAX_CHARS) != cfg.region:
        # peers show no region that is not a code (a comma or a space forged `regions=` fields)
        raise InvalidRequest(f"config field region: expected a code of letters, digits, _ and - (at most "
                             f"{const.REGION_MAX_CHARS}, such as TH or eu-west), got {cfg.region!r}")
    if cfg.slice_kv_dtype not in const.SLICE_KV_DTYPES:
        raise InvalidRequest(f"config field slice_kv_dtype: expected one of {', '.join(const.SLICE_KV_DTYPES)}, "
                             f"got {cfg.slice_kv_dtype!r}")


def is_model_url(model: str) -> bool:
    """A `--model` given by URL (fetched layer by layer), not a path: a file's URL or a Hugging Face
    repo (`hf://owner/repo:QUANT`, Ollama's `hf.co/owner/repo:QUANT`: node/models/download/hfrepo.py)."""
    return model.lower().startswith(("http://", "https://", "hf://", "hf.co/", "huggingface.co/"))


def _from_folder(model: str, folder: Path) -> str:
    """config.toml's `models` entry: a relative path is the config file's folder's (the tray app
    started from the desktop, cwd $HOME or /, and `swarmllm run` from a shell found different
    files until 2026-12-06); a URL or an absolute path is as written. --model and SWARMLLM_MODELS
    stay the working directory's, as a shell's paths are."""
    if is_model_url(model):
        return model
    path = Path(model).expanduser()
    return model if path.is_absolute() else str(folder / path)


def load_config(
    cli: dict[str, Any] | None = None, environ: dict[str, str] | None = None
) -> NodeConfig:
    """Build the NodeConfig: defaults < data_dir/config.toml < env < CLI.

    The data dir itself is resolved first (CLI > env > default), since config.toml lives in it.
    """
    cli = {k: v for k, v in (cli or {}).items() if v is not None}
    env = env_overrides(environ)
    cfg = NodeConfig()
    data_dir = cli.get("data_dir") or env.get("data_dir")
    if data_dir:
        cfg.data_dir = Path(data_dir).expanduser()
    config_path = cfg.data_dir / "config.toml"
    log.debug("DIAG: config load_or_create starting config_path=%s cli_port=%s cli_data_dir=%s",
              config_path, cli.get("port"), cli.get("data_dir"))
    try:
        text = config_path.read_text(encoding="utf-8") \
            if config_path.is_file() or config_path.is_dir() else None  # (a folder: said)
    except UnicodeDecodeError as exc:  # damaged (a crash, a bad copy): was a traceback
        raise InvalidRequest(f"{config_path}: not valid TOML: not UTF-8 text (byte {exc.start}); fix it, or "
                             "move it away to start with the defaults") from None
    except IsADirectoryError as exc:  # its settings were silently not applied
        raise InvalidRequest(cannot_read(config_path, exc)) from None
    except OSError as exc:  # not ours to read (a data dir made with sudo): was a PermissionError traceback
        raise InvalidRequest(f"cannot read {config_path} ({exc.strerror or exc}): give this user the right to "
                             "read it and its data dir, or give another --data-dir") from None
    if text is not None:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidRequest(f"{config_path}: not valid TOML: {exc}") from exc
        apply_overrides(cfg, _flatten_toml(data), str(config_path))
        cfg.models = [_from_folder(m, config_path.parent) for m in cfg.models]
    # allowed_hosts adds up: SWARMLLM_ALLOWED_HOSTS and --allow-host add names to config.toml's (each
    # replaced the list before it: containers got a 403 for a name config.toml allows; 2026-12-07)
    for values, source in ((env, "environment"), (cli, "command line")):
        kept_hosts = list(cfg.allowed_hosts)
        apply_overrides(cfg, {k: v for k, v in values.items() if k != "data_dir"}, source)
        if "allowed_hosts" in values:
            cfg.allowed_hosts = kept_hosts + [h for h in cfg.allowed_hosts if h not in kept_hosts]
    if data_dir:
        cfg.data_dir = Path(data_dir).expanduser()
    validate(cfg)
    log.debug("DIAG: config load_or_create complete port=%s data_dir=%s", cfg.port, cfg.data_dir)
    return cfg
