"""`swarmllm-tray [node options]`: the desktop app.

It takes exactly the options of `swarmllm run` (the same parser, so they never drift), builds
the same NodeConfig, and runs the same Node on qasync's QEventLoop: one loop, no second loop and
no thread hosting the node.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import re
import sys

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """`swarmllm run`'s own parser, renamed, plus the app's options."""
    from node.commands import run as run_command

    subcommands = argparse.ArgumentParser(add_help=False).add_subparsers()
    run_command.add_parser(subcommands)
    parser = subcommands.choices["run"]  # the `run` parser itself
    parser.prog = "swarmllm-tray"
    parser.description = "SwarmLLM desktop app: a tray icon and a window hosting a node."
    parser.add_argument("--show", action="store_true", help="open the window at start")
    parser.add_argument("--no-tray", action="store_true",
                        help="behave as if the platform had no system tray (the window is the app)")
    return parser


def run_app(config, *, show_window: bool = False, tray_available: bool | None = None) -> int:
    """Create the QApplication and the qasync loop, run the app until Quit."""
    import qasync
    from PySide6.QtWidgets import QApplication

    from app.icons import look_icon
    from app.tray_app import TrayApp

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("SwarmLLM")
    app.setApplicationDisplayName("SwarmLLM")
    app.setQuitOnLastWindowClosed(False)  # the tray keeps running with no window
    app.setWindowIcon(look_icon("serving"))
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    try:
        tray_app = TrayApp(config, show_window=show_window, tray_available=tray_available)
        return loop.run_until_complete(tray_app.async_run())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def say_cannot_start(text: str) -> None:
    """A reason the app cannot start at all (a config.toml it cannot use), in a dialog: a tray
    app's user has no console, and the app vanished without a word (the line went to stderr).
    Without a display (Linux, no X11/Wayland, no QT_QPA_PLATFORM) Qt would abort the process
    (exit 134, found in review): the stderr line is all there is then."""
    if sys.platform.startswith("linux") and not any(
            os.environ.get(k) for k in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")):
        return
    from PySide6.QtWidgets import QApplication, QMessageBox

    qt_app = QApplication.instance() or QApplication(sys.argv[:1])
    qt_app.setApplicationName("SwarmLLM")
    box = QMessageBox(QMessageBox.Icon.Critical, "SwarmLLM cannot start", text, QMessageBox.StandardButton.Close)
    box.setObjectName("cannot-start")
    box.exec()


GUI_PACKAGES = (("PySide6", "PySide6.QtWidgets"), ("qasync", "qasync"), ("segno", "segno"))  # the gui extra
_SHARED_LIBRARY = re.compile(r"[\w.+-]+\.(?:so(?:\.[\d.]+)?|dylib|dll)\b", re.IGNORECASE)


def _is_missing(exc: ImportError, package: str) -> bool:
    """Whether `exc` says `package` itself (or one of its modules) is not installed."""
    name = exc.name or ""
    return isinstance(exc, ModuleNotFoundError) and (name == package or name.startswith(package + "."))


def gui_import_problems() -> tuple[list[str], dict[str, str]]:
    """The desktop app's packages (the `gui` extra) that are not installed, and those installed
    that fail to import, with the error (a system library missing: PySide6 on a minimal Linux says
    "libEGL.so.1: cannot open shared object file"). `pip install -e .` (README's quick start)
    installs the node only, and `swarmllm-tray` then ended in a ModuleNotFoundError traceback (found
    in the docs audit of 2026-12-07); until review, any ImportError read as "not installed" (the
    user was told to reinstall and never saw the library's name) and segno was not checked."""
    missing: list[str] = []
    broken: dict[str, str] = {}
    for package, module in GUI_PACKAGES:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            if _is_missing(exc, package):
                missing.append(package)
            elif package == "qasync" and ("PySide6" in missing or "PySide6" in broken):
                continue  # qasync imports PySide6: its failure is that one, said already
            else:
                broken[package] = str(exc)
    return missing, broken


def say_gui_import_problems(missing: list[str], broken: dict[str, str]) -> None:
    """Log what to install: the gui extra for a package not installed, a system library for one
    that is installed but cannot load."""
    if missing:
        log.error("the desktop app needs %s: pip install 'swarmllm[gui]' (from a checkout: pip install -e "
                  "'.[gui]'); `swarmllm run` serves the same node without it", " and ".join(missing))
    for package, error in broken.items():
        library = _SHARED_LIBRARY.search(error)
        what = f"the system library {library.group(0)}" if library else "a system library it needs"
        log.error("the desktop app cannot load %s, which is installed: %s. %s is probably missing: install it "
                  "with the system's package manager (reinstalling %s does not bring it); `swarmllm run` "
                  "serves the same node without the app", package, error, what[0].upper() + what[1:], package)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `swarmllm-tray` console script."""
    from node.runtime import configure_process

    configure_process()  # before the node imports torch
    from node.commands.run import cli_overrides
    from node.config import load_config
    from node.datadir import data_dir_error
    from node.errors import NodeError
    from node.logs import setup_logging

    args = build_parser().parse_args(argv)  # --help works without the GUI packages
    missing, broken = gui_import_problems()
    if missing or broken:
        setup_logging(args.verbose)
        say_gui_import_problems(missing, broken)
        return 2
    try:
        config = load_config(cli_overrides(args))
    except NodeError as exc:
        setup_logging(args.verbose)
        log.error("configuration error: %s", exc.message)
        say_cannot_start(f"Configuration error: {exc.message}")
        return 2
    try:
        setup_logging(config.verbosity, config.data_dir if config.log_to_file else None)
    except OSError as exc:
        # node.log cannot be made there (read-only, not ours, a file in the way): the app still
        # opens, and its node's start fails on the same data dir and says why in the window
        # (this was an OSError traceback on a console the user of a tray app never sees)
        setup_logging(config.verbosity)
        log.error("no log file: %s", data_dir_error(config.data_dir, exc) or exc)
    return run_app(config, show_window=args.show, tray_available=False if args.no_tray else None)


if __name__ == "__main__":
    sys.exit(main())
