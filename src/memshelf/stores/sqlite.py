"""The embedded default: one SQLite file, WAL, FTS5 for keywords, numpy for exact vector search."""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import logging
import threading
import time
import unicodedata
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, UTC
from pathlib import Path
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar, overload

import numpy as np

from ..errors import DimensionMismatch, InvalidInput, MemshelfError, StoreError, StoreUnavailable
from ..keywords import is_prefix
from ..model import EARLIEST, MAX_CONFIDENCE, Memory, NewMemory, Owner
from .._vectors import CACHE_ENV, VectorCache, VectorMatrix, cache_limit_bytes, normalize, top_k
from .base import BACKFILL_ADVICE, CONTEXT_TURNS, CURRENT, Pending, Scored, View, digest, observe_again
from .sql_records import (MEMORY_COLUMNS, MEMORY_CONFIDENCE, MEMORY_WIDTH, SQLRecords, Statements, earlier_turns,
                          later_turns, memory_from_row, short_of_the_answer, view_condition)
from ._sqlite_fts import READS_SECURE, TenantIndexes, fold, register_functions
from ._sqlite_lib import sqlite3 as sqlite3  # public: code reading a store's file in its process must use it
from ._sqlite_schema import CHANGES_KEPT, CJK_INDEX, FOLDED_LETTERS, MIGRATIONS, WHITESPACE_DIGESTS, WORD_MARKS
from . import _sqlite_vector_files

log = logging.getLogger("memshelf")

BUSY_TIMEOUT_MS = 30_000
SCRUB_WAIT_MS = 50
"""How long an erasure's WAL checkpoint waits for readers, holding other writers meanwhile: readers of this
process finish in well under that; a long one (a backup, a shell) leaves the scrub pending instead."""
SCRUB_RETRY_S = 1.0
"""While a scrub is pending, a write tries to finish it at most this often (without waiting for readers)."""
CONTEXT_WEIGHT = 1.0
"""bm25 weight of the context column. The query requires, and so counts a second time, a match in the row's own
topic or content, which makes a memory's own words count about twice its neighbours' (BENCHMARKS.md, LoCoMo)."""
MMAP_BYTES = 1 << 30
_TS = "%Y-%m-%dT%H:%M:%S.%fZ"  # fixed width, so text order is time order


@overload
def ts(value: datetime) -> str: ...
@overload
def ts(value: None) -> None: ...
def ts(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).strftime(_TS)


@overload
def parse_ts(value: str) -> datetime: ...
@overload
def parse_ts(value: None) -> None: ...
def parse_ts(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)  # reads the "...Z" form (Python >= 3.11)


def _memory(row: Sequence) -> Memory:
    return memory_from_row(row, parse_ts)


_T = TypeVar("_T")

_BAD_DATA = {sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_RANGE}
_NO_ACCESS = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH}


def translate(exc: sqlite3.Error, path: str) -> MemshelfError:
    """A SQLite error as memshelf's: busy or locked can succeed when retried, bad data is the caller's to fix, and
    anything else says what SQLite said about the file."""
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF  # the primary code under an extended one
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreUnavailable(f"the SQLite file {path} is busy: another connection holds its write lock ({exc}); "
                                "nothing was written, retry in a moment")
    if code in _BAD_DATA or isinstance(exc, sqlite3.DataError):
        return InvalidInput(f"SQLite refused a value ({exc}): a field is missing, not a number, of the wrong type "
                            "or too large; nothing was written, fix the value and retry")
    if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        return StoreError(f"the SQLite file {path} is damaged or not a database ({exc}): restore it from a backup "
                          "or recover it with `sqlite3 FILE .recover`")
    if code == sqlite3.SQLITE_FULL:
        return StoreError(f"the disk holding {path} is full ({exc}): nothing was written; free space and retry")
    if code in _NO_ACCESS:
        return StoreError(f"cannot open or write the SQLite file {path} ({exc}): check the path and the "
                          "permissions of the file and its folder")
    if "invalid fts5 file format" in str(exc):
        return StoreError(f"another process, on a newer SQLite, deleted from {path}'s full-text index in place, "
                          f"which this SQLite ({sqlite3.sqlite_version}) cannot read ({exc}): close and reopen the "
                          "store, which rebuilds that index (README, \"Erasure\"), or run every process on SQLite "
                          "3.42 or newer (pip install 'memshelf[sqlite]')")
    return StoreError(f"SQLite failed on {path} ({exc}): not a lock, so retrying will not help; "
                      "report it with this message if it persists")


def owner_tag(owner: Owner) -> str:
    """The owner's token in the full-text index: letters and digits only, so no tokenizer splits it."""
    return "own" + hashlib.sha256(f"{owner.tenant}\x00{owner.user}".encode()).hexdigest()[:24]


def fts_query(terms: Sequence[str], owner: Owner | None, with_context: bool,
              whole: bool | Sequence[str] = False, words_table: bool = False, also: Sequence[str] = ()) -> str:
    """Any of the terms (each quoted, a prefix where keywords.is_prefix says so) in the row's own topic or content;
    with `owner`, also the owner's index token; `with_context` (for memories_context_fts) also ranks by the
    conversation context. `whole`: every term (True) or these terms match their own word only, never as a prefix.
    `also`: a row must match one of these terms too (any of `terms` AND any of `also`).
    `words_table`: the query runs on a tenant's words table (topic, content and the owner's token), where the
    column filter is left out unless a term could match an owner's token: FTS5 reads every match's positions to
    apply one, which was a third of a common word's query.

    Terms are quoted FTS5 strings: user text is never FTS5 syntax.
    """
    exact = set(terms) | set(also) if whole is True else set(whole or ())

    def any_of(these: Sequence[str]) -> str:  # each term's letters folded as the index's are (fold)
        return " OR ".join('"' + fold(term).replace('"', '""') + '"' + "*" * (is_prefix(term) and term not in exact)
                           for term in these)

    any_term = f"({any_of(terms)}) AND ({any_of(also)})" if also else any_of(terms)
    if words_table and not with_context and not any(_may_match_tag(term) for term in (*terms, *also)):
        query = f"({any_term})"
    else:
        query = f"{{topic content}} : ({any_term})"  # only rows whose own words match are returned
    if with_context:
        query = f"({query}) AND ({{topic content context}} : ({any_term}))"
    return query if owner is None else f'owner_tag : "{owner_tag(owner)}" AND ({query})'


def _may_match_tag(term: str) -> bool:
    """Whether the term could match an owner's token ("own" and hex digits, owner_tag): the tokenizer folds case and
    diacritics and the porter stemmer only trims a word's end, so a term must start with "own" to reach one, once
    folded as the query folds it (fold: "øwn" and "ｏｗｎ" are "own" too)."""
    folded = "".join(c for c in unicodedata.normalize("NFKD", fold(term)) if not unicodedata.combining(c))
    return folded.casefold().startswith("own")


SPLIT_WALK = 2_000
"""A keyword query whose rarer terms match rows older than its common terms' newest matches ranks those rows in
statements of their own when one statement would walk about this many of the common terms' older matches: each
statement counts every common term's matches again (bm25's document frequencies), which costs less than walking
their list only when it is long (BENCHMARKS.md, "Keyword search: old matches of a rarer word")."""

OWNER_TOKEN_SHARE = 0.25
"""Below this share of the file's memories, a keyword query starts from the owner's index token. Above it the
token only costs time: bm25 walks its whole doclist, which is most of the file."""


RANKED = 500
"""A keyword query with a term that matches more rows than this (or than its limit) ranks only some of its matches
(SQLiteStore._ranked_only): the common term's NEWEST_RANKED newest, and every match of its rarer terms."""

NEWEST_RANKED = 100
"""How many of a common term's newest matches a keyword query ranks (or its limit, if more)."""
WIDER = 8
"""When a common term's newest matches cannot be the answer, a keyword query ranks this many times as many of them
where that may be enough: when too few were current, or when the statements among them, as many times over, would
be enough. If that falls short, it ranks every match when too few were current, and otherwise the matches more
confident than its last hit (keyword_search)."""

_CREATED = MEMORY_COLUMNS.split(", ").index("m.created_at")
"""Where a row selected with MEMORY_COLUMNS holds when the memory was stored."""


REFRESH_LOCKS = 16
"""Refreshes of one owner's matrix are serialized (appends write into shared spare room); different owners mostly
take different locks, so reading a big owner's vectors from the file does not hold up everyone else."""


RESAVE_GROWTH = 1.25
"""An owner's vector file is written again when its matrix has grown by this factor since the file was written."""


_UNTIL = f"CASE WHEN m.superseded_at IS NULL THEN m.expires_at ELSE '{ts(EARLIEST)}' END"
"""When a memory (alias m) leaves current searches (the cached matrix's expiry of a row): its expiry, and a
superseded memory has left them, whenever it was superseded. Its supersession time was taken instead, which a clock
ahead of this one (another process's, or an import's within MAX_CLOCK_SKEW) put in the future: the row kept a place
in the matrix's top k that the rows read back then dropped, and the search answered fewer hits than it had."""


CHANGED_VECTOR, DELETED = 1, 2
"""owner_changes.kind of a re-embedding and of a deletion (0: confidence, expiry or supersession)."""


_NEW_ROW = ("pk, id, tenant, user_id, topic, content, digest, owner_tag, source, confidence, created_at, last_seen,"
            " observations, expires_at, embedding, embed_model, context, superseded_at, superseded_by, confirmed_at,"
            " confirmed_from")
"""The columns a new row is written with (SQLiteStore._insert_rows), in the order its values are given."""
_NEW_CONFIDENCE = _NEW_ROW.split(", ").index("confidence")


PATCH_SHARE = 0.25
"""A cached matrix catches up with changes (SQLiteStore._caught_up) while the rows it would re-read, and the rows it
holds for deleted memories, are each at most this share of it; beyond that reading every row again is as quick and
leaves no dead rows to scan."""


CHECKPOINT_PAUSE_S = 0.2
"""The background checkpointer runs at most this often: it copies what the commits since wrote in one go."""


class _Checkpointer:
    """Copies the WAL into the database file on a thread of its own (a PASSIVE checkpoint, which never waits for
    readers or writers), woken by commits. SQLite's own, run by the commit that fills the WAL past 1,000 pages, made
    that writer wait for the copy and two fsyncs: about a fifth of a bulk load (BENCHMARKS.md, "Ingest into
    SQLite"). `lock` is held while it copies, and erasure's own checkpoint takes it too."""

    def __init__(self, uri: str) -> None:
        self.lock = threading.Lock()
        self._uri = uri
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memshelf-checkpoint", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while self._wake.wait() and not self._stop.wait(CHECKPOINT_PAUSE_S):  # a burst's commits pile up first
                self._wake.clear()
                if self._stop.is_set():  # close() came after the pause and before the clear: its wake-up is gone
                    break
                with self.lock:
                    try:
                        conn = conn or sqlite3.connect(self._uri, uri=True, isolation_level=None,
                                                       check_same_thread=False)
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    except sqlite3.Error as exc:  # the next commit wakes it again
                        log.debug("background checkpoint of %s failed: %s", self._uri, exc)
        finally:
            if conn is not None:
                conn.close()


class _Part(NamedTuple):
    """One statement of a keyword query: a condition on the full-text table, its parameters, the query as FTS5
    syntax."""
    condition: str
    params: tuple
    query: str


class _Bound(NamedTuple):
    """Which matches a keyword query ranks: the parts, each ranking rows none of the others does, whether they keep
    every match of the owner's (then what they rank is the answer), and the query of every match, a common term
    matched as its own word, as the parts match it."""
    parts: tuple[_Part, ...]
    complete: bool
    every: str


@dataclass
class _OwnerVectors:
    generation: int
    appended: int
    matrix: VectorMatrix


class _Statements:
    """Where the records half runs statements on SQLite: the thread's connection, errors translated."""

    __slots__ = ("_run",)

    def __init__(self, run: Callable[[str, Sequence], sqlite3.Cursor]) -> None:
        self._run = run

    def execute(self, query: str, params: Sequence = ()) -> sqlite3.Cursor:
        return self._run(query, params)


class SQLiteStore(SQLRecords):
    """One file (or ':memory:'), one connection per thread, WAL so several processes can share the file."""

    DERIVED_TABLES = ("owner_generation", "owner_changes")

    def __init__(self, path: str, vector_cache_mb: float | None = None, *,
                 busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        """busy_timeout_ms: how long a write waits for another connection's write lock before StoreUnavailable."""
        self.path = path
        self._busy_ms = busy_timeout_ms
        self._vectors: VectorCache[tuple[str, str, str], _OwnerVectors]
        self._vectors = VectorCache(cache_limit_bytes(vector_cache_mb))
        self._memory_db = path == ":memory:" or path.startswith("file::memory:")
        if self._memory_db:
            # One shared in-memory database for every thread of this store.
            self._uri = f"file:memshelf-{id(self)}?mode=memory&cache=shared"
        else:
            parent = Path(path).expanduser().resolve().parent
            if not parent.is_dir():
                raise StoreError(f"cannot open {path}: folder {parent} does not exist; create it first")
            self._uri = Path(path).expanduser().resolve().as_uri()
        self._files = None if self._memory_db or not _sqlite_vector_files.enabled() else \
            _sqlite_vector_files.VectorFiles(Path(path).expanduser().resolve())
        self._local = threading.local()
        self._all_connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._refresh_locks = [threading.Lock() for _ in range(REFRESH_LOCKS)]
        self._warned_cache_full = False
        self._scrub_pending = False
        self._scrub_tried = 0.0  # time.monotonic() of the last try
        self._checkpointer = None if self._memory_db else _Checkpointer(self._uri)
        self._keepalive = self._connection()  # holds a shared in-memory database open
        self._fts = TenantIndexes(self._q, self._many)
        self._statements = _Statements(self._q)
        self._migrate()

    # connections and transactions
    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self._uri, uri=True, isolation_level=None, check_same_thread=False,
                                       timeout=self._busy_ms / 1000)
                # A new thread's connection to an in-memory database waits out another's schema lock (_waiting).
                def setting(pragma: str) -> None:
                    self._waiting(conn.execute, f"PRAGMA {pragma}", ())

                setting(f"busy_timeout = {self._busy_ms}")
                if not self._memory_db:
                    setting("journal_mode = WAL")
                    setting("wal_autocheckpoint = 0")  # the store's _Checkpointer copies the WAL
                setting("synchronous = NORMAL")
                setting("secure_delete = ON")  # erased text is overwritten, not left in free pages
                setting("foreign_keys = ON")
                # Read pages through the OS page cache instead of SQLite's 2 MB per-connection cache: a keyword
                # search visits one memories row (and one FTS docsize row) per match, and at 100k memories those
                # pages no longer fit the default cache. Address space only; shared by every connection.
                setting(f"mmap_size = {MMAP_BYTES}")
                register_functions(conn)
            except sqlite3.Error as exc:
                raise translate(exc, self.path) from exc
            self._local.conn = conn
            self._local.depth = 0
            with self._lock:
                self._all_connections.append(conn)
        return conn

    @contextmanager
    def atomic(self) -> Iterator[None]:
        conn = self._connection()
        depth = self._local.depth
        name = f"sp{depth}"
        self._run(conn, "BEGIN IMMEDIATE" if depth == 0 else f"SAVEPOINT {name}")
        self._local.depth = depth + 1
        try:
            yield
            self._run(conn, "COMMIT" if depth == 0 else f"RELEASE {name}")
        except BaseException:
            self._undo(conn, depth, name)
            if depth == 0:
                self._local.scrub_at_commit = False  # rolled back: nothing was erased
            raise
        finally:
            self._local.depth = depth
        if depth == 0 and self._checkpointer is not None:
            self._checkpointer.poke()
        if depth == 0 and getattr(self._local, "scrub_at_commit", False):
            self._local.scrub_at_commit = False
            self._retry_scrub(SCRUB_WAIT_MS)  # an erasure inside this transaction: its checkpoint, now committed
        elif depth == 0 and self._scrub_pending and time.monotonic() - self._scrub_tried >= SCRUB_RETRY_S:
            self._retry_scrub()

    def _retry_scrub(self, wait_ms: int = 0) -> None:
        """An earlier erasure's checkpoint waited for a reader, or waited for its transaction to commit: finish it
        now if it can (waiting wait_ms for readers)."""
        try:
            self._checkpoint(wait_ms)
        except StoreError:
            pass  # the write before is committed and stays so; the next erasure or close reports this failure

    def _run(self, conn: sqlite3.Connection, sql: str) -> None:
        try:
            self._waiting(conn.execute, sql, ())
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from exc

    def _waiting(self, call: Callable[[str, Any], _T], sql: str, params: Any) -> _T:
        """call(sql, params), waiting out another connection's table lock in an in-memory database. Its connections
        share one cache, where a lock held by another connection is SQLITE_LOCKED at once, not a wait: the busy
        timeout does not apply, so threads sharing a ':memory:' shelf failed at once. The statement did not run,
        so it is tried again (a statement is atomic: one that failed wrote nothing), for up to the busy timeout.
        A file's connections wait in SQLite itself."""
        if not self._memory_db:
            return call(sql, params)
        deadline, pause = time.monotonic() + self._busy_ms / 1000, 0.001
        while True:
            try:
                return call(sql, params)
            except sqlite3.OperationalError as exc:
                code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
                if code != sqlite3.SQLITE_LOCKED or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _undo(self, conn: sqlite3.Connection, depth: int, name: str) -> None:
        """Roll back what atomic() began. The error that got us here is the one the caller sees: a rollback that
        fails too is not raised over it."""
        if not conn.in_transaction:
            return  # SQLite already rolled the whole transaction back (disk full, I/O error)
        try:
            if depth == 0:
                conn.execute("ROLLBACK")
            else:
                conn.execute(f"ROLLBACK TO {name}")
                conn.execute(f"RELEASE {name}")
        except sqlite3.Error:
            if depth == 0 and conn.in_transaction:
                self._discard(conn)  # closing a connection rolls its transaction back

    def _discard(self, conn: sqlite3.Connection) -> None:
        if self._memory_db and conn is self._keepalive:
            return  # it holds the in-memory database alive
        with self._lock:
            if conn in self._all_connections:
                self._all_connections.remove(conn)
        conn.close()
        self._local.conn = None

    def _q(self, sql: str, params: Sequence = ()) -> sqlite3.Cursor:
        try:
            return self._waiting(self._connection().execute, sql, params)
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from exc

    def _many(self, sql: str, rows: Iterable[Sequence]) -> None:
        conn = self._connection()
        try:
            if not self._memory_db:
                conn.executemany(sql, rows)
                return
            # Each row is a statement of its own: in a savepoint, the rows written before a lock are undone before
            # the whole batch is tried again.
            batch = list(rows)

            def in_savepoint(statement: str, params: Any) -> None:
                conn.execute("SAVEPOINT memshelf_many")
                try:
                    conn.executemany(statement, params)
                except BaseException:
                    conn.execute("ROLLBACK TO memshelf_many")
                    raise
                finally:
                    conn.execute("RELEASE memshelf_many")

            self._waiting(in_savepoint, sql, batch)
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from exc

    # the records half's dialect (sql_records.py)
    def _time_in(self, value: datetime | None) -> str | None:
        return ts(value)

    def _time_out(self, value: str | None) -> datetime | None:
        return parse_ts(value)

    @contextmanager
    def _owner_scope(self, tenant: str, write: bool = True) -> Iterator[Statements]:
        """Writes in a transaction; reads outside one, so they never wait for the write lock."""
        if not write:
            yield self._statements
            return
        with self.atomic():
            yield self._statements

    def _admin_scope(self, write: bool = True) -> AbstractContextManager[Statements]:
        return self._owner_scope("", write)

    @property
    def scrub_pending(self) -> bool:
        return self._scrub_pending

    def finish_scrub(self, full: bool | None = None) -> bool:
        """The checkpoint a reader held up, tried again (waiting SCRUB_WAIT_MS for readers, as an erasure does)."""
        if self._scrub_pending:
            self._checkpoint(SCRUB_WAIT_MS)
        return self._scrub_pending

    @property
    def quick_reads(self) -> bool:
        """A file in WAL mode: a reader never waits for a writer, and the keys' pages stay in memory. (An in-memory
        database shares one cache between connections, where a reader can wait for a writer's table lock.)"""
        return not self._memory_db

    def close(self) -> None:
        if self._files is not None:
            self._files.wait()
        if self._checkpointer is not None:
            self._checkpointer.close()
        if self._scrub_pending and self._all_connections:
            self._checkpoint(SCRUB_WAIT_MS)
        with self._lock:
            for conn in self._all_connections:
                conn.close()
            self._all_connections.clear()
        self._local = threading.local()
        self._vectors.clear()

    def _migrate(self) -> None:
        self._q("CREATE TABLE IF NOT EXISTS memshelf_migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
        for name, script in MIGRATIONS:
            with self.atomic():
                if self._q("SELECT 1 FROM memshelf_migrations WHERE name = ?", (name,)).fetchone():
                    continue
                for statement in _split_sql(script):
                    self._q(statement)
                self._after_migration(name)
                self._q("INSERT INTO memshelf_migrations VALUES (?, ?)", (name, ts(datetime.now(UTC))))
        if not READS_SECURE and self._q("SELECT 1 FROM fts_tenants WHERE secure = 1 LIMIT 1").fetchone():
            with self.atomic():  # a newer SQLite used this file: its indexes are rebuilt in a form this one reads
                self._fts.readable()

    def _after_migration(self, name: str) -> None:
        """The part of a migration that SQL alone cannot say: it walks the tenants."""
        if name == "m004_fts_per_tenant":  # the rows indexed by the old shared tables get their tenant's
            for (tenant,) in self._q("SELECT DISTINCT tenant FROM memories").fetchall():
                self._fts.index_existing(tenant)
        elif name in ("m005_fts_reindex", CJK_INDEX, FOLDED_LETTERS):  # m005: undo the double entries and the
            # piled-up levels of older versions; CJK_INDEX: index CJK text as character pairs; FOLDED_LETTERS: fold
            for (tenant,) in self._q("SELECT tenant FROM fts_tenants").fetchall():
                self._fts.rebuild(tenant)
        elif name == WHITESPACE_DIGESTS:
            _redigest(self._connection())
        elif name == WORD_MARKS:  # a table's tokenizer is fixed when it is made: make each again
            for (tenant,) in self._q("SELECT tenant FROM fts_tenants").fetchall():
                self._fts.retokenize(tenant)

    def applied_migrations(self) -> list[str]:
        return [r[0] for r in self._q("SELECT name FROM memshelf_migrations ORDER BY name")]

    # memories
    def add_memories(self, owner: Owner, items: Sequence[NewMemory], now: datetime) -> list[Memory]:
        """A batch's new rows go in with one statement, their keys given (the next after the largest, as SQLite
        would choose them; the write lock is held), each row's conversation context made from the rows before it
        in the batch once the stored ones are read (once per topic), then their full-text entries, then the count."""
        from .._ids import new_ids

        stored: list[Memory | None] = []
        tag = owner_tag(owner)
        keys = [digest(item.topic, item.content) for item in items]
        seen_at = ts(now)
        with self.atomic():
            seen = self._stored(owner, "digest", keys)  # what is already there, or was added by this batch
            next_pk = self._q("SELECT coalesce(max(pk), 0) + 1 FROM memories").fetchone()[0]
            rows: list[tuple] = []
            added: list[NewMemory] = []
            context_of = self._contexts(owner)
            again: list[tuple[int, NewMemory, str]] = []
            ids = iter(new_ids("m", len(items)))
            stamps: dict[str, datetime] = {}

            def parsed(text: str) -> datetime:  # each instant's text parsed once a batch
                found = stamps.get(text)
                if found is None:
                    found = stamps[text] = parse_ts(text)
                return found

            for item, key in zip(items, keys):
                if key in seen:
                    again.append((len(stored), item, key))
                    stored.append(None)
                    continue
                seen.add(key)
                context = context_of(item.topic, item.content)
                created = seen_at if item.created_at == now else ts(item.created_at)  # one strftime a batch
                memory_id, expires = next(ids), ts(item.expires_at)
                added.append(item)
                rows.append((next_pk + len(rows), memory_id, owner.tenant, owner.user, item.topic, item.content, key,
                             tag, item.source, item.confidence, created, seen_at, 1, expires, item.vector,
                             item.embed_model, context, None, None, None, None))
                # the row as reading it back would give it
                stored.append(Memory(id=memory_id, topic=item.topic, content=item.content, source=item.source,
                                     confidence=item.confidence, created_at=parsed(created),
                                     expires_at=None if expires is None else parsed(expires),
                                     last_seen=parsed(seen_at), observations=1, embed_model=item.embed_model))
            self._insert_rows(owner, rows, [(row[0], item.embed_model, item.pieces)
                                            for row, item in zip(rows, added) if item.pieces])
            for at, item, key in again:  # a repeat (of a stored row, or of one earlier in this batch)
                row = self._q(f"SELECT m.pk, {MEMORY_COLUMNS} FROM memories m "
                              "WHERE m.tenant = ? AND m.user_id = ? AND m.digest = ?",
                              (owner.tenant, owner.user, key)).fetchone()
                self._observe_again(owner, row, item, now)
                stored[at] = _memory(self._q(f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE m.pk = ?",
                                             (row[0],)).fetchone())
        return [memory for memory in stored if memory is not None]

    def _contexts(self, owner: Owner) -> Callable[[str, str], str]:
        """For new rows written in order: each one's context, the CONTEXT_TURNS contents before it under its topic
        (the stored ones read once per topic, then the batch's own)."""
        tails: dict[str, list[str]] = {}

        def context(topic: str, content: str) -> str:
            tail = tails.get(topic)
            if tail is None:
                turns = self._q(earlier_turns("?", "?", "?", None), (owner.tenant, owner.user, topic))
                tail = tails[topic] = [row[1] for row in reversed(turns.fetchall())]
            made = "\n".join(tail)
            tail.append(content)
            del tail[:-CONTEXT_TURNS]
            return made
        return context

    def _stored(self, owner: Owner, column: str, values: Sequence[str]) -> set[str]:
        """Which of these values of `column` ("id" or "digest", each unique per owner) the owner's memories have."""
        assert column in ("id", "digest")
        found: set[str] = set()
        unique = list(dict.fromkeys(values))
        for start in range(0, len(unique), 500):  # SQLite's bound on parameters
            chunk = unique[start:start + 500]
            found.update(r[0] for r in self._q(
                f"SELECT {column} FROM memories WHERE tenant = ? AND user_id = ?"
                f" AND {column} IN ({','.join('?' * len(chunk))})", (owner.tenant, owner.user, *chunk)))
        return found

    def _count_added(self, owner: Owner, rows: int, most_confident: float) -> None:
        """Count an owner's new rows in owner_generation (`appended` tells the cached vector matrix to fetch
        them), and raise its most_confident to the batch's, once per batch, in the batch's transaction. Every
        insert into memories goes through here.

        An owner's first row starts its generation at a random number below 2**62, not at 0: an erasure deletes
        the owner's counters, and an owner refilled with as many rows counted again (0, n), which another process
        had cached for the erased rows, so it kept their vectors (and scored the new memories, which reuse their
        keys, with them)."""
        if rows:
            self._q("INSERT INTO owner_generation (tenant, user_id, generation, appended, memories, most_confident)"
                    f" VALUES (?, ?, random() & {(1 << 62) - 1}, ?, ?, ?) ON CONFLICT (tenant, user_id) DO UPDATE SET"
                    " appended = appended + excluded.appended, memories = memories + excluded.memories,"
                    " most_confident = max(coalesce(most_confident, excluded.most_confident),"
                    " excluded.most_confident)", (owner.tenant, owner.user, rows, rows, most_confident))

    def _context(self, owner: Owner, topic: str, before: int) -> str:
        """The text of the CONTEXT_TURNS memories stored just before pk `before` by the same owner under the same
        topic: what the conversation was about when that memory was said (new rows get theirs from _contexts)."""
        rows = self._q(earlier_turns("?", "?", "?", "?"), (owner.tenant, owner.user, topic, before)).fetchall()
        return "\n".join(r[1] for r in reversed(rows))

    def _doomed(self, where: str, params: tuple) -> list[tuple]:
        """The rows a delete is about to remove, with what their full-text entries need: (tenant, pk, topic,
        content, owner_tag, context, user_id)."""
        return self._q(f"SELECT tenant, pk, topic, content, owner_tag, context, user_id FROM memories WHERE {where}",
                       params).fetchall()

    def _forget_rows(self, where: str, params: tuple, recontext: bool) -> tuple[int, set[str]]:
        """Delete rows and their full-text entries; optionally rewrite the context of the memories that followed
        them, so no copy of a deleted memory's text stays in an index. Returns (rows deleted, tenants touched)."""
        doomed = self._doomed(where, params)
        touched = self._fts.remove(row[:6] for row in doomed)
        deleted = self._q(f"DELETE FROM memories WHERE {where}", params).rowcount
        if recontext:
            self._recontext(doomed)
        return deleted, touched

    def _recontext(self, gone: Sequence[tuple]) -> None:
        done: set[int] = set()
        for tenant, pk, topic, _content, _tag, _context, user in gone:
            owner = Owner.stored(tenant, user)
            followers = self._q(later_turns("n.pk, n.content, n.owner_tag, n.context", "?", "?", "?", "?"),
                                (tenant, user, topic, pk)).fetchall()
            for follower, content, tag, old in followers:
                if follower in done:
                    continue
                done.add(follower)
                new = self._context(owner, topic, follower)
                self._q("UPDATE memories SET context = ? WHERE pk = ?", (new, follower))
                self._fts.replace_context(tenant, follower, topic, content, tag, old, new)

    def _observe_again(self, owner: Owner, row: Sequence, item: NewMemory, now: datetime) -> None:
        memory = _memory(row[1:])
        successor = None
        if memory.superseded_by is not None:
            found = self._q(f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE m.tenant = ? AND m.user_id = ?"
                            " AND m.id = ?", (owner.tenant, owner.user, memory.superseded_by)).fetchone()
            successor = None if found is None else _memory(found)
        seen = observe_again(memory, item, now, successor=successor)
        self._q(
            "UPDATE memories SET observations = observations + 1, last_seen = ?, expires_at = ?, source = ?,"
            " confidence = ?" + (", embedding = ?, embed_model = ?" if seen.replace_vector else "")
            + (", superseded_at = NULL, superseded_by = NULL" if seen.reopen else "")
            + (", confirmed_at = NULL, confirmed_from = NULL" if seen.revived else "") + " WHERE pk = ?",
            (ts(now), ts(seen.expires_at), seen.source, seen.confidence,
             *((item.vector, item.embed_model) if seen.replace_vector else ()), row[0]))
        if seen.replace_vector:
            self._put_pieces(row[0], item.embed_model, item.pieces)

    def _put_pieces(self, key: int, model: str | None, pieces: Sequence[bytes]) -> None:
        """Make `pieces` (of `model`) the later pieces of memory `key`, in place of any it had."""
        self._q("DELETE FROM memory_pieces WHERE memory_pk = ?", (key,))
        for number, blob in enumerate(pieces, 1):
            self._q("INSERT INTO memory_pieces (memory_pk, piece, tenant, user_id, embed_model, embedding)"
                    " SELECT pk, ?, tenant, user_id, ?, ? FROM memories WHERE pk = ?", (number, model, blob, key))

    def import_memories(self, owner: Owner, items: Sequence[Memory], vectors: Sequence[bytes | None],
                        pieces: Sequence[Sequence[bytes]] = ()) -> int:
        """Records kept as they are (id, times, provenance), a batch in one statement as in add_memories. A memory
        whose id or text (topic and content) the owner already has, stored or earlier in the batch, is skipped, so
        importing the same records again adds nothing. Each new row's context is made from the rows before it under
        its topic, as if it had been stored then."""
        tag = owner_tag(owner)
        keys = [digest(memory.topic, memory.content) for memory in items]
        with self.atomic():
            ids = self._stored(owner, "id", [memory.id for memory in items])
            seen = self._stored(owner, "digest", keys)
            next_pk = self._q("SELECT coalesce(max(pk), 0) + 1 FROM memories").fetchone()[0]
            rows: list[tuple] = []
            later_pieces: list[tuple[int, str | None, Sequence[bytes]]] = []
            context_of = self._contexts(owner)
            for memory, key, vector, later in zip(items, keys, vectors, pieces or [()] * len(items)):
                if memory.id in ids or key in seen:
                    continue
                ids.add(memory.id)
                seen.add(key)
                context = context_of(memory.topic, memory.content)
                pk = next_pk + len(rows)
                model = memory.embed_model if vector is not None else None
                rows.append((pk, memory.id, owner.tenant, owner.user, memory.topic, memory.content, key, tag,
                             memory.source, memory.confidence, ts(memory.created_at),
                             ts(memory.last_seen or memory.created_at), memory.observations, ts(memory.expires_at),
                             vector, model, context, ts(memory.superseded_at), memory.superseded_by,
                             ts(memory.confirmed_at), memory.confirmed_from))
                if later and vector is not None:
                    later_pieces.append((pk, model, later))
            self._insert_rows(owner, rows, later_pieces)
        return len(rows)

    def _insert_rows(self, owner: Owner, rows: Sequence[tuple], pieces: Sequence[tuple[int, str | None,
                                                                                      Sequence[bytes]]]) -> None:
        """A batch of new rows of the owner, keys given (the columns of _NEW_ROW, in order), then their later
        pieces as (key, model, blobs), their full-text entries and the owner's count."""
        self._many(f"INSERT INTO memories ({_NEW_ROW}) VALUES ({', '.join('?' * (_NEW_ROW.count(',') + 1))})", rows)
        for key, model, blobs in pieces:
            self._put_pieces(key, model, blobs)
        self._fts.add_many(owner.tenant, [(row[0], row[4], row[5], row[7], row[16]) for row in rows])
        self._count_added(owner, len(rows), max((row[_NEW_CONFIDENCE] for row in rows), default=MAX_CONFIDENCE))

    def memory_pieces(self, owner: Owner, ids: Sequence[str]) -> dict[str, list[bytes]]:
        found: dict[str, list[bytes]] = {}
        for start in range(0, len(ids), 500):  # SQLite's bound on parameters
            chunk = ids[start:start + 500]
            for memory_id, blob in self._q(
                    "SELECT m.id, p.embedding FROM memories m JOIN memory_pieces p ON p.memory_pk = m.pk"
                    f" WHERE m.tenant = ? AND m.user_id = ? AND m.id IN ({','.join('?' * len(chunk))})"
                    " AND p.embed_model = m.embed_model ORDER BY m.pk, p.piece",
                    (owner.tenant, owner.user, *chunk)).fetchall():
                found.setdefault(memory_id, []).append(blob)
        return found

    def get_memory(self, owner: Owner, memory_id: str, now: datetime) -> Memory | None:
        row = self._q(f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE m.tenant = ? AND m.user_id = ? AND m.id = ?"
                      " AND (m.expires_at IS NULL OR m.expires_at > ?)",
                      (owner.tenant, owner.user, memory_id, ts(now))).fetchone()
        return None if row is None else _memory(row)

    def delete_memory(self, owner: Owner, memory_id: str) -> bool:
        with self.atomic():
            self._hand_back_places(self._statements, owner, [memory_id])
            deleted, touched = self._forget_rows("tenant = ? AND user_id = ? AND id = ?",
                                                 (owner.tenant, owner.user, memory_id), recontext=True)
            self._drop_evidence(self._statements, owner, "memory", [memory_id] if deleted else [])
        if deleted:
            self._scrub(touched)
        return deleted > 0

    def supersede_memory(self, owner: Owner, old_id: str, new_id: str, now: datetime) -> bool:
        with self.atomic():
            return self._q("UPDATE memories SET superseded_at = ?, superseded_by = ? WHERE tenant = ? AND user_id = ?"
                           " AND id = ? AND superseded_at IS NULL",
                           (ts(now), new_id, owner.tenant, owner.user, old_id)).rowcount > 0

    def iter_memories(self, owner: Owner, now: datetime | None) -> Iterator[tuple[Memory, bytes | None]]:
        sql = (f"SELECT {MEMORY_COLUMNS}, m.embedding FROM memories m WHERE m.tenant = ? AND m.user_id = ?"
               + ("" if now is None else " AND (m.expires_at IS NULL OR m.expires_at > ?)")
               + " ORDER BY m.pk")
        params = (owner.tenant, owner.user) + (() if now is None else (ts(now),))
        for row in self._q(sql, params).fetchall():
            yield _memory(row), row[MEMORY_WIDTH]

    def keyword_search(self, owner: Owner, terms: Sequence[str], limit: int, now: datetime,
                       by_confidence: bool, view: View = CURRENT) -> list[Scored]:
        """Keyword search ranks a row by its own words (the tenant's fts_ table); the hybrid's candidates (not
        by_confidence) are ranked with their conversation context too (ctx_ table), which finds the turn that answers a
        question asked in the words of the turns around it."""
        if not terms:
            return []
        counted = self._fts.counted(owner.tenant, owner.user)
        if counted is None:
            return []  # the tenant has never stored a memory
        words, context, mine, tenant, most_confident = counted
        table, weights = (words, "1.0, 1.0, 0.0") if by_confidence else \
            (context, f"1.0, 1.0, 0.0, {float(CONTEXT_WEIGHT)!r}")
        order = "m.confidence DESC, rank, m.created_at DESC, m.pk DESC" if by_confidence else \
            "rank, m.created_at DESC, m.pk DESC"
        narrow = mine < OWNER_TOKEN_SHARE * tenant
        scope = owner if narrow else None
        def bound(newest: int) -> _Bound | None:
            return self._ranked_only(table, terms, owner, scope, by_confidence, rows=mine if narrow else tenant,
                                     limit=limit, sole=mine >= tenant, newest=newest)

        bounded = bound(max(NEWEST_RANKED, limit))
        seen, at = view_condition(view, ts)

        def every() -> _Bound:  # every match ranked
            query = fts_query(terms, scope, with_context=not by_confidence, words_table=by_confidence)
            return _Bound((_Part("", (), query),), True, query)

        def in_order(rows: list) -> list:
            """The best `limit` of rows ranked by separate statements, in the statements' order (stable sorts, the
            last key first)."""
            rows.sort(key=lambda r: (r[_CREATED], r[MEMORY_WIDTH + 1]), reverse=True)
            rows.sort(key=(lambda r: (-r[MEMORY_CONFIDENCE], r[MEMORY_WIDTH])) if by_confidence else
                      (lambda r: r[MEMORY_WIDTH]))
            return rows[:limit]

        def ranked(only: _Bound) -> list:
            rows = []
            for condition, among, query in only.parts:
                rows += self._q(
                    f"SELECT {MEMORY_COLUMNS}, bm25({table}, {weights}) AS rank, m.pk"
                    f" FROM {table} CROSS JOIN memories m ON m.pk = {table}.rowid"  # full-text match first, always
                    f" WHERE {table} MATCH ?{condition} AND m.tenant = ? AND m.user_id = ?"
                    f" AND (m.expires_at IS NULL OR m.expires_at > ?){seen}"
                    f" ORDER BY {order} LIMIT ?",
                    (query, *among, owner.tenant, owner.user, ts(now), *at, limit)).fetchall()
            return in_order(rows) if len(only.parts) > 1 else rows

        def doubtful(ranked_only: _Bound | None, rows: list) -> bool:
            """Whether what the bound ranked may not hold the answer: too few of its rows are current, or an older
            match outside it may be more confident than the last hit."""
            return ranked_only is not None and not ranked_only.complete and \
                short_of_the_answer(rows, limit, by_confidence, most_confident)

        rows = ranked(bounded or every())
        if doubtful(bounded, rows):
            stated = sum(row[MEMORY_CONFIDENCE] >= MAX_CONFIDENCE for row in rows)
            if len(rows) < limit or stated * WIDER >= limit:
                # More of the newest matches: too few were current, or the statements among them, as many times
                # over, would be enough (an owner whose memories are mostly learned has a few among the newest).
                bounded = bound(max(NEWEST_RANKED, limit) * WIDER)
                rows = ranked(bounded or every())
            if doubtful(bounded, rows) and len(rows) < limit:
                bounded, rows = None, ranked(every())
        if bounded is not None and doubtful(bounded, rows):
            # A full answer whose last hit is less confident than a statement: only a more confident match among
            # the older ones can take its place, so those (few, for such an owner) are ranked among every match,
            # and the best of both kept.
            shown = {row[MEMORY_WIDTH + 1] for row in rows}
            confident = _Part(" AND m.confidence > ?", (rows[-1][MEMORY_CONFIDENCE],), bounded.every)
            rows = in_order(rows + [row for row in ranked(_Bound((confident,), True, bounded.every))
                                    if row[MEMORY_WIDTH + 1] not in shown])
        # bm25() is lower-is-better; report higher-is-better.
        return [Scored(_memory(r), -float(r[MEMORY_WIDTH])) for r in rows]

    def _ranked_only(self, table: str, terms: Sequence[str], owner: Owner, scope: Owner | None, words_table: bool,
                     rows: int, limit: int, sole: bool, newest: int) -> _Bound | None:
        """Which matches a keyword query ranks when a term is common: None (all of them) unless a term matches more
        than max(RANKED, limit) rows. FTS5 scores every row it ranks, so a word found in a fifth of 100,000 memories
        cost 30-100 ms (BENCHMARKS.md, "Keyword search on common words"). Then only each common term's `newest`
        newest matches of this owner's (by when they were stored) and every match of the rarer terms are ranked, and
        a common term matches its own word (as stemmed), not every word it begins: FTS5 merges a prefix's every entry
        before it can skip any. keyword_search checks what this ranked, and ranks more, then every match, when it
        falls short.

        `scope`: the owner when queries start from the owner's index token, else None; `words_table`: the tenant's
        words table (keyword search), else its context table (the hybrid's candidates, ranked with the conversation
        context); `rows`: how many rows the query can match at most (the owner's with a scope, else the tenant's);
        `sole`: the owner holds every row of the tenant's (then any match is the owner's, and the owner's token need
        not be asked)."""
        bound = max(RANKED, limit)
        if rows <= bound:  # no term can be common: no need to look
            return None
        # How often each term's own word matches, counted up to bound + 1 (no ranking, no join, no rows read into
        # Python). A term found more often is common; when none is, every match is ranked, as a prefix where the
        # term is one.
        def whole(term: str, owner: Owner | None) -> str:
            return fts_query([term], owner, False, whole=True, words_table=words_table)

        found = {term: self._count(table, whole(term, scope), bound) for term in terms}
        windowed = [term for term in terms if found[term] > bound]
        if not windowed:
            return None
        picked: set[int] = set()
        rare: set[int] = set()  # the other terms' every match
        windows = []  # each common term's newest matches, newest first, when it has older ones
        starts = []  # where each common term's picked matches start
        complete = True  # every one of the owner's matches is picked
        as_words = list(windowed)  # the terms matched as their own word only, never as a prefix
        for term in terms:
            if term in windowed:  # common as its own word: the owner's newest matches of it
                latest = sorted(self._matches(table, whole(term, None if sole else owner), newest, newest=True),
                                reverse=True)
                complete = complete and len(latest) <= newest
                picked.update(latest[:newest])
                starts += latest[:newest][-1:]
                if len(latest) > newest:
                    windows.append(latest[:newest])
                continue
            begun = None
            if is_prefix(term):
                begun = self._matches(table, fts_query([term], scope, False, words_table=words_table), bound)
                if len(begun) > bound:  # its own word is rare, the words it begins are not: the word's every match
                    as_words.append(term)
                    begun = None
                    complete = False  # the words it begins are left out: a short answer ranks every match
            if begun is None and found[term]:
                begun = self._matches(table, whole(term, scope), bound)
            rare.update(begun or ())
        picked |= rare

        def query(these: Sequence[str], also: Sequence[str] = ()) -> str:
            return fts_query(these, scope, not words_table, whole=as_words, words_table=words_table, also=also)

        # Every match, as the bound keeps it: a common term as its own word (the documented trade-off), but a term
        # whose own word is rare with every word it begins, so the check of more confident matches sees them.
        every = fts_query(terms, scope, not words_table, whole=windowed, words_table=words_table)
        if not picked:  # the owner has no match of any term (others in the tenant have)
            return _Bound((_Part(" AND 0", (), query(terms)),), complete, every)
        start = min(starts, default=min(picked))
        old = [key for key in rare if key < start]
        # How many of the common terms' older matches one query would walk from the oldest rare match, estimated
        # from how closely their newest matches lie.
        density = sum(len(window) / (window[0] - window[-1] + 1) for window in windows)
        walked = density * (start - min(old, default=start))
        if not words_table or walked < SPLIT_WALK:
            start = min(picked)
        # The range lets FTS5 skip the older rows; the list (unary +: checked row by row, never a lookup per item,
        # which would restart the full-text query for each) keeps the picked ones.
        tail = _Part(f" AND {table}.rowid >= ? AND +{table}.rowid IN (SELECT value FROM json_each(?))",
                     (start, json.dumps(sorted(key for key in picked if key >= start))), query(terms))
        if start <= min(picked):
            return _Bound((tail,), complete, every)
        # The rarer terms' matches older than every common term's newest: ranked in the same statement, FTS5 would
        # walk each common term's every match from the oldest of them (5-20 ms at 100,000 memories). Instead, those
        # that also hold a common term are ranked by a query that needs both (FTS5 then skips through the common
        # term's list), and the others by the rarer terms alone: a term a row does not hold adds nothing to its
        # bm25, so every row keeps its score.
        others = [term for term in terms if term not in windowed]
        both = query(others, also=windowed)
        within = f" AND {table}.rowid >= ? AND {table}.rowid < ?"
        oldest = min(old)
        shared = self._q(f"SELECT json_group_array(rowid) FROM {table} WHERE {table} MATCH ?{within}",
                         (both, oldest, start)).fetchone()[0]
        return _Bound((tail, _Part(within, (oldest, start), both),
                       _Part(f"{within} AND +{table}.rowid NOT IN (SELECT value FROM json_each(?))",
                             (oldest, start, shared), query(others))), complete, every)

    def _matches(self, table: str, query: str, bound: int, newest: bool = False) -> list[int]:
        """Up to bound + 1 rows the query matches: the first found, or with `newest` the newest (the highest keys:
        the latest stored). FTS5 walks a long list backwards more slowly, so only a common term's are asked so. The
        keys come as one JSON array: a row per key costs more in Python than the lookup itself."""
        order = " ORDER BY rowid DESC" if newest else ""
        keys = self._q(f"SELECT json_group_array(rowid) FROM (SELECT rowid FROM {table} WHERE {table} MATCH ?{order}"
                       " LIMIT ?)", (query, bound + 1)).fetchone()[0]
        return json.loads(keys)

    def _count(self, table: str, query: str, bound: int) -> int:
        """How many rows the query matches, counted up to bound + 1."""
        return int(self._q(f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {table} MATCH ? LIMIT ?)",
                           (query, bound + 1)).fetchone()[0])

    # vectors
    def vector_search(self, owner: Owner, model: str, query: np.ndarray, limit: int, floor: float,
                      now: datetime, view: View = CURRENT) -> list[Scored]:
        """The current memories' vectors come from the owner's cached matrix; a look at the past (as_of,
        include_superseded) is rare, and reads the vectors its view sees from the file."""
        matrix = self._owner_vectors(owner, model) if view == CURRENT else self._view_vectors(owner, model, view)
        if matrix.size == 0:
            return []
        if query.shape[0] != matrix.dimensions:
            raise DimensionMismatch(
                f"the question's vector from {model} has {query.shape[0]} dimensions but this owner's stored "
                f"{model} vectors have {matrix.dimensions}: the service now serves another model under that name",
                BACKFILL_ADVICE, fix="backfill")
        picks = top_k(matrix, query, limit, floor, now.timestamp())
        if not picks:
            return []
        keys = [int(matrix.keys[i]) for i, _ in picks]
        marks = ",".join("?" * len(keys))
        seen, at = view_condition(view, ts)
        rows = {r[MEMORY_WIDTH]: r for r in self._q(
            f"SELECT {MEMORY_COLUMNS}, m.pk FROM memories m WHERE m.pk IN ({marks})"
            f" AND +m.tenant = ? AND +m.user_id = ? AND (m.expires_at IS NULL OR m.expires_at > ?){seen}",
            (*keys, owner.tenant, owner.user, ts(now), *at)).fetchall()}  # unary +: look rows up by pk, not owner index
        return [Scored(_memory(rows[k]), score) for k, (_, score) in zip(keys, picks) if k in rows]

    def _owner_vectors(self, owner: Owner, model: str) -> VectorMatrix:
        """The owner's vectors of `model`, cached in process: new rows are appended to the cached matrix, other
        changes (delete, expiry or confidence change, supersession) are caught up with by re-reading the rows they
        touched (_caught_up), and a re-embedding, or more changes than that can follow, rebuilds it, as does a
        search after eviction."""
        row = self._q("SELECT generation, appended FROM owner_generation WHERE tenant = ? AND user_id = ?",
                      (owner.tenant, owner.user)).fetchone()
        stamp: tuple[int, int] = (row[0], row[1]) if row else (0, 0)
        cache_key = (owner.tenant, owner.user, model)
        cached = self._vectors.get(cache_key)
        if cached is not None and (cached.generation, cached.appended) == stamp:
            return cached.matrix
        with self._refresh_locks[hash(cache_key) % REFRESH_LOCKS]:
            cached = self._vectors.get(cache_key)
            if cached is not None and (cached.generation, cached.appended) == stamp:
                return cached.matrix  # another thread refreshed it meanwhile
            if cached is not None and cached.generation < stamp[0]:
                caught = self._caught_up(owner, model, cached.matrix, cached.generation, stamp[0], deletes=True)
                cached = None if caught is None else _OwnerVectors(stamp[0], -1, caught)
            saved = None
            if cached is None or cached.generation != stamp[0]:
                saved = self._saved_vectors(owner, model, stamp[0])
                cached = None if saved is None else _OwnerVectors(stamp[0], -1, saved)
            if cached is not None and cached.generation == stamp[0]:
                matrix = cached.matrix.extended(self._vector_rows(owner, model, after=cached.matrix.last_key), parse_ts)
            else:
                matrix = VectorMatrix.build(model, self._vector_rows(owner, model, after=-1), parse_ts)
            if self._files is not None and (saved is None and cached is None
                                            or saved is not None and matrix.size > saved.size * RESAVE_GROWTH):
                self._files.save_soon(owner, model, stamp[0], matrix, lambda: self._generation_now(owner))
            if not self._vectors.put(cache_key, _OwnerVectors(stamp[0], stamp[1], matrix), matrix.nbytes):
                self._warn_cache_full(matrix)
        return matrix

    def _caught_up(self, owner: Owner, model: str, matrix: VectorMatrix, since: int, generation: int,
                   deletes: bool) -> VectorMatrix | None:
        """`matrix`, the owner's at generation `since`, brought to `generation` by re-reading only the rows whose
        changes owner_changes lists (m013); rows added since are left to `extended`. None when it cannot be, and the
        caller reads every row again: entries already dropped (more than CHANGES_KEPT behind) or missing (the owner
        was erased meanwhile), the newest row no change names no longer as it was (erased and refilled), a vector
        re-embedded, too many rows (PATCH_SHARE), or a memory deleted where `deletes` is False or the vectors are
        a mapped file's (a deleted memory's vector must leave memory, and the file went with the deletion)."""
        if not since < generation <= since + CHANGES_KEPT or matrix.size == 0:
            return None
        # One statement, so the changes and the rows they name are read from one snapshot. Changes after
        # `generation` (made since the caller read it) come too: their rows are read as they are now, so they count
        # in the checks below; the next search catches up with them again, which changes nothing twice.
        changes = self._q(f"SELECT c.generation, c.pk, c.kind, m.pk, m.confidence, {_UNTIL} FROM owner_changes c"
                          " LEFT JOIN memories m ON m.pk = c.pk AND m.tenant = c.tenant AND m.user_id = c.user_id"
                          " AND m.embed_model = ? AND m.embedding IS NOT NULL"
                          " WHERE c.tenant = ? AND c.user_id = ? AND c.generation > ?",
                          (model, owner.tenant, owner.user, since)).fetchall()
        if sum(1 for change in changes if change[0] <= generation) != generation - since \
                or any(change[2] == CHANGED_VECTOR for change in changes):
            return None
        last = matrix.last_key
        mine = [change for change in changes if change[1] <= last]  # later rows are left to `extended`
        if any(kind == DELETED and found is not None for _, _, kind, found, _, _ in mine):
            return None  # a deleted row's key was given to a new memory: the matrix holds the old one's vector
        touched = sorted({change[1] for change in mine})
        if len(touched) > matrix.size * PATCH_SHARE:
            return None
        keys, changed = matrix.keys, set(touched)
        expires = matrix.expires
        probe = next((i for i in range(matrix.size - 1, -1, -1)
                      if int(keys[i]) not in changed and expires[i] != -np.inf), None)
        if probe is None or not self._still_there(owner, model, int(keys[probe]), matrix.matrix[probe]):
            return None
        states = list({found: (found, level, until) for _, _, _, found, level, until in mine
                       if found is not None}.values())
        kept = {state[0] for state in states}
        gone = [pk for pk in touched if pk not in kept]
        if gone and (not deletes or not matrix.writable
                     or matrix.dropped + len(gone) > matrix.size * PATCH_SHARE):
            return None
        return matrix.patched(states, gone, parse_ts)

    def _saved_vectors(self, owner: Owner, model: str, generation: int) -> VectorMatrix | None:
        """The owner's matrix from its vector file (_sqlite_vector_files.py), when one was written at this
        generation and its last row is still in the database as it was, or at an earlier one it can catch up from
        without a deletion between (a deletion removes the tenant's files; one left behind is not trusted)."""
        if self._files is None:
            return None

        def current(matrix: VectorMatrix, written_at: int) -> VectorMatrix | None:
            if written_at < generation:
                return self._caught_up(owner, model, matrix, written_at, generation, deletes=False)
            return matrix if self._still_there(owner, model, matrix.last_key, matrix.matrix[-1]) else None
        return self._files.load(owner, model, generation, current)

    def _still_there(self, owner: Owner, model: str, key: int, row: np.ndarray) -> bool:
        """Whether the owner's memory `key` still has `row` (normalized) as its vector or one of its pieces'."""
        found = self._q("SELECT embedding FROM memories WHERE pk = ? AND tenant = ? AND user_id = ?"
                        " AND embed_model = ? UNION ALL SELECT embedding FROM memory_pieces WHERE memory_pk = ?"
                        " AND tenant = ? AND user_id = ? AND embed_model = ?",
                        (key, owner.tenant, owner.user, model, key, owner.tenant, owner.user, model)).fetchall()
        return any(blob is not None and len(blob) == 4 * row.shape[0]
                   and np.array_equal(normalize(np.frombuffer(blob, dtype="<f4")), row) for (blob,) in found)

    def _generation_now(self, owner: Owner) -> int:
        """The owner's generation as committed now, read on a connection of its own (the vector file writer's
        thread is short-lived, and a thread's connection lives until close)."""
        conn = sqlite3.connect(self._uri, uri=True, timeout=self._busy_ms / 1000)
        try:
            row = conn.execute("SELECT generation FROM owner_generation WHERE tenant = ? AND user_id = ?",
                               (owner.tenant, owner.user)).fetchone()
        finally:
            conn.close()
        return row[0] if row else 0

    def _warn_cache_full(self, matrix: VectorMatrix) -> None:
        if not self._warned_cache_full:
            self._warned_cache_full = True
            log.warning("an owner's %s vectors (%.0f MB) do not fit in the vector cache (%.0f MB): each of its "
                        "searches reads them from the file; raise %s to keep them in memory", matrix.model,
                        matrix.nbytes / 1e6, self._vectors.max_bytes / 1e6, CACHE_ENV)

    def _vector_rows(self, owner: Owner, model: str, after: int) -> list[Sequence]:
        """(pk, vector, confidence, until) of the owner's rows and their later pieces: a superseded row counts as
        expired from the instant it was closed, so the cached matrix serves current memories only."""
        return self._with_pieces(owner, model, f"m.pk, m.embedding, m.confidence, {_UNTIL}", " AND m.pk > ?", (after,))

    def _view_vectors(self, owner: Owner, model: str, view: View) -> VectorMatrix:
        """The owner's vectors of `model` that a view of the past sees, read now, not cached."""
        seen, at = view_condition(view, ts)
        rows = self._with_pieces(owner, model, "m.pk, m.embedding, m.confidence, m.expires_at", seen, at)
        return VectorMatrix.build(model, rows, parse_ts, compact=False)

    def _with_pieces(self, owner: Owner, model: str, columns: str, where: str, params: tuple) -> list[Sequence]:
        """`columns` (the first the key, the second the vector) of the owner's memories with vectors of `model` and
        matching `where` (on alias m), in key order, each followed by its later pieces (the vector then the piece's).
        Read in two index walks and merged: one sort of every row would move every vector."""
        rows = self._q(f"SELECT {columns} FROM memories m INDEXED BY memories_owner_model WHERE m.tenant = ?"
                       f" AND m.user_id = ? AND m.embed_model = ? AND m.embedding IS NOT NULL{where} ORDER BY m.pk",
                       (owner.tenant, owner.user, model, *params)).fetchall()
        pieces = self._q(f"SELECT {columns.replace('m.embedding', 'p.embedding')} FROM memory_pieces p"
                         " JOIN memories m ON m.pk = p.memory_pk WHERE p.tenant = ? AND p.user_id = ?"
                         " AND p.embed_model = ? AND m.embed_model = p.embed_model"
                         f"{where.replace('m.pk', 'p.memory_pk')} ORDER BY p.memory_pk, p.piece",
                         (owner.tenant, owner.user, model, *params)).fetchall()
        return list(heapq.merge(rows, pieces, key=lambda row: row[0])) if pieces else rows

    def pending_vectors(self, model: str, after: int, limit: int) -> list[Pending]:
        rows = self._q("SELECT pk, content FROM memories WHERE pk > ? AND (embed_model IS NULL OR embed_model != ?"
                       " OR embedding IS NULL) ORDER BY pk LIMIT ?", (after, model, limit)).fetchall()
        return [Pending(r[0], r[1]) for r in rows]

    def count_pending_vectors(self, model: str) -> int:
        return self._q("SELECT count(*) FROM memories WHERE embed_model IS NULL OR embed_model != ?"
                       " OR embedding IS NULL", (model,)).fetchone()[0]

    def count_unembedded(self, owner: Owner, model: str, now: datetime) -> int:
        return self._q("SELECT count(*) FROM memories WHERE tenant = ? AND user_id = ? AND superseded_at IS NULL"
                       " AND (expires_at IS NULL OR expires_at > ?) AND (embed_model IS NULL OR embed_model != ?"
                       " OR embedding IS NULL)", (owner.tenant, owner.user, ts(now), model)).fetchone()[0]

    def vector_dimensions(self, owner: Owner, model: str) -> int | None:
        row = self._q("SELECT length(embedding) / 4 FROM memories WHERE tenant = ? AND user_id = ? AND embed_model = ?"
                      " AND embedding IS NOT NULL LIMIT 1", (owner.tenant, owner.user, model)).fetchone()
        return None if row is None else int(row[0])

    def set_vectors(self, model: str, rows: Iterable[tuple[int, bytes, Sequence[bytes]]]) -> None:
        with self.atomic():
            for key, blob, pieces in rows:
                self._q("UPDATE memories SET embedding = ?, embed_model = ? WHERE pk = ?", (blob, model, key))
                self._put_pieces(key, model, pieces)

    # the memory half's share of erasure (sql_records.py runs the rest)
    def _remove_memories(self, db: Statements, where: str, params: tuple, whole_tenant: str | None
                         ) -> tuple[int, set[str]]:
        if whole_tenant is not None:  # the whole tenant goes: its full-text tables go with it
            self._fts.drop(whole_tenant)
            return self._q(f"DELETE FROM memories WHERE {where}", params).rowcount, set()
        # no recontext: every memory of the owner goes, and contexts never cross owners
        return self._forget_rows(where, params, recontext=False)

    def _purge_memories(self, db: Statements, now: datetime) -> tuple[int, set[str]]:
        return self._forget_rows("expires_at IS NOT NULL AND expires_at <= ?", (ts(now),), recontext=True)

    def _delete_memories(self, db: Statements, owner: Owner, ids: Sequence[str]) -> tuple[int, set[str]]:
        marks = ",".join("?" * len(ids))
        return self._forget_rows(f"tenant = ? AND user_id = ? AND id IN ({marks})", (owner.tenant, owner.user, *ids),
                                 recontext=True)

    def _erased(self, counts: dict[str, int], touched: set[str], whole_owner: bool) -> bool:
        if whole_owner:
            self._vectors.clear()
            if self._files is not None:
                self._files.erase(None)
        return self._scrub(touched)

    def _scrub(self, tenants: set[str]) -> bool:
        """Leave no copy of erased text behind: merge the touched tenants' full-text indexes (dropping deleted
        entries from their segments) and checkpoint the WAL so old page images are overwritten; secure_delete
        zeroes freed pages; the tenants' vector files go too. Returns whether the checkpoint is still pending (see
        _checkpoint)."""
        if tenants and self._files is not None:
            self._files.erase(tenants)
        if tenants:
            with self.atomic():
                self._fts.scrub(tenants)
        if getattr(self._local, "depth", 0):
            # Inside a caller's transaction (Shelf.forget_messages, store.atomic()) nothing is committed yet, and
            # a checkpoint copies only what is: atomic() checkpoints when the outermost transaction commits.
            self._local.scrub_at_commit = True
            return True
        return not self._checkpoint(SCRUB_WAIT_MS)

    def _checkpoint(self, wait_ms: int) -> bool:
        """Copy the WAL into the database file and empty it, so no old page image stays in either; True when done.

        It waits at most wait_ms for readers, never the busy timeout: while another connection reads an older
        snapshot (a backup, a shell, another process), SQLite may not overwrite the pages that snapshot sees, so the
        scrub stays pending and this store's next write, erasure or close tries again."""
        if self._memory_db:
            return True
        conn = self._connection()
        self._scrub_tried = time.monotonic()
        self._run(conn, f"PRAGMA busy_timeout = {wait_ms}")
        try:
            with self._checkpointer.lock if self._checkpointer is not None else contextlib.nullcontext():
                done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        except sqlite3.Error as exc:
            error = translate(exc, self.path)
            if not isinstance(error, StoreUnavailable):
                raise error from exc
            done = False
        finally:
            self._run(conn, f"PRAGMA busy_timeout = {self._busy_ms}")
        self._scrub_pending = not done
        return done


def _redigest(conn: sqlite3.Connection) -> None:
    """Recompute every memory's digest with whitespace normalised, oldest first. When two rows of an owner now
    share a digest, the older takes it and the newer keeps its old one: both stay, nothing is merged."""
    after = 0
    while rows := conn.execute("SELECT pk, tenant, user_id, topic, content, digest FROM memories WHERE pk > ?"
                               " ORDER BY pk LIMIT 1000", (after,)).fetchall():
        for pk, tenant, user, topic, content, old in rows:
            new = digest(topic, content)
            if new != old:
                conn.execute("UPDATE memories SET digest = ? WHERE pk = ? AND NOT EXISTS (SELECT 1 FROM memories"
                             " WHERE tenant = ? AND user_id = ? AND digest = ?)", (new, pk, tenant, user, new))
        after = rows[-1][0]


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements; trigger bodies contain semicolons, so use SQLite's own judgement."""
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        if line.strip().startswith("--"):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        raise InvalidInput(f"incomplete SQL in migration: {buffer[:80]!r}")
    return statements

