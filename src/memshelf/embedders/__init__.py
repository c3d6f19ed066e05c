"""Embedders: the protocol, the registry, and the built-in providers.

Importing this package registers "local", "ollama" and "openai" exactly the way a user's plugin registers its own
provider: each provider module calls `register_embedder` when it is imported. Nothing heavy is imported here; the
local model's torch stack loads on its first use.
"""

from __future__ import annotations

from .base import (Embedder, default_embedder_spec, embedding_deadline, embedding_time_left, register_embedder,
                   registered_providers, resolve_embedder)
from .local import LocalEmbedder
from .ollama import OllamaEmbedder
from .openai import OpenAIEmbedder

__all__ = [
    "Embedder",
    "LocalEmbedder",
    "OllamaEmbedder",
    "OpenAIEmbedder",
    "default_embedder_spec",
    "embedding_deadline",
    "embedding_time_left",
    "register_embedder",
    "registered_providers",
    "resolve_embedder",
]
