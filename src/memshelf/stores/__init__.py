"""What a storage backend implementer needs, in one import: the Store contract, the records it takes and returns,
the rules every backend applies the same way (dedup, conversation context), the registry, and the errors a store
raises. Run the contract suite against a new backend with memshelf.testing.

The built-in backends (memshelf.stores.sqlite, memshelf.stores.postgres) are imported on first use, not here, so
the PostgreSQL driver loads only for someone who opens a postgresql:// URL.
"""

from __future__ import annotations

from ..errors import DimensionMismatch, InvalidInput, StoreError, StoreUnavailable
from .._ids import new_id
from ..model import Fact, FactChange, Memory, Message, NewMemory, Owner, UserSummary
from .base import (CONTEXT_TURNS, CURRENT, EVERY, AdminStore, ApiKey, Erased, Evidence, Listing, Mark, MemoryStore,
                   Observation, Pending, Position, RecordStore, Scored, Store, View, digest, observe_again)
from .registry import StoreFactory, StoreProvider, open_store, register_store
from .sql_records import (MEMORY_COLUMNS, MEMORY_WIDTH, Rows, SQLRecords, Statements, earlier_turns, erased_from,
                          later_turns, memory_from_row, view_condition)
from .tables import OWNER_TABLES, OwnerTable

__all__ = [
    "CONTEXT_TURNS", "CURRENT", "EVERY", "MEMORY_COLUMNS", "MEMORY_WIDTH", "OWNER_TABLES", "AdminStore", "ApiKey",
    "DimensionMismatch", "Erased", "Evidence", "Fact", "FactChange", "InvalidInput", "Listing", "Mark", "Memory",
    "MemoryStore", "Message", "NewMemory", "Observation", "Owner", "OwnerTable", "Pending", "Position", "RecordStore",
    "Rows", "SQLRecords", "Scored", "Statements", "Store", "StoreError", "StoreFactory", "StoreProvider",
    "StoreUnavailable", "UserSummary", "View", "digest", "earlier_turns", "erased_from", "later_turns",
    "memory_from_row", "new_id", "observe_again", "open_store", "register_store", "view_condition",
]
