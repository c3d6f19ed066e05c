"""What a storage backend implementer needs, in one import: the Store contract, the records it takes and returns,
the rules every backend applies the same way (dedup, conversation context), the registry, and the errors a store
raises. Run the contract suite against a new backend with memshelf.testing.

The built-in backends (memshelf.stores.sqlite, memshelf.stores.postgres) are imported on first use, not here, so
the PostgreSQL driver loads only for someone who opens a postgresql:// URL.
"""

from __future__ import annotations

from ..errors import DimensionMismatch, InvalidInput, StoreError, StoreUnavailable
from .._ids import new_id
from ..model import Fact, FactChange, Memory, Message, NewMemory, Owner
from .base import (CONTEXT_TURNS, ApiKey, Erased, Observation, Pending, Position, Scored, Store, StoreFactory,
                   digest, observe_again, open_store, register_store)

__all__ = [
    "CONTEXT_TURNS", "ApiKey", "DimensionMismatch", "Erased", "Fact", "FactChange", "InvalidInput", "Memory",
    "Message", "NewMemory", "Observation", "Owner", "Pending", "Position", "Scored", "Store", "StoreError",
    "StoreFactory", "StoreUnavailable", "digest", "new_id", "observe_again", "open_store", "register_store",
]
