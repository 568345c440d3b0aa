"""`swarmllm run`: start a node headless and serve until SIGINT/SIGTERM/SIGHUP."""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from node import const
from node.config import load_config
from node.datadir import API_KEY_FILE, cannot_read, data_dir_error
from node.errors import NodeError
from node.logs import setup_logging
from node.stopping import log_busy_threads, log_pending_tasks, stop_signals

log = logging.getLogger(__name__)

LEFTOVER_TASKS_S = 5.0  # after Node.stop, what still runs has this long to end


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `run` and its flags."""
    from node.cli import add_node_options

    p = sub.add_parser("run", help="start the node and serve the API")
    add_node_options(p)
    p.add_argument("--host", default=None,
                   help="API bind address (default 127.0.0.1, this machine only; 0.0.0.0: every network, for apps "
                        "in containers, WSL or on other devices, which then need the API key, and --allow-host for a "
                        "name; :: every network, IPv6 and IPv4)")
    p.add_argument("--allow-host", action="append", default=None, dest="allowed_hosts", metavar="NAME",
                   help="accept requests whose Host is NAME besides loopback names and IP addresses, e.g. "
                        "host.docker.internal or mylaptop.local (repeatable; added to config.toml's allowed_hosts "
                        "and SWARMLLM_ALLOWED_HOSTS's names)")
    p.add_argument("--model", action="append", default=None, metavar="PATH|URL",
                   help="serve this GGUF file, or fetch only the served layers of one from its URL: http(s)://…, "
                        "hf://owner/repo/file.gguf, or a Hugging Face repo and quant, hf://owner/repo:Q4_K_M or "
                        "hf.co/owner/repo:Q4_K_M (with --layers or --serve auto; repeatable)")
    p.add_argument("--no-default-model", action="store_true", help="do not serve the embedded default model")
    p.add_argument("--n-threads", type=int, default=None, help="compute threads (default: physical cores)")
    p.add_argument("--ctx", type=int, default=None, dest="n_ctx", help="context length per model")
    p.add_argument("--cpu-only", action="store_true", default=None, help="never use a GPU")
    p.add_argument("--no-auth-inference", action="store_true",
                   help="let /v1 requests from this machine through without the API key (other machines, "
                        "containers, requests through a proxy, and admin still need it; a tunnel on this machine "
                        "counts as this machine)")
    g = p.add_argument_group("distributed inference")
    g.add_argument("--layers", default=None, metavar="A-B",
                   help="serve only layers A..B (inclusive) of each --model as a slice for the swarm")
    g.add_argument("--serve", choices=("whole", "auto"), default=None,
                   help="auto: choose which layers of each --model to serve from the swarm's coverage and "
                        "the memory budget (default whole; --layers is the manual override)")
    g.add_argument("--slice-budget-mb", type=int, default=None, metavar="MB",
                   help="memory for auto-chosen slices, weights + KV reserve (default: free memory minus headroom)")
    g.add_argument("--activation-bits", type=int, choices=(32, 16, 8), default=None,
                   help="hidden-state precision on the wire when coordinating (default 16)")
    g.add_argument("--slice-dtype", choices=("auto", "f32", "bf16", "int8"), default=None,
                   help="weight format of served slices (default auto: int8 on CPU)")
    g.add_argument("--slice-kv-dtype", choices=const.SLICE_KV_DTYPES, default=None,
                   help="KV cache type of served slices (default auto: f16; f32 takes twice the memory)")
    g = p.add_argument_group("peer network")
    g.add_argument("--peer-port", type=int, default=None, help="peer listener port (default API port + 10)")
    g.add_argument("--bootstrap", action="append", default=None, metavar="HOST:PORT",
                   help="a peer to dial at start-up (repeatable)")
    g.add_argument("--no-mdns", action="store_true", help="do not discover peers on the LAN by mDNS")
    g.add_argument("--relay", action="store_true", help="also act as a relay and rendezvous for other nodes")
    g.add_argument("--relays", action="append", default=None, metavar="HOST:PORT",
                   help="a relay to register at (repeatable)")
    g.add_argument("--no-direct", action="store_true", help="testing: reach peers through relays only")
    g.add_argument("--region", default=None, help="advertised region code, e.g. TH")
    g.add_argument("--open-swarm", action="store_true",
                   help="join the open swarm: link with any node that also opted in (default: private)")
    p.set_defaults(func=run)


def cli_overrides(args: argparse.Namespace) -> dict:
    """NodeConfig fields set on the command line (None = not given)."""
    return {
        "port": args.port,
        "data_dir": args.data_dir,
        "host": getattr(args, "host", None),
        "allowed_hosts": getattr(args, "allowed_hosts", None),
        "models": args.model,
        "include_default_model": False if getattr(args, "no_default_model", False) else None,
        "n_threads": getattr(args, "n_threads", None),
        "n_ctx": getattr(args, "n_ctx", None),
        "cpu_only": getattr(args, "cpu_only", None),
        "require_api_key_for_inference": False if getattr(args, "no_auth_inference", False) else None,
        "verbosity": args.verbose or None,
        "layers": getattr(args, "layers", None),
        "serve": getattr(args, "serve", None),
        "slice_budget_mb": getattr(args, "slice_budget_mb", None),
        "activation_bits": getattr(args, "activation_bits", None),
        "slice_dtype": getattr(args, "slice_dtype", None),
        "slice_kv_dtype": getattr(args, "slice_kv_dtype", None),
        "peer_port": getattr(args, "peer_port", None),
        "bootstrap": getattr(args, "bootstrap", None),
        "mdns": False if getattr(args, "no_mdns", False) else None,
        "relay": True if getattr(args, "relay", False) else None,
        "relays": getattr(args, "relays", None),
        "no_direct": True if getattr(args, "no_direct", False) else None,
        "region": getattr(args, "region", None),
        "swarm": "open" if getattr(args, "open_swarm", False) else None,
    }


async def serve(config) -> int:
    """Run a node until a stop signal."""
    from node.node import Node

    node = Node(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(thread_name_prefix="asyncio")  # the loop's, so that stopping can bound its join
    loop.set_default_executor(executor)

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():  # a second one while stopping: the user means now
            if sig.name == "SIGHUP":  # not a user: a closing terminal sends it twice (bash passes
                return  # it on, then the kernel to the foreground group) within milliseconds
            log.warning("DIAG: %s while stopping: exiting now", sig.name)
            _exit_now(1)
        stop.set()

    def from_signal_handler(signum: int, _frame) -> None:  # a plain handler, between two bytecodes
        if not loop.is_closed():
            loop.call_soon_threadsafe(on_signal, signal.Signals(signum))

    for sig in stop_signals():
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except NotImplementedError:
            # Windows' ProactorEventLoop has none: a plain handler hands the signal to the loop.
            # (asyncio.run's own Ctrl-C handler cancelled this coroutine instead: a Ctrl-C while
            # starting skipped node.stop() and exited 130.)
            signal.signal(sig, from_signal_handler)
        except RuntimeError:  # not the main thread: whoever runs us stops us
            pass
    try:  # every way out (a stop signal while starting, a failed start too: 2026-12-06 only the last)
        # start() may take long (a --layers slice fetching its layers from a slow origin): a stop
        # signal meanwhile ends it there, instead of waiting until the node has started
        starting = asyncio.create_task(node.start(), name="node-start")
        stopped = asyncio.create_task(stop.wait(), name="stop-signal")
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            log.info("DIAG: stop signal while starting: stopping")
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await node.stop()
            await _async_end_leftovers(executor)
            return 0
        stopped.cancel()
        try:
            starting.result()
        except (OSError, NodeError) as exc:
            message = getattr(exc, "message", None) or exc
            if isinstance(exc, OSError):  # the ports' are NodeErrors (api.server, net._manager)
                message = data_dir_error(config.data_dir, exc) or exc
            log.error("cannot start the node: %s", message)
            await node.stop()
            await _async_end_leftovers(executor)
            return 2
        # Start-up leaves a few hundred thousand long-lived objects (torch, llama, node); moving them out
        # of the collector's reach keeps full GC passes (60-180 ms here) from stalling the loop later.
        gc.freeze()
        log.info("SwarmLLM node %s serving at %s (API key in %s)", node.short_id, node.api_url,
                 config.data_dir / API_KEY_FILE)
        try:
            await stop.wait()
        finally:
            await node.stop()
            await _async_end_leftovers(executor)
        return 0
    finally:
        _ignore_late_hangups(loop)


def _ignore_late_hangups(loop: asyncio.AbstractEventLoop) -> None:
    """Stopped: a closing terminal's second SIGHUP may still come. Closing the loop restores its
    default action (asyncio resets the signals it handled), which killed the process (exit -1) when
    it landed after that, in about 1 run of 3 under load (CI); the node has stopped: it is ignored."""
    hup = getattr(signal, "SIGHUP", None)
    if hup is None or hup not in stop_signals():
        return
    try:
        loop.remove_signal_handler(hup)  # (so that closing the loop leaves it as set here)
        signal.signal(hup, signal.SIG_IGN)
    except (RuntimeError, ValueError):  # not the main thread: whoever runs us handles it
        pass


async def _async_end_leftovers(executor: ThreadPoolExecutor | None) -> None:
    """Cancel what still runs after the node stopped and wait a little: asyncio.run would wait for
    ever on a task that ignores its cancellation, so one that does is logged and the process ends."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=LEFTOVER_TASKS_S)
        if pending:
            log_pending_tasks("still running after the node stopped", exclude=asyncio.current_task())
            log.error("DIAG: exiting with tasks that ignored their cancellation count=%d", len(pending))
            _exit_now(1)
    # asyncio.run then waits for the default executor's threads with no limit (Python 3.11): one
    # still busy (a to_thread call whose task was cancelled goes on running) is named, and we go
    # (its shutdown_default_executor joins on the loop, so a bound around it would not hold)
    if executor is not None:
        loop = asyncio.get_running_loop()
        joined = loop.create_future()

        def join() -> None:
            executor.shutdown(wait=True)
            loop.call_soon_threadsafe(lambda: joined.done() or joined.set_result(None))

        threading.Thread(target=join, name="executor-join", daemon=True).start()
        try:
            await asyncio.wait_for(joined, LEFTOVER_TASKS_S)
        except TimeoutError:
            log_busy_threads("still running after the node stopped")
            log.error("DIAG: exiting with executor threads still busy")
            _exit_now(1)


def _exit_now(code: int) -> None:
    logging.shutdown()  # the log file gets its last lines
    os._exit(code)


def _check_models(models: list[str], *, as_slices: bool) -> None:
    """Each model path given (--model, config.toml's models) can be served, else a ModelLoadError
    saying why, before anything starts: the node logged one warning among its start-up lines and
    went on serving the default model (or nothing), which was easy to miss. `as_slices` (--layers,
    --serve auto): a split model is refused (it is served whole only), before it is hashed."""
    from pathlib import Path

    from node.config import is_model_url
    from node.models.catalog import check_model_file
    from node.models.file_kinds import refuse_slices
    from node.models.partial import PartialStore

    for model in models:
        path = Path(model).expanduser()
        if not is_model_url(model) and not PartialStore.is_partial(path):
            header = check_model_file(path, "cli")
            if as_slices:
                refuse_slices(path.name, header)


def run(args: argparse.Namespace) -> int:
    """Entry point of `swarmllm run`."""
    try:
        config = load_config(cli_overrides(args))
    except NodeError as exc:
        setup_logging(args.verbose)
        log.error("configuration error: %s", exc.message)
        return 2
    try:
        setup_logging(config.verbosity, config.data_dir if config.log_to_file else None)
    except OSError as exc:  # node.log cannot be made there: read-only, not ours, a file in the way
        setup_logging(config.verbosity)
        if exc.errno == errno.EISDIR and exc.filename:  # a folder named node.log
            log.error("%s", cannot_read(Path(exc.filename), exc))
            return 2
        why = "a file, not a directory" if config.data_dir.is_file() else exc.strerror or exc
        log.error("cannot use the data dir %s (%s): give a writable directory with --data-dir", config.data_dir, why)
        return 2
    try:
        _check_models(config.models, as_slices=bool(config.layers) or config.serve == "auto")
    except NodeError as exc:
        log.error("cannot serve --model: %s", exc.message)
        return 2
    try:
        return asyncio.run(serve(config))
    except KeyboardInterrupt:
        return 130
