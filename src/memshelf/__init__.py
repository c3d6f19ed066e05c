"""memshelf: durable, owned, searchable memory for AI assistants."""

from .client import AsyncClient, Client
from .embedders.base import Embedder, register_embedder
from .errors import (ConfigError, Conflict, DimensionMismatch, EmbedderError, EmbedderUnavailable, ExtractorError,
                     ExtractorUnavailable, InvalidInput, MemshelfError, NotFound, StoreError, StoreUnavailable,
                     UnknownSource)
from .keywords import keywords
from .learning.base import Plan, Proposal, Usage
from .model import Fact, FactChange, Hit, Memory, Message, Owner, SearchResult, UserSummary
from .shelf import Shelf
from .stores.base import ApiKey, Erased, Evidence, Store, register_store

__all__ = [
    "ApiKey", "AsyncClient", "Client", "ConfigError", "Conflict", "DimensionMismatch", "Embedder", "EmbedderError",
    "EmbedderUnavailable", "Erased", "Evidence", "ExtractorError", "ExtractorUnavailable", "Fact", "FactChange", "Hit",
    "InvalidInput", "Memory", "MemshelfError", "Message", "NotFound", "Owner", "Plan", "Proposal", "SearchResult",
    "Shelf", "Store", "StoreError", "StoreUnavailable", "UnknownSource", "Usage", "UserSummary", "keywords",
    "register_embedder", "register_store",
]
__version__ = "0.1.0"
