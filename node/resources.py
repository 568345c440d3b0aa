"""Where bundled resources (icons, the embedded default model) live."""

from __future__ import annotations

import os
import sys
from pathlib import Path

RESOURCES_ENV = "SWARMLLM_RESOURCES_DIR"  # packaging override; not a user setting
DEFAULT_MODEL_FILE = "swarmllm-pydoc-q8_0.gguf"


def resources_dir() -> Path:
    """The resources folder: PyInstaller bundle, explicit override, or the source checkout."""
    override = os.environ.get(RESOURCES_ENV)
    if override:
        return Path(override)
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        return Path(bundle) / "resources"
    return Path(__file__).resolve().parent.parent / "resources"


def default_model_path() -> Path:
    """The embedded default model (may be absent in a partial checkout)."""
    return resources_dir() / "models" / DEFAULT_MODEL_FILE


def icon_path(name: str) -> Path:
    """An icon file by name."""
    return resources_dir() / "icons" / name
