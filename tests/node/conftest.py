"""Fixtures most API test modules here share, over the module's own `node` fixture (a module that
needs another client or model defines its own, which wins)."""

from __future__ import annotations

import pytest

from tests.support.nodes import openai_client


@pytest.fixture
def client(node):
    """The official openai client on the module's node (closed when the node stops)."""
    return openai_client(node)


@pytest.fixture
def model_id(node):
    """The id of the module's node's first model."""
    return node.models.all()[0].id
