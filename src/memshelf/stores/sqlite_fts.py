"""Full-text indexes of the SQLite store, one pair per tenant.

bm25 ranks with statistics of the whole FTS5 table it runs on (how many rows hold a word, the average length). In
one table shared by every tenant, the scores and the order of a tenant's hits would move with other tenants' words:
a side channel across tenants. So each tenant gets its own two tables, created on its first memory:

- `fts_<h>` (topic, content, owner_tag): keyword search ranks a row by its own words;
- `ctx_<h>` (topic, content, owner_tag, context): the hybrid search ranks its keyword candidates with the
  conversation around them (stores/sqlite_schema.py, m003).

Both are external-content tables over `memories`; the store keeps them in step on every insert, delete and
context rewrite, inside the same transaction. Erasing a tenant drops its tables. Users of one tenant still share
statistics (the tenant is the unit of isolation for ranking; the owner filter is in every query).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Iterable, Sequence

TOKENIZER = "porter unicode61 remove_diacritics 2"

Query = Callable[..., sqlite3.Cursor]


def table_names(tenant: str) -> tuple[str, str]:
    suffix = hashlib.sha256(tenant.encode()).hexdigest()[:24]
    return f"fts_{suffix}", f"ctx_{suffix}"


class TenantIndexes:
    """Creates, fills, updates and drops the per-tenant full-text tables through the store's query function."""

    def __init__(self, query: Query) -> None:
        self._q = query

    def names(self, tenant: str, *, create: bool = False) -> tuple[str, str] | None:
        row = self._q("SELECT words, context FROM fts_tenants WHERE tenant = ?", (tenant,)).fetchone()
        if row is not None:
            return row[0], row[1]
        if not create:
            return None
        words, context = table_names(tenant)
        self._q(f"CREATE VIRTUAL TABLE IF NOT EXISTS {words} USING fts5(topic, content, owner_tag,"
                f" content='memories', content_rowid='pk', tokenize='{TOKENIZER}')")
        self._q(f"CREATE VIRTUAL TABLE IF NOT EXISTS {context} USING fts5(topic, content, owner_tag, context,"
                f" content='memories', content_rowid='pk', tokenize='{TOKENIZER}')")
        self._q("INSERT INTO fts_tenants VALUES (?, ?, ?)", (tenant, words, context))
        # Rows stored before this tenant had tables (a database from before m004) are indexed now.
        self._q(f"INSERT INTO {words} (rowid, topic, content, owner_tag)"
                " SELECT pk, topic, content, owner_tag FROM memories WHERE tenant = ?", (tenant,))
        self._q(f"INSERT INTO {context} (rowid, topic, content, owner_tag, context)"
                " SELECT pk, topic, content, owner_tag, context FROM memories WHERE tenant = ?", (tenant,))
        return words, context

    def add(self, tenant: str, pk: int, topic: str, content: str, tag: str, context: str) -> None:
        names = self.names(tenant, create=True)
        assert names is not None
        words, ctx = names
        self._q(f"INSERT INTO {words} (rowid, topic, content, owner_tag) VALUES (?, ?, ?, ?)",
                (pk, topic, content, tag))
        self._q(f"INSERT INTO {ctx} (rowid, topic, content, owner_tag, context) VALUES (?, ?, ?, ?, ?)",
                (pk, topic, content, tag, context))

    def remove(self, rows: Iterable[Sequence]) -> set[str]:
        """Take rows (tenant, pk, topic, content, owner_tag, context) out of their tenant's tables; returns the
        tenants touched."""
        touched: set[str] = set()
        for tenant, pk, topic, content, tag, context in rows:
            names = self.names(tenant)
            if names is None:
                continue
            words, ctx = names
            self._q(f"INSERT INTO {words} ({words}, rowid, topic, content, owner_tag) VALUES ('delete', ?, ?, ?, ?)",
                    (pk, topic, content, tag))
            self._q(f"INSERT INTO {ctx} ({ctx}, rowid, topic, content, owner_tag, context)"
                    " VALUES ('delete', ?, ?, ?, ?, ?)", (pk, topic, content, tag, context))
            touched.add(tenant)
        return touched

    def replace_context(self, tenant: str, pk: int, topic: str, content: str, tag: str, old: str, new: str) -> None:
        names = self.names(tenant)
        if names is None:
            return
        ctx = names[1]
        self._q(f"INSERT INTO {ctx} ({ctx}, rowid, topic, content, owner_tag, context)"
                " VALUES ('delete', ?, ?, ?, ?, ?)", (pk, topic, content, tag, old))
        self._q(f"INSERT INTO {ctx} (rowid, topic, content, owner_tag, context) VALUES (?, ?, ?, ?, ?)",
                (pk, topic, content, tag, new))

    def drop(self, tenant: str) -> None:
        names = self.names(tenant)
        if names is None:
            return
        for name in names:
            self._q(f"DROP TABLE IF EXISTS {name}")
        self._q("DELETE FROM fts_tenants WHERE tenant = ?", (tenant,))

    def optimize(self, tenants: Iterable[str]) -> None:
        """Merge each touched tenant's index segments, which drops deleted entries for good."""
        for tenant in tenants:
            names = self.names(tenant)
            for name in names or ():
                self._q(f"INSERT INTO {name} ({name}) VALUES ('optimize')")
