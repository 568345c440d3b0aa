"""Which GGUF files a node serves at start: the embedded default model, the data dir's models/
(whole files and partial models), and the command line's `--model` paths (URLs are partial models,
opened by node.inference.pipeline.partials)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from node.config import is_model_url
from node.datadir import MODELS_DIR
from node.models.file_kinds import model_files
from node.models.partial import SUFFIX as PARTIAL_SUFFIX
from node.models.partial import PartialStore
from node.resources import default_model_path

log = logging.getLogger(__name__)


def model_sources(data_dir: Path, cli_models: Iterable[str], *, include_default: bool,
                  exclude: set[Path] = frozenset()) -> list[tuple[Path, str]]:
    """(path, source) for every model file to catalog; source is default, data_dir or cli.
    `exclude`: partial models' directories already opened from URLs. Blocking (reads the disk):
    run it in an executor."""
    sources: list[tuple[Path, str]] = []
    if include_default:
        path = default_model_path()
        if path.is_file():
            sources.append((path, "default"))
        else:
            log.warning("the embedded default model is missing (%s)", path.name)
    models_dir = data_dir / MODELS_DIR
    if models_dir.is_dir():
        # any-case .gguf; of a split model part 1 only (llama.cpp loads the rest from it)
        sources += [(p, "data_dir") for p in model_files(models_dir)]
        sources += [(p, "data_dir") for p in sorted(models_dir.glob(f"*{PARTIAL_SUFFIX}"))
                    if p.resolve() not in exclude and PartialStore.is_partial(p)]
    sources += [(Path(p).expanduser(), "cli") for p in cli_models if not is_model_url(p)]
    return sources
