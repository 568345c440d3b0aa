"""Run by test_remote_serve in a subprocess (a regression kills the process with SIGBUS): a peer's
GENERATE for a loaded model whose file was then cut. Prints the holder's end frame as JSON."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

from node.config import NodeConfig
from node.inference.manager import ModelManager
from node.inference.pipeline.remote_serve import RemoteGenerateServer
from node.inference.pipeline.remote_wire import Generate, Tokens
from node.inference.pipeline.transport import PipelineTransport
from node.inference.sampling import SamplingParams
from node.models.catalog import ModelCatalog
from node.net import FrameType
from tests.pipeline.swarm import split_model
from tests.pipeline.workerkit import COORD, ME, RecordingPeers
from tests.support.waiting import wait_until


async def main(base: Path) -> None:
    path = base / "copy.gguf"
    shutil.copy(split_model(base), path)
    catalog = ModelCatalog(None)
    entry = catalog.scan([(path, "cli")])[0]
    models = ModelManager(NodeConfig(data_dir=base, n_threads=1), catalog)
    served = await models.async_register(entry)
    await models.async_load(served.id)
    peers = RecordingPeers()
    server = RemoteGenerateServer(ME, models, PipelineTransport(ME, peers), None, contributing=lambda: True)
    os.truncate(path, path.stat().st_size // 3)  # `cp` of a new download over the served file
    gen = Generate("s/1", served.entry.sha256, (1, 2, 3), SamplingParams(temperature=0.0), 8, COORD)
    server.on_generate(gen.to_header(), gen.payload(), COORD)

    def ends():
        return [t for t in (Tokens.from_frame(f.header, f.payload) for f in peers.sent if f.type == FrameType.TOKENS)
                if t.end]

    await wait_until(ends, 60, what="the generation's end")
    end = ends()[0]
    print(json.dumps({"end": end.end, "error_code": end.error_code, "error": end.error}))
    server.close()
    await models.async_close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
