"""What this node's HELLO tells its peers: the models it serves (its slices with their layer
ranges, the models it holds whole with their decode rate) and its hardware. Peers' planners and
`--serve auto` choosers read these (pipeline/holders.py, pipeline/coverage.py)."""

from __future__ import annotations

from typing import Any

from node.inference.manager import ModelManager
from node.inference.pipeline.host import SliceHost
from node.models.catalog import ModelCatalog
from node.models.download import display_url
from node.sysinfo import MachineInfo


def model_adverts(catalog: ModelCatalog, models: ModelManager, slice_host: SliceHost, *,
                  contribute: bool) -> list[dict[str, Any]]:
    """Our slices (with layer ranges) and the models we hold whole (which peers may run here by
    remote generate), each with what a node without the file needs to fetch and check its header.
    Paused (`contribute` false): no layers offered, whole models marked paused. A model split in parts
    (file_kinds.py) is not advertised: its id hashes part 1 only, and no peer could fetch its layers."""
    whole = []
    for m in models.whole_models():
        if m.state != "loaded" or m.entry.split_count > 1:  # a split model is served here only (catalog.py)
            continue
        if m.entry.changed:  # its file is no longer the bytes its sha256 names (the watch saw it overwritten)
            continue
        advert: dict[str, Any] = {"sha256": m.entry.sha256, "name": m.entry.name, "n_layers": m.entry.n_layers,
                                  "whole": True}
        rate = m.engine.ms_per_token if m.engine is not None else None
        if rate is not None:
            advert["ms_per_token"] = round(rate, 3)  # its own recent decode rate (remote generate)
        if not contribute:
            advert["paused"] = True  # paused: it refuses GENERATE, so no coordinator plans on it
        whole.append(advert)
    slices = slice_host.adverts(loading=True) if contribute else []  # paused: offer no layers
    out = []
    for advert in slices + whole:
        entry = catalog.by_sha(advert["sha256"])
        if entry is not None and entry.has_file and entry.header_sha256:
            advert = {**advert, "architecture": entry.architecture, "header_sha256": entry.header_sha256,
                      "header_bytes": entry.header_bytes, "size_bytes": entry.size_bytes}
            if entry.origin_url:
                advert["origin_url"] = display_url(entry.origin_url)  # never a signed URL's query
        out.append(advert)
    return out


def hardware_advert(machine: MachineInfo | None, slice_host: SliceHost) -> dict[str, Any]:
    """The device, cores, RAM, memory bandwidth and our best measured ms per layer (a GPU's total
    memory, `vram_mb`: its free memory is not read until a load, 2026-12-07; it was `vram_free_mb`)."""
    out: dict[str, Any] = {"device": "cpu"}
    if machine is not None:
        out.update(cores=machine.physical_cores, ram_mb=machine.ram_total_mb, bandwidth_gbps=machine.mem_bandwidth_gbps)
        if machine.gpus:
            out.update(device="cuda", gpu=machine.gpus[0].name, vram_mb=machine.gpus[0].total_mb)
    rates = [s.ms_per_layer for s in slice_host.slices.values() if s.ms_per_layer is not None]
    if rates:
        out["ms_per_layer"] = round(min(rates), 3)
    return out
