"""`swarmllm` command line: run | diagnostics | models | peers | chat | invite | join | swarm | test-split.

Each subcommand lives in its own module exposing `add_parser(subparsers)` which registers a
parser whose `func(args) -> int` runs it; this file only collects them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# module path of each subcommand; each exposes add_parser(subparsers)
SUBCOMMANDS = [
    "node.commands.run",
    "node.commands.client",  # diagnostics, models, peers, chat
    "node.commands.swarm",  # invite, join, swarm
    "node.inference.slice.testsplit",  # test-split
]


def add_node_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that starts or talks to a node."""
    parser.add_argument("-p", "--port", type=int, default=None, help="HTTP API port (default 8800)")
    parser.add_argument("--data-dir", default=None, help="data dir (default: platform data dir)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="-v: debug (every subsystem's DIAG lines, one per request or event, e.g. "
                        "`2>&1 | grep DIAG:`); -vv: also one per frame and pipeline step; -vvv: trace "
                        "(per layer, pings, and the libraries' own debug lines)")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (subcommands whose module is missing are skipped)."""
    parser = argparse.ArgumentParser(prog="swarmllm", description="SwarmLLM peer-to-peer LLM node")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # not built yet
            raise
        module.add_parser(sub)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line parsed (exit 2 with argparse's message on a mistake)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `swarm remove -p PORT ID`: argparse takes a command's optional positionals in one run, so a
    # node id after the options was "unrecognized" (`swarm remove ID -p PORT` worked)
    if args.command == "swarm" and args.action == "remove" and args.node_id is None and len(extra) == 1 \
            and not extra[0].startswith("-"):
        args.node_id, extra = extra[0], []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _keep_stdout_writable() -> None:
    """stdout redirected to a file or pipe on Windows is in the ANSI code page (cp1252, ...) with
    strict errors: a model's reply (`swarmllm chat ... > out.txt`) with a character outside it ended
    the command in a UnicodeEncodeError traceback. Such characters are written as escapes instead,
    as Python does on stderr."""
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `swarmllm` console script."""
    from node.errors import NodeError
    from node.runtime import configure_process

    configure_process()  # before any command imports torch
    args = parse_args(argv)
    _keep_stdout_writable()
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit, where a closed pipe is an "Exception ignored" trace
        return rc
    except NodeError as exc:  # a bad config.toml or SWARMLLM_* value, met by a command that talks to the node
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while `chat` streams, or while a command waits on a busy node
        sys.stderr.write("\n")  # the prompt on its own line, after the text cut short
        return 130
    except BrokenPipeError:  # `swarmllm invite | head -1`: the reader left before the output ended
        # Python flushes stdout again at exit: point it at /dev/null so that raises nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1  # as Python's own advice on SIGPIPE has it: the output was cut


if __name__ == "__main__":
    sys.exit(main())
