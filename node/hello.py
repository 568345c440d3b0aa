"""What this node says in its HELLO and reads of its peers' (Node's part): the adverts of its models
and slices, the whole files it hands out, its hardware, announced again when they change; and which
connected peers hold a model's layers or whole file (where partial fetches ask)."""

from __future__ import annotations

import asyncio
from typing import Any

from node import const
from node.inference import sampling
from node.inference.adverts import hardware_advert, model_adverts
from node.inference.pipeline.coverage import paused_holders, swarm_coverage
from node.inference.pipeline.wholeparts import held_files


class HelloParts:
    """Mixed into Node: needs its `config`, `catalog`, `models`, `slice_host`, `peers`, `machine`,
    `node_id`, `_stopping`, `_contributing()` and the announce state set in its __init__."""

    config: Any
    catalog: Any
    models: Any
    slice_host: Any
    peers: Any
    machine: Any
    _stopping: bool
    _held: tuple[int, list[str], frozenset[str]]
    _advertised_rates: dict[str, float]
    _announce_task: asyncio.Task | None
    _announce_again: bool

    @property
    def node_id(self) -> str:  # Node's
        raise NotImplementedError

    def _contributing(self) -> bool:  # Node's
        raise NotImplementedError

    def _slice_holders(self, sha256: str) -> list[tuple[str, int, int]]:
        """The connected peers' advertised slices of a model: (node id, start, end)."""
        cov = swarm_coverage(self.node_id, [], self.peers.peers() if self.peers else []).get(sha256)
        return [(s.node_id, s.start, s.end) for s in cov.spans if s.node_id != self.node_id] if cov else []

    def _whole_holders(self, sha256: str) -> list[str]:
        """The connected peers holding a model's whole file: those running it whole, not paused (they
        refuse), then those listing the file in their HELLO's `files` (held on disk, loaded or not;
        a paused node lists none; an older node sends no `files`). Node ids."""
        peers = self.peers.peers() if self.peers else []
        cov = swarm_coverage(self.node_id, [], peers).get(sha256)
        paused = paused_holders(peers, sha256)
        loaded = [n for n in cov.whole if n not in paused] if cov else []
        on_disk = [p.node_id for p in peers if p.state == "connected" and sha256 in getattr(p, "files", ())]
        return [n for n in dict.fromkeys(loaded + on_disk) if n != self.node_id]

    def _shares_whole(self, sha256: str) -> bool:
        """Whether this node advertises a model's whole file (its PartServer hands out those): run
        whole (loaded), or one its HELLO's `files` lists while it contributes (downloaded from a public
        origin); paused, PartServer then answers `not_contributing` (not `model_not_found`)."""
        return sha256 in self._held_files()[1] or \
            any(m.entry.sha256 == sha256 and m.state == "loaded" for m in self.models.whole_models())

    async def _async_announce(self) -> None:
        if self.peers is not None:
            await self.peers.async_announce()

    def advertised_models(self) -> list[dict[str, Any]]:
        """What this node advertises to its peers now (the GUI's layer map shows it beside theirs)."""
        return self._hello_models()

    def _hello_sampling(self) -> frozenset[str] | None:
        """The sampling features this version decodes (HELLO's `sampling`): a coordinator sends no
        request using one a peer lacks (a version before 2026-12-07 lists none: the old set)."""
        return sampling.FEATURES

    def _hello_models(self) -> list[dict[str, Any]]:
        return model_adverts(self.catalog, self.models, self.slice_host, contribute=self.config.contribute)

    def _hello_files(self) -> list[str]:
        """The whole files from a public origin this node hands out layers of, loaded or not (none
        while paused or stopping; a file the user gave is handed out only while loaded: held_files)."""
        return self._held_files()[0] if self._contributing() else []

    def _held_files(self) -> tuple[list[str], frozenset[str]]:
        """held_files(catalog), computed again only when the catalog changed since (its generation)."""
        generation = self.catalog.generation  # read first: a change during the pass is seen next time
        if self._held[0] != generation:
            held = held_files(self.catalog)
            self._held = (generation, held, frozenset(held))
        return self._held[1], self._held[2]

    def _on_model_event(self, event: str, served: Any) -> None:
        """A whole model's decode rate, first measured or clearly changed, goes to peers (HELLO):
        their planners weigh this node by it until they have measured it themselves."""
        if event != "changed" or not served.whole or served.busy or served.engine is None or self.peers is None:
            return
        rate = served.engine.ms_per_token
        last = self._advertised_rates.get(served.id)
        if rate is None or (last is not None and 1 / const.ADVERT_RATE_CHANGE <= rate / last <= const.ADVERT_RATE_CHANGE):
            return
        self._advertised_rates[served.id] = rate
        self._announce_soon()

    def _announce_soon(self) -> None:
        """HELLO again (a measured rate or the slices changed); one asked for while an announcement is on
        its way is sent after it (that one may have read the adverts before the change). None once the node
        stops (2026-12-07, review r41: a slice's check cancelled by the stop started one, left running)."""
        if self.peers is None or self._stopping:
            return
        self._announce_again = True
        if self._announce_task is None or self._announce_task.done():
            self._announce_task = asyncio.create_task(self._async_announce_soon(), name="announce-rate")

    async def _async_announce_soon(self) -> None:
        while self._announce_again and self.peers is not None:
            self._announce_again = False
            await self.peers.async_announce()

    def _hello_hardware(self) -> dict[str, Any]:
        return hardware_advert(self.machine, self.slice_host)
