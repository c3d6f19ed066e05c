"""Full-text indexes of the SQLite store, one pair per tenant.

bm25 ranks with statistics of the whole FTS5 table it runs on (how many rows hold a word, the average length). In
one table shared by every tenant, the scores and the order of a tenant's hits would move with other tenants' words:
a side channel across tenants. So each tenant gets its own two tables, created on its first memory:

- `fts_<h>` (topic, content, owner_tag): keyword search ranks a row by its own words;
- `ctx_<h>` (topic, content, owner_tag, context): the hybrid search ranks its keyword candidates with the
  conversation around them (stores/sqlite_schema.py, m003).

`fts_tenants` lists each tenant's pair, and how many full merges each pair had since it was last rebuilt.

Both are external-content tables over `memories`, holding each text as keywords.index_text makes it (Chinese,
Japanese and Korean as overlapping character pairs; other text as it is); the store keeps them in step on every
insert, delete and context rewrite, inside the same transaction. Erasing a tenant drops its tables. Users of one
tenant still share statistics (the tenant is the unit of isolation for ranking; the owner filter is in every query).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Iterable, Sequence

from ..keywords import index_text

TOKENIZER = "porter unicode61 remove_diacritics 2"

Query = Callable[..., sqlite3.Cursor]
Many = Callable[[str, Iterable[Sequence]], None]

INDEX_TEXT = "memshelf_index_text"
"""keywords.index_text as an SQL function of every connection (register_functions), for filling the tables from
`memories` in one statement."""


def register_functions(conn: sqlite3.Connection) -> None:
    conn.create_function(INDEX_TEXT, 1, index_text, deterministic=True)


def _indexed(*texts: str) -> tuple[str, ...]:
    return tuple(index_text(text) for text in texts)


def table_names(tenant: str) -> tuple[str, str]:
    suffix = hashlib.sha256(tenant.encode()).hexdigest()[:24]
    return f"fts_{suffix}", f"ctx_{suffix}"


REBUILD_EVERY = 200
"""A tenant's tables are rebuilt from its rows, instead of merged, once in this many scrubs. The full merge
('optimize') is what drops a deleted row's words from the index, but on older SQLite (3.40, the one Python ships
here) each one adds two levels to the index, and at 2,000 levels FTS5 reads its own index as "database disk image
is malformed". A rebuild starts again from one level, so no SQLite version can get there."""


class TenantIndexes:
    """Creates, fills, updates, scrubs and drops the per-tenant full-text tables through the store's query function."""

    def __init__(self, query: Query, many: Many) -> None:
        self._q = query
        self._many = many

    def names(self, tenant: str) -> tuple[str, str] | None:
        row = self._q("SELECT words, context FROM fts_tenants WHERE tenant = ?", (tenant,)).fetchone()
        return None if row is None else (row[0], row[1])

    def _create(self, tenant: str) -> tuple[str, str]:
        """Empty tables for a tenant's first memory."""
        words, context = table_names(tenant)
        self._q(f"CREATE VIRTUAL TABLE IF NOT EXISTS {words} USING fts5(topic, content, owner_tag,"
                f" content='memories', content_rowid='pk', tokenize='{TOKENIZER}')")
        self._q(f"CREATE VIRTUAL TABLE IF NOT EXISTS {context} USING fts5(topic, content, owner_tag, context,"
                f" content='memories', content_rowid='pk', tokenize='{TOKENIZER}')")
        self._q("INSERT INTO fts_tenants (tenant, words, context) VALUES (?, ?, ?)", (tenant, words, context))
        return words, context

    def _fill(self, tenant: str, words: str, context: str) -> None:
        """Index every row the tenant has (the tables must hold none of them yet)."""
        self._q(f"INSERT INTO {words} (rowid, topic, content, owner_tag)"
                f" SELECT pk, {INDEX_TEXT}(topic), {INDEX_TEXT}(content), owner_tag FROM memories WHERE tenant = ?",
                (tenant,))
        self._q(f"INSERT INTO {context} (rowid, topic, content, owner_tag, context)"
                f" SELECT pk, {INDEX_TEXT}(topic), {INDEX_TEXT}(content), owner_tag, {INDEX_TEXT}(context)"
                " FROM memories WHERE tenant = ?", (tenant,))

    def index_existing(self, tenant: str) -> None:
        """Tables for a tenant whose rows were stored before tenants had their own (m004)."""
        self._fill(tenant, *self._create(tenant))

    def rebuild(self, tenant: str) -> None:
        """Index the tenant's rows afresh, with no deleted entry and no level left over. FTS5's own 'rebuild' would
        index the whole content table, which holds every tenant's rows."""
        names = self.names(tenant)
        if names is None:
            return
        for name in names:
            self._q(f"INSERT INTO {name} ({name}) VALUES ('delete-all')")
        self._fill(tenant, *names)
        self._q("UPDATE fts_tenants SET merges = 0 WHERE tenant = ?", (tenant,))

    def add(self, tenant: str, pk: int, topic: str, content: str, tag: str, context: str) -> None:
        self.add_many(tenant, [(pk, topic, content, tag, context)])

    def add_many(self, tenant: str, rows: Sequence[tuple[int, str, str, str, str]]) -> None:
        """Index rows (pk, topic, content, owner_tag, context) of one tenant.

        A batch is indexed after its memories rows are written, not row by row between them: any statement that
        opens a savepoint (one that fires a trigger does) makes FTS5 write out the entries it holds in memory, so
        indexing between the rows wrote one small segment per row (BENCHMARKS.md, "Ingest into SQLite")."""
        if not rows:
            return
        words, ctx = self.names(tenant) or self._create(tenant)
        entries = [(pk, *_indexed(topic, content, context), tag) for pk, topic, content, tag, context in rows]
        self._many(f"INSERT INTO {words} (rowid, topic, content, owner_tag) VALUES (?, ?, ?, ?)",
                   [(pk, topic, content, tag) for pk, topic, content, _context, tag in entries])
        self._many(f"INSERT INTO {ctx} (rowid, topic, content, context, owner_tag) VALUES (?, ?, ?, ?, ?)", entries)

    def remove(self, rows: Iterable[Sequence]) -> set[str]:
        """Take rows (tenant, pk, topic, content, owner_tag, context) out of their tenant's tables; returns the
        tenants touched."""
        touched: set[str] = set()
        for tenant, pk, topic, content, tag, context in rows:
            names = self.names(tenant)
            if names is None:
                continue
            words, ctx = names
            topic, content, context = _indexed(topic, content, context)
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
        topic, content, old, new = _indexed(topic, content, old, new)
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

    def scrub(self, tenants: Iterable[str]) -> None:
        """Drop deleted entries from the touched tenants' indexes for good: a full merge of each index, or, every
        REBUILD_EVERY times, a rebuild from the tenant's rows (see REBUILD_EVERY)."""
        for tenant in tenants:
            row = self._q("SELECT words, context, merges FROM fts_tenants WHERE tenant = ?", (tenant,)).fetchone()
            if row is None:
                continue
            if row[2] + 1 >= REBUILD_EVERY:
                self.rebuild(tenant)
                continue
            for name in row[:2]:
                self._q(f"INSERT INTO {name} ({name}) VALUES ('optimize')")
            self._q("UPDATE fts_tenants SET merges = merges + 1 WHERE tenant = ?", (tenant,))
