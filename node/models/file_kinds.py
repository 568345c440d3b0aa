"""What a `.gguf` in the models folder is, beyond "a model": a part of a split model, or a GGUF that
is not a model at all (2026-12-06).

Hugging Face ships big models split by llama.cpp's gguf-split: `name-00001-of-00003.gguf`, … each
part with the KV keys `split.no`, `split.count`, `split.tensors.count`; llama.cpp loads the set given
part 1. So the folder's listing (`model_files`) keeps part 1 of a set and leaves the other parts out,
and the catalog's check (`check_split`) says which part is missing or cut short, by name.

Other GGUFs sit next to models: vision projectors (`mmproj-*.gguf`, general.architecture `clip` or
general.type `mmproj`), LoRA adapters (general.type `adapter`), imatrix data, llama.cpp's vocabulary
test files (`ggml-vocab-*.gguf`: no tensors). `not_a_model` says what such a file is; the catalog
lists it among the ignored files (an INFO line), not among the models nor the refused copies.
"""

from __future__ import annotations

import re
from pathlib import Path

from node.errors import ModelLoadError, SplitModelServedWhole
from node.models.gguf_meta import GgufHeader, read_header

# llama.cpp's llama_split_path: "%s-%05d-of-%05d.gguf"; matched in any case so that a set spelt
# otherwise (`-OF-`, `.GGUF`) is one set, refused as a whole with the reason (check_split)
SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


class NotAModel(ModelLoadError):
    """A GGUF that is not a chat/completion model (a projector, an adapter, a vocabulary)."""


def split_part(path: Path) -> tuple[str, int, int] | None:
    """(prefix, part number, part count) of a file named as a split model's part, else None."""
    m = SPLIT_RE.match(path.name)
    if m is None or int(m["count"]) < 2 or not 1 <= int(m["no"]) <= int(m["count"]):
        return None
    return m["prefix"], int(m["no"]), int(m["count"])


def set_stem(path: Path) -> str:
    """A split set's name (`big` for `big-00001-of-00003.gguf`), else the file's stem."""
    part = split_part(path)
    return part[0] if part is not None else path.stem


def is_gguf_name(path: Path) -> bool:
    """`.gguf` in any case (`MODEL.GGUF` from a Windows copy is one too)."""
    return path.suffix.lower() == ".gguf"


def model_files(models_dir: Path) -> list[Path]:
    """The folder's GGUF files a model may be loaded from, sorted: any-case `.gguf`, and of a split
    set its part 1 only (the other parts are part 1's to check). Blocking; OSError if unreadable."""
    out = []
    for path in models_dir.iterdir():
        if not is_gguf_name(path):
            continue
        part = split_part(path)
        if part is not None and part[1] != 1:
            continue
        out.append(path)
    return sorted(out)


def llama_split_name(prefix: str, no: int, count: int) -> str:
    """A split part's name as llama.cpp spells it (llama_split_path), and as it alone accepts part 1's."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def set_files(path: Path) -> list[Path]:
    """The files of part 1's split set as llama.cpp looks for them (only `path` if not a split part):
    llama.cpp's spelling, lower-case `-of-` and `.gguf`, whatever the case of `path`'s."""
    part = split_part(path)
    if part is None or part[1] != 1:
        return [path]
    prefix, _, count = part
    return [path.with_name(llama_split_name(prefix, i, count)) for i in range(1, count + 1)]


def _misspelt(stem: str, found: Path, wanted: str) -> ModelLoadError:
    return ModelLoadError(f"{stem}: {found.name} is not spelt as llama.cpp looks for a split model's parts "
                          f"({wanted}), so it cannot load the set: rename the parts to lower-case "
                          f"-of-…gguf ({wanted} …)")


def _any_case(part: Path) -> Path | None:
    """A file beside `part` whose name differs from its only in case (blocking)."""
    try:
        return next((p for p in part.parent.iterdir() if p.name.lower() == part.name.lower()), None)
    except OSError:
        return None


def check_split(path: Path, header: GgufHeader) -> int:
    """The total size of a split model whose part 1 is `path` (its own size if not split), or
    ModelLoadError naming the part that is missing, not a part of this set, or cut short (blocking)."""
    count = int(header.get("split.count", 0) or 0)
    if count < 2:
        return path.stat().st_size
    files = set_files(path)
    if len(files) != count:
        raise ModelLoadError(f"{path.name} is part {int(header.get('split.no', 0)) + 1} of a model split in "
                             f"{count} parts, but its name does not say so: keep the names gguf-split gave "
                             f"(name-00001-of-{count:05d}.gguf …)")
    total = 0
    stem = set_stem(path)
    if path.name != files[0].name:  # llama.cpp: "invalid split file name"
        raise _misspelt(stem, path, files[0].name)
    for i, part in enumerate(files, start=1):
        if not part.is_file():
            found = _any_case(part)
            if found is not None:  # `-OF-`, `.GGUF`: llama.cpp opens the lower-case name only
                raise _misspelt(stem, found, part.name)
            raise ModelLoadError(f"{stem}: part {i} of {count} missing ({part.name}; a download or copy still "
                                 f"to come?)")
        part_header = header if i == 1 else read_header(part)
        if int(part_header.get("split.no", -1)) != i - 1 or int(part_header.get("split.count", 0) or 0) != count:
            raise ModelLoadError(f"{stem}: {part.name} is not part {i} of {count} of this model (its split keys "
                                 "say otherwise)")
        size, needed = part.stat().st_size, part_header.data_end()
        if size < needed:
            raise ModelLoadError(f"{stem}: part {i} of {count} is truncated: {size / 1e6:.1f} of the "
                                 f"{needed / 1e6:.1f} MB its header describes (an interrupted download or copy?)")
        total += size
    return total


def refuse_slices(name: str, header: GgufHeader) -> None:
    """SplitModelServedWhole if `header` is a split model's: the slice engine reads one file, and a
    peer could not fetch its layers (its id hashes part 1). Called wherever a model is taken for
    slices (--layers, --serve auto, the contributions), before anything is loaded."""
    count = int(header.get("split.count", 0) or 0)
    if count >= 2:
        raise SplitModelServedWhole(f"{name}: a split model ({count} parts) is served whole on this node only, "
                                    "not as layers (--layers, --serve auto, helping serve it for the swarm); to "
                                    "serve layers of it, merge its parts into one file (llama-gguf-split --merge)",
                                    param="model")


def not_a_model(header: GgufHeader) -> str | None:
    """What a GGUF that is not a model to chat with is, in words; None for a model."""
    kind = str(header.get("general.type", "model") or "model").lower()
    if kind == "adapter":
        return "a LoRA adapter (applied on top of its base model; not a model of its own)"
    if kind == "mmproj" or header.architecture == "clip":
        return "a vision projector (mmproj) for a multimodal model, not a model of its own"
    if kind == "imatrix":
        return "importance-matrix data for quantizing, not a model"
    if not header.tensors and int(header.get("split.count", 0) or 0) < 2:
        # (part 1 of a split set may hold none: gguf-split --no-tensor-first-split; llama.cpp reads
        # the tensors from the other parts)
        return "a vocabulary only, without weights (as llama.cpp's ggml-vocab-* test files)"
    return None
