"""Fixtures most API test modules here share, over the module's own `node` fixture (a module that
needs another client or model defines its own, which wins), and the download tests' origin: `server`
serving `other_bytes` (a model file other than a node's own)."""

from __future__ import annotations

import pytest
import pytest_asyncio

from tests.support.fileserver import OTHER, serving_file
from tests.support.nodes import openai_client, tiny_model


@pytest.fixture
def client(node):
    """The official openai client on the module's node (closed when the node stops)."""
    return openai_client(node)


@pytest.fixture
def model_id(node):
    """The id of the module's node's first model."""
    return node.models.all()[0].id


@pytest.fixture
def other_bytes(tmp_path_factory):
    """A GGUF other than a node's own model (`OTHER`), as bytes: what the download tests fetch."""
    return tiny_model(tmp_path_factory.mktemp("other"), OTHER, "other.gguf").read_bytes()


@pytest_asyncio.fixture
async def server(other_bytes):
    """A local origin serving `other_bytes` at its `url` (tests/support/fileserver.py), on the test's loop."""
    async with serving_file(other_bytes) as srv:
        yield srv
