"""Embedders: the protocol, the registry, and the built-in providers.

"local", "static", "ollama" and "openai" are found exactly the way a user's plugin is: through entry points of the
`memshelf.embedders` group declared in memshelf's pyproject.toml, each naming the `provider` of its module.
Nothing heavy is imported here; the local model's torch stack loads on its first use.
"""

from __future__ import annotations

from .base import (Embedder, EmbedderProvider, default_embedder_spec, embedder_availability, embedder_provider,
                   embedding_deadline, embedding_time_left, register_embedder, registered_providers, resolve_embedder)
from .local import LocalEmbedder
from .ollama import OllamaEmbedder
from .openai import OpenAIEmbedder

__all__ = [
    "Embedder",
    "EmbedderProvider",
    "LocalEmbedder",
    "OllamaEmbedder",
    "OpenAIEmbedder",
    "default_embedder_spec",
    "embedder_availability",
    "embedder_provider",
    "embedding_deadline",
    "embedding_time_left",
    "register_embedder",
    "registered_providers",
    "resolve_embedder",
]
