"""The records half of a SQL store, written once for every SQL backend: facts and their history, messages, API
keys, message pages, and the registry-driven (tables.py) erasure, purge, owner listing and stats.

A backend supplies a small dialect (SQLRecords' abstract members):

- how a statement's parameters are marked (PARAM: `?` for SQLite, `%s` for psycopg); statements here are written
  with `?` and rewritten once by _sql;
- how a time goes in and comes out (_time_in, _time_out): SQLite keeps fixed-width UTC text, PostgreSQL timestamptz;
- where statements run: _owner_scope(tenant), a transaction seeing the owner's tenant (SQLite: atomic() on the
  thread's connection; PostgreSQL: memshelf_app with row-level security set to the tenant), and _admin_scope(), one
  seeing every tenant (PostgreSQL: memshelf_admin). Both yield something with execute(sql, params) that returns a
  cursor with rowcount, fetchone and fetchall, translating the driver's errors into memshelf's;
- LOCK_ROW, what makes a SELECT lock the row it reads until the transaction ends (PostgreSQL's FOR UPDATE; empty on
  SQLite, whose write transactions already hold the file's write lock);
- its memory-and-search half's share of erasure (_remove_memories, _purge_memories) and what erasure leaves to do
  (_erasing inside the transaction: PostgreSQL queues the tables for its scrub; _erased after it commits: SQLite
  merges full-text indexes and checkpoints its WAL).

What stays per backend is what the two dialects cannot say alike: the memories table's indexes (FTS5 tables per
tenant and an in-process vector matrix on SQLite; tsvector, pgvector and HNSW on PostgreSQL), and the conversation
context, which SQLite keeps as text in a full-text column and PostgreSQL as a tsvector built in SQL
(`earlier_turns` is the selection both share).
"""

from __future__ import annotations

import string
from abc import abstractmethod
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, ClassVar, Protocol
from collections.abc import Callable, Iterator, Sequence

from ..model import Fact, FactChange, Memory, Message, Owner, UserSummary
from .base import (CONTEXT_TURNS, EVERY, SAID_AGAIN, ApiKey, Erased, Evidence, Listing, Mark, Position, Store,
                   View)
from .tables import (OWNER_TABLES, OwnerTable, expiring_record_tables, listed_user_tables, owner_listing_sql,
                     record_tables, stats_sql, table)


class Rows(Protocol):
    """What a statement returns: a DB-API cursor (sqlite3's or psycopg's)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Sequence[Any]: ...


class Statements(Protocol):
    """Where the records half runs its statements: execute(sql, params) -> the cursor."""

    def execute(self, query: Any, params: Any = ...) -> Rows: ...


MEMORY_COLUMNS = ("m.id, m.topic, m.content, m.source, m.confidence, m.created_at, m.expires_at, "
                  "m.last_seen, m.observations, m.embed_model, m.superseded_at, m.superseded_by, "
                  "m.confirmed_at, m.confirmed_from")
"""The columns a Memory is read from (table alias m), in memory_from_row's order."""
MEMORY_WIDTH = 14
"""How many columns MEMORY_COLUMNS selects: a query's extra columns come after them."""
MEMORY_CONFIDENCE = MEMORY_COLUMNS.split(", ").index("m.confidence")
"""Where a row read with MEMORY_COLUMNS holds the memory's confidence."""


def short_of_the_answer(rows: Sequence[Sequence], limit: int, by_confidence: bool, most_confident: float) -> bool:
    """Whether a keyword search that ranked only some matches (a common word's newest) may have missed its answer:
    fewer hits than the limit (matches left out may be current), or, ordered by confidence first, a last hit less
    confident than the most confident memory the owner may hold (an older match left out may outrank it). Rows are
    read with MEMORY_COLUMNS."""
    return len(rows) < limit or by_confidence and rows[-1][MEMORY_CONFIDENCE] < most_confident


def memory_from_row(row: Sequence, time_out: Callable[[Any], datetime | None]) -> Memory:
    """A Memory from the first MEMORY_WIDTH columns of a row selected with MEMORY_COLUMNS."""
    return Memory(id=row[0], topic=row[1], content=row[2], source=row[3], confidence=row[4],
                  created_at=time_out(row[5]), expires_at=time_out(row[6]),  # type: ignore[arg-type]
                  last_seen=time_out(row[7]), observations=row[8], embed_model=row[9],
                  superseded_at=time_out(row[10]), superseded_by=row[11], confirmed_at=time_out(row[12]),
                  confirmed_from=row[13])


def view_condition(view: View, time_in: Callable[[datetime | None], Any]) -> tuple[str, tuple]:
    """The SQL condition (on alias m, written with `?`, starting with AND) and parameters of the memories a view
    sees: current ones; those current at as_of; with include_superseded, closed ones too."""
    if view.as_of is None:
        return ("", ()) if view.include_superseded else (" AND m.superseded_at IS NULL", ())
    at = time_in(view.as_of)
    if view.include_superseded:
        return " AND m.created_at <= ?", (at,)
    return " AND m.created_at <= ? AND (m.superseded_at IS NULL OR m.superseded_at > ?)", (at, at)


def earlier_turns(tenant: str, user: str, topic: str, before: str | None, alias: str = "p") -> str:
    """SQL selecting (pk, content) of the CONTEXT_TURNS memories of (tenant, user, topic) with pk below `before`
    (None: all), newest first: the turns a memory's conversation context is made of (the arguments are SQL: a
    placeholder or a column). Oldest first they make the context's text, which each backend keeps its own way."""
    bound = "" if before is None else f" AND {alias}.pk < {before}"
    return (f"SELECT {alias}.pk, {alias}.content FROM memories {alias} WHERE {alias}.tenant = {tenant}"
            f" AND {alias}.user_id = {user} AND {alias}.topic = {topic}{bound}"
            f" ORDER BY {alias}.pk DESC LIMIT {CONTEXT_TURNS}")


def later_turns(columns: str, tenant: str, user: str, topic: str, after: str, alias: str = "n") -> str:
    """SQL selecting `columns` of the CONTEXT_TURNS memories of (tenant, user, topic) with pk above `after`, oldest
    first: the memories whose context a deleted memory (pk `after`) was part of, and which must be rewritten."""
    return (f"SELECT {columns} FROM memories {alias} WHERE {alias}.tenant = {tenant} AND {alias}.user_id = {user}"
            f" AND {alias}.topic = {topic} AND {alias}.pk > {after} ORDER BY {alias}.pk LIMIT {CONTEXT_TURNS}")


def erased_from(counts: dict[str, int], scrub_pending: bool = False) -> Erased:
    """An Erased from rows removed by table name, each counted as its registry entry says."""
    fields = {t.counted_as: counts.get(t.name, 0) for t in OWNER_TABLES if t.counted_as}
    return Erased(**fields, scrub_pending=scrub_pending)


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _like_pattern(contains: str) -> str:
    """A LIKE pattern (escape character `\\`) matching text that contains `contains`, ASCII letters folded to
    lowercase as FOLDED folds the column: `%` and `_` are matched as themselves."""
    folded = contains.translate(_ASCII_LOWER)
    return "%" + folded.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


_COUNTED = (("memories", "created_at", " AND superseded_at IS NULL"), ("facts", "updated_at", ""),
            ("messages", "created_at", ""))
"""What a user summary counts, in UserSummary's order: the table, the column its newest row is dated by, and what
else a counted row must be (a superseded memory is not counted). An expired row never counts."""
_LIVE = " AND (expires_at IS NULL OR expires_at > ?)"
"""What a row of a table with expiry must meet to be live at the instant given."""

_USER = "tenant = ? AND user_id = ?"
_KEY_COLUMNS = "id, tenant, name, created_at, revoked_at"
_FACT_HISTORY_INSERT = ("INSERT INTO fact_history (tenant, user_id, key, value, source, set_at)"
                        " VALUES (?, ?, ?, ?, ?, ?)")
_IDS_PER_STATEMENT = 500
"""Ids asked for in one IN (...) list (SQLite before 3.32 allows 999 parameters in a statement)."""


def _id_lists(ids: Sequence[str]) -> Iterator[tuple[list[str], str]]:
    """The ids in lists of at most _IDS_PER_STATEMENT, each with its placeholders for IN (...)."""
    for start in range(0, len(ids), _IDS_PER_STATEMENT):
        chunk = list(ids[start:start + _IDS_PER_STATEMENT])
        yield chunk, ", ".join("?" * len(chunk))
_MESSAGE_INSERT = ("INSERT INTO messages (id, tenant, user_id, thread, role, content, created_at, expires_at)"
                   " VALUES (?, ?, ?, ?, ?, ?, ?, ?)")


class SQLRecords(Store):
    """Facts, messages, API keys and the admin verbs over any SQL dialect; subclasses write the memory half."""

    PARAM: ClassVar[str] = "?"
    """How the driver marks a parameter."""
    LOCK_ROW: ClassVar[str] = ""
    """Appended to a SELECT that must lock the row it reads until the transaction ends."""
    FOLDED: ClassVar[str] = "lower({})"
    """A text column ({} is its name) with its ASCII letters made lowercase and every other character left as it is:
    how a `contains` filter compares it, alike on every backend (SQLite's lower() folds only ASCII)."""
    DERIVED_TABLES: ClassVar[tuple[str, ...]] = ()
    """Per-owner tables the backend derives from the registry's (not exported, not copied), erased with their
    owner: e.g. SQLite's owner_generation counters."""

    # ------------------------------------------------------------ the dialect
    @abstractmethod
    def _time_in(self, value: datetime | None) -> Any:
        """A time as the driver stores it."""

    @abstractmethod
    def _time_out(self, value: Any) -> Any:
        """A stored time (or NULL) as an aware UTC datetime (or None)."""

    @abstractmethod
    def _owner_scope(self, tenant: str, write: bool = True) -> AbstractContextManager[Statements]:
        """Where statements on the tenant's rows run: a transaction when `write` (a backend may run reads outside
        one, as SQLite does so that a read never waits for the file's write lock)."""

    @abstractmethod
    def _admin_scope(self, write: bool = True) -> AbstractContextManager[Statements]:
        """Where statements on every tenant's rows run, as _owner_scope."""

    @abstractmethod
    def _remove_memories(self, db: Statements, where: str, params: tuple, whole_tenant: str | None
                         ) -> tuple[int, set[str]]:
        """Delete the memories `where` selects (an owner or, with whole_tenant, a tenant), with everything the
        backend keeps of them; returns (how many, the tenants whose search indexes still hold erased text)."""

    @abstractmethod
    def _purge_memories(self, db: Statements, now: datetime) -> tuple[int, set[str]]:
        """Delete the memories expired at `now`, as _remove_memories, keeping later memories' context right."""

    @abstractmethod
    def _delete_memories(self, db: Statements, owner: Owner, ids: Sequence[str]) -> tuple[int, set[str]]:
        """Delete some of the owner's memories by id, as _purge_memories does (context kept right)."""

    def _erasing(self, db: Statements, counts: dict[str, int]) -> None:
        """Inside the erasing transaction, with rows removed by table name."""

    def _erased(self, counts: dict[str, int], touched: set[str], whole_owner: bool) -> bool:
        """After the erasing transaction committed: finish the scrub; returns whether text may still be on disk.
        whole_owner: every record of an owner or tenant went (erase_user, erase_tenant)."""
        return False

    def _sql(self, statement: str) -> str:
        return statement if self.PARAM == "?" else statement.replace("?", self.PARAM)

    def _page_bound(self, table: str, owner: Owner, after: Position | None,
                    by_confidence: bool = False) -> tuple[str, tuple]:
        """The WHERE condition (on alias m) and parameters of a page that starts after `after`: older instants, or
        the same instant and a lower row key than the record `after` names (every row of that instant if it is
        gone); by_confidence, all that after lower confidences first. Already in the dialect's placeholders."""
        if after is None:
            return "", ()
        stamp = self._time_in(after.created_at)
        older = (f"m.created_at < ? OR (m.created_at = ? AND m.pk < coalesce((SELECT a.pk FROM {table} a"
                 " WHERE a.tenant = ? AND a.user_id = ? AND a.id = ?), 9223372036854775807))")
        params: tuple = (stamp, stamp, owner.tenant, owner.user, after.id)
        if by_confidence:
            older = f"m.confidence < ? OR (m.confidence = ? AND ({older}))"
            params = (after.confidence, after.confidence, *params)
        return self._sql(f" AND ({older})"), params

    # ------------------------------------------------------------ memories: the listing and the user's fixes
    def page_memories(self, owner: Owner, after: Position | None, limit: int, now: datetime,
                      listing: Listing = EVERY) -> list[Memory]:
        where = "m.tenant = ? AND m.user_id = ? AND (m.expires_at IS NULL OR m.expires_at > ?)"
        params: tuple = (owner.tenant, owner.user, self._time_in(now))
        if not listing.include_superseded:
            where += " AND m.superseded_at IS NULL"
        for column, value in (("topic", listing.topic), ("source", listing.source)):
            if value is not None:
                where, params = where + f" AND m.{column} = ?", params + (value,)
        if listing.contains:
            pattern = _like_pattern(listing.contains)
            where += (f" AND ({self.FOLDED.format('m.content')} LIKE ? ESCAPE '\\'"
                      f" OR {self.FOLDED.format('m.topic')} LIKE ? ESCAPE '\\')")
            params += (pattern, pattern)
        bound, anchor = self._page_bound("memories", owner, after, listing.by_confidence)
        order = "m.confidence DESC, m.created_at DESC, m.pk DESC" if listing.by_confidence else \
            "m.created_at DESC, m.pk DESC"
        with self._owner_scope(owner.tenant, write=False) as db:
            rows = db.execute(self._sql(f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE {where}") + bound
                              + self._sql(f" ORDER BY {order} LIMIT ?"),
                              params + anchor + (min(limit, 2**62),)).fetchall()
        return [memory_from_row(r, self._time_out) for r in rows]

    def confirm_memory(self, owner: Owner, memory_id: str, source: str, confidence: float,
                       now: datetime) -> Memory | None:
        at = self._time_in(now)
        return self._update_memory("confirmed_from = source, confirmed_at = ?, source = ?, confidence = ?",
                                   (at, source, confidence), owner, memory_id, at, " AND superseded_at IS NULL")

    def set_memory_expiry(self, owner: Owner, memory_id: str, expires_at: datetime | None,
                          now: datetime) -> Memory | None:
        return self._update_memory("expires_at = ?", (self._time_in(expires_at),), owner, memory_id,
                                   self._time_in(now))

    def _update_memory(self, change: str, values: tuple, owner: Owner, memory_id: str, at: Any,
                       also: str = "") -> Memory | None:
        """Change one live memory of the owner (and what `also` requires of it); the row as it is after."""
        with self._owner_scope(owner.tenant) as db:
            changed = db.execute(self._sql(f"UPDATE memories SET {change} WHERE {_USER} AND id = ?{_LIVE}{also}"),
                                 values + (owner.tenant, owner.user, memory_id, at)).rowcount
            if not changed:
                return None
            row = db.execute(self._sql(f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE m.tenant = ?"
                                       " AND m.user_id = ? AND m.id = ?"),
                             (owner.tenant, owner.user, memory_id)).fetchone()
        return memory_from_row(row, self._time_out)

    # ------------------------------------------------------------ facts
    def set_fact(self, owner: Owner, key: str, value: str, source: str, now: datetime,
                 replaces: Callable[[str], bool] = lambda current_source: True) -> Fact:
        """Insert the fact, or lock its current row and replace it only if `replaces` allows, so two concurrent
        writers cannot both decide against a value neither of them saw. The value is stamped `now`, or later when
        another value of the key holds that instant (_free_instant): the returned Fact, or its `outranked`, says."""
        with self._owner_scope(owner.tenant) as db:
            now = self._free_instant(db, owner, key, now)
            at = self._time_in(now)
            db.execute(self._sql(_FACT_HISTORY_INSERT), (owner.tenant, owner.user, key, value, source, at))
            if db.execute(self._sql("INSERT INTO facts VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"),
                          (owner.tenant, owner.user, key, value, source, at)).rowcount:
                return Fact(key, value, source, now)
            row = db.execute(self._sql(f"SELECT value, source, updated_at FROM facts WHERE {_USER} AND key = ?"
                                       + self.LOCK_ROW), (owner.tenant, owner.user, key)).fetchone()
            if row is not None and not replaces(row[1]):
                return Fact(key, row[0], row[1], self._time_out(row[2]), outranked=FactChange(key, value, source, now))
            db.execute(self._sql(f"UPDATE facts SET value = ?, source = ?, updated_at = ? WHERE {_USER} AND key = ?"),
                       (value, source, at, owner.tenant, owner.user, key))
        return Fact(key, value, source, now)

    def _free_instant(self, db: Statements, owner: Owner, key: str, now: datetime) -> datetime:
        """`now`, unless a value of the key was set at that very instant (a clock that did not move between calls,
        as a coarse one may not): then a microsecond after the key's latest value, so that the history keeps the
        order values were set in. Evidence names the value it taught by its instant, and two values in one were
        one value to forget_thread, which erased the caller's with the taught. An instant no value holds is kept,
        even before later ones: an import writes values at the instants they were set."""
        taken = [row[0] for row in db.execute(self._sql(
            f"SELECT set_at FROM fact_history WHERE {_USER} AND key = ? AND set_at >= ?"),
            (owner.tenant, owner.user, key, self._time_in(now))).fetchall()]
        if self._time_in(now) not in taken:
            return now
        return self._time_out(max(taken)) + timedelta(microseconds=1)

    def facts(self, owner: Owner) -> list[Fact]:
        with self._owner_scope(owner.tenant, write=False) as db:
            rows = db.execute(self._sql(f"SELECT key, value, source, updated_at FROM facts WHERE {_USER}"
                                        " ORDER BY updated_at DESC, key"), (owner.tenant, owner.user)).fetchall()
        return [Fact(r[0], r[1], r[2], self._time_out(r[3])) for r in rows]

    def fact_history(self, owner: Owner, key: str | None) -> list[FactChange]:
        query = f"SELECT key, value, source, set_at FROM fact_history WHERE {_USER}"
        params: tuple = (owner.tenant, owner.user)
        if key is not None:
            query += " AND key = ?"
            params += (key,)
        with self._owner_scope(owner.tenant, write=False) as db:
            rows = db.execute(self._sql(query + " ORDER BY pk"), params).fetchall()
        return [FactChange(r[0], r[1], r[2], self._time_out(r[3])) for r in rows]

    def delete_fact(self, owner: Owner, key: str) -> bool:
        where = self._sql(f"WHERE {_USER} AND key = ?")
        with self._owner_scope(owner.tenant) as db:
            counts = {table: db.execute(f"DELETE FROM {table} {where}", (owner.tenant, owner.user, key)).rowcount
                      for table in ("facts", "fact_history")}
            counts["learned_from"] = self._drop_evidence(db, owner, "fact", [key])
            self._erasing(db, counts)
        if any(counts.values()):
            self._erased(counts, set(), whole_owner=False)  # the key and its values leave the files too
        return counts["facts"] > 0

    def import_facts(self, owner: Owner, facts: Sequence[Fact], changes: Sequence[FactChange]) -> int:
        added = 0
        with self._owner_scope(owner.tenant) as db:
            for change in changes:
                db.execute(self._sql(_FACT_HISTORY_INSERT), (owner.tenant, owner.user, change.key, change.value,
                                                             change.source, self._time_in(change.set_at)))
            for fact in facts:
                added += db.execute(self._sql("INSERT INTO facts VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"),
                                    (owner.tenant, owner.user, fact.key, fact.value, fact.source,
                                     self._time_in(fact.updated_at))).rowcount
        return added

    # ------------------------------------------------------------ messages
    def _message_values(self, owner: Owner, m: Message) -> tuple:
        return (m.id, owner.tenant, owner.user, m.thread, m.role, m.content, self._time_in(m.created_at),
                self._time_in(m.expires_at))

    def add_message(self, owner: Owner, message: Message) -> Message:
        with self._owner_scope(owner.tenant) as db:
            db.execute(self._sql(_MESSAGE_INSERT), self._message_values(owner, message))
        return message

    def page_messages(self, owner: Owner, thread: str | None, after: Position | None, limit: int,
                      now: datetime | None) -> list[Message]:
        bound, anchor = self._page_bound("messages", owner, after)
        query = self._sql(f"SELECT id, thread, role, content, created_at, expires_at FROM messages m WHERE {_USER}")
        params: tuple = (owner.tenant, owner.user, *anchor)
        query += bound
        if thread is not None:  # spelled out, not `? IS NULL OR ...`, so the thread index stays usable
            query += self._sql(" AND thread = ?")
            params += (thread,)
        if now is not None:
            query += self._sql(" AND (expires_at IS NULL OR expires_at > ?)")
            params += (self._time_in(now),)
        with self._owner_scope(owner.tenant, write=False) as db:
            rows = db.execute(query + self._sql(" ORDER BY created_at DESC, pk DESC LIMIT ?"),
                              params + (min(limit, 2**62),)).fetchall()
        return [Message(r[0], r[1], r[2], r[3], self._time_out(r[4]), self._time_out(r[5])) for r in rows]

    def import_messages(self, owner: Owner, messages: Sequence[Message]) -> int:
        added = 0
        with self._owner_scope(owner.tenant) as db:
            for m in messages:
                added += db.execute(self._sql(_MESSAGE_INSERT + " ON CONFLICT DO NOTHING"),
                                    self._message_values(owner, m)).rowcount
        return added

    # ------------------------------------------------------------ learning: watermarks and evidence
    def learn_mark(self, owner: Owner, thread: str) -> Mark | None:
        with self._owner_scope(owner.tenant, write=False) as db:
            row = db.execute(self._sql(f"SELECT message_id, said_at FROM learn_marks WHERE {_USER} AND thread = ?"),
                             (owner.tenant, owner.user, thread)).fetchone()
        return None if row is None else Mark(row[0], self._time_out(row[1]))

    def learn_marks(self, owner: Owner) -> dict[str, Mark]:
        with self._owner_scope(owner.tenant, write=False) as db:
            rows = db.execute(self._sql(f"SELECT thread, message_id, said_at FROM learn_marks WHERE {_USER}"),
                              (owner.tenant, owner.user)).fetchall()
        return {r[0]: Mark(r[1], self._time_out(r[2])) for r in rows}

    def set_learn_mark(self, owner: Owner, thread: str, mark: Mark, now: datetime) -> None:
        with self._owner_scope(owner.tenant) as db:
            db.execute(self._sql("INSERT INTO learn_marks VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, user_id,"
                                 " thread) DO UPDATE SET message_id = excluded.message_id, said_at = excluded.said_at,"
                                 " updated_at = excluded.updated_at"),
                       (owner.tenant, owner.user, thread, mark.message_id, self._time_in(mark.said_at),
                        self._time_in(now)))

    def lock_messages(self, owner: Owner, ids: Sequence[str]) -> int:
        with self._owner_scope(owner.tenant) as db:
            return sum(self._hold_messages(db, self._sql(f"{_USER} AND id IN ({marks})"),
                                           (owner.tenant, owner.user, *chunk), always=True)
                       for chunk, marks in _id_lists(ids))

    def _hold_messages(self, db: Statements, where: str, params: tuple, always: bool = False) -> int:
        """How many messages `where` selects, locked until the transaction ends where a SELECT can lock rows
        (LOCK_ROW): an erasure takes them before anything else, so that a learn holding them (lock_messages)
        finishes first and everything it wrote is then erased, and a learn that comes second finds them gone.
        Where transactions hold one write lock (SQLite) there is nothing to take, and nothing is read unless
        `always`."""
        if not (self.LOCK_ROW or always):
            return 0
        return int(db.execute(f"SELECT count(*) FROM (SELECT 1 FROM messages WHERE {where} ORDER BY pk"
                              f"{self.LOCK_ROW}) held", params).fetchone()[0])

    def move_learn_mark(self, owner: Owner, thread: str, was: Mark | None, mark: Mark, now: datetime) -> bool:
        """Compared in the write: an insert that finds a watermark, or an update that finds another one (on
        PostgreSQL, after waiting for the transaction that wrote it), changes no row."""
        values = (mark.message_id, self._time_in(mark.said_at), self._time_in(now))
        with self._owner_scope(owner.tenant) as db:
            if was is None:
                return db.execute(self._sql("INSERT INTO learn_marks VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant,"
                                            " user_id, thread) DO NOTHING"),
                                  (owner.tenant, owner.user, thread, *values)).rowcount == 1
            return db.execute(self._sql(f"UPDATE learn_marks SET message_id = ?, said_at = ?, updated_at = ? WHERE"
                                        f" {_USER} AND thread = ? AND message_id = ? AND said_at = ?"),
                              (*values, owner.tenant, owner.user, thread, was.message_id,
                               self._time_in(was.said_at))).rowcount == 1

    def _thread_lock(self, db: Statements, owner: Owner, thread: str, shared: bool) -> None:
        """Where transactions run side by side (PostgreSQL overrides this), the lock between logging turns to a
        thread (shared) and reading it to learn (exclusive); SQLite's writers already hold the file's one lock."""

    def messages_after(self, owner: Owner, thread: str, mark: Mark | None, limit: int,
                       now: datetime) -> list[Message]:
        """Ordered as pages are, oldest first: (created_at, row key). Messages said in the mark's own instant come
        after it by row key; if the marked message is gone, all of that instant's are read again (never skipped)."""
        query = (f"SELECT id, thread, role, content, created_at, expires_at FROM messages m WHERE {_USER}"
                 " AND thread = ? AND (expires_at IS NULL OR expires_at > ?)")
        params: tuple = (owner.tenant, owner.user, thread, self._time_in(now))
        if mark is not None:
            stamp = self._time_in(mark.said_at)
            query += (" AND (m.created_at > ? OR (m.created_at = ? AND m.pk > coalesce((SELECT a.pk FROM messages a"
                      " WHERE a.tenant = ? AND a.user_id = ? AND a.id = ?), 0)))")
            params += (stamp, stamp, owner.tenant, owner.user, mark.message_id)
        with self._owner_scope(owner.tenant, write=False) as db:
            self._thread_lock(db, owner, thread, shared=False)  # turns being logged are stored first
            rows = db.execute(self._sql(query + " ORDER BY created_at, pk LIMIT ?"),
                              params + (min(limit, 2**62),)).fetchall()
        return [Message(r[0], r[1], r[2], r[3], self._time_out(r[4]), self._time_out(r[5])) for r in rows]

    def add_evidence(self, owner: Owner, rows: Sequence[Evidence]) -> None:
        with self._owner_scope(owner.tenant) as db:
            for e in rows:
                db.execute(self._sql("INSERT INTO learned_from (tenant, user_id, kind, record, message_id, thread,"
                                     " said_at, set_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
                           (owner.tenant, owner.user, e.kind, e.record, e.message_id, e.thread,
                            self._time_in(e.said_at), self._time_in(e.set_at)))

    def evidence(self, owner: Owner, kind: str | None, record: str | None) -> list[Evidence]:
        query = f"SELECT kind, record, message_id, thread, said_at, set_at FROM learned_from WHERE {_USER}"
        params: tuple = (owner.tenant, owner.user)
        if kind is not None:
            query += " AND kind = ? AND record = ?"
            params += (kind, record)
        with self._owner_scope(owner.tenant, write=False) as db:
            rows = db.execute(self._sql(query + " ORDER BY pk"), params).fetchall()
        return [Evidence(r[0], r[1], r[2], r[3], self._time_out(r[4]), self._time_out(r[5])) for r in rows]

    def drop_evidence(self, owner: Owner, kind: str, records: Sequence[str]) -> int:
        with self._owner_scope(owner.tenant) as db:
            return self._drop_evidence(db, owner, kind, records)

    def _drop_evidence(self, db: Statements, owner: Owner, kind: str, records: Sequence[str]) -> int:
        """Delete the evidence of these records; returns how many rows."""
        gone = 0
        for chunk, marks in _id_lists(records):
            gone += db.execute(self._sql(f"DELETE FROM learned_from WHERE {_USER} AND kind = ? AND record IN"
                                         f" ({marks})"), (owner.tenant, owner.user, kind, *chunk)).rowcount
        return gone

    def _hand_back_places(self, db: Statements, owner: Owner, ids: Sequence[str]) -> int:
        """Before the owner's memories `ids` are erased: a memory that one of them superseded takes the place the
        erased one held, as though it had never been written: current again if the erased one was current, else
        closed by what closed the erased one, at that instant (a chain of erased memories is followed to its end).
        So no erased id stays in another row, and erasing a learned memory gives back the one it replaced, as a
        fact's earlier value comes back. Returns how many memories were changed."""
        gone: dict[str, tuple[Any, Any]] = dict.fromkeys(ids, (None, None))  # one purged already closes nothing
        replaced: list[tuple[str, str | None]] = []
        for chunk, marks in _id_lists(ids):
            gone.update((row[0], (row[1], row[2])) for row in db.execute(self._sql(
                f"SELECT id, superseded_by, superseded_at FROM memories WHERE {_USER} AND id IN ({marks})"),
                (owner.tenant, owner.user, *chunk)).fetchall())
            replaced += [(row[0], row[1]) for row in db.execute(self._sql(
                f"SELECT id, superseded_by FROM memories WHERE {_USER} AND superseded_at IS NOT NULL"
                f" AND superseded_by IN ({marks})"), (owner.tenant, owner.user, *chunk)).fetchall()]
        changed = 0
        for memory_id, successor in replaced:
            if memory_id in gone:
                continue
            seen: set[str] = set()
            closed_by: str | None = successor
            closed_at: Any = None
            while closed_by in gone and closed_by not in seen:
                seen.add(closed_by)
                closed_by, closed_at = gone[closed_by]
            if closed_by in gone or closed_by == memory_id:  # a cycle: nothing else is left to close it
                closed_by = closed_at = None
            changed += db.execute(self._sql(f"UPDATE memories SET superseded_by = ?, superseded_at = ?"
                                            f" WHERE {_USER} AND id = ?"),
                                  (closed_by, closed_at, owner.tenant, owner.user, memory_id)).rowcount
        return changed

    def _forget_learned_fact(self, db: Statements, owner: Owner, thread: str, key: str,
                             outranks: Callable[[str, str], bool] | None) -> tuple[int, int, int]:
        """Erase the values of fact `key` that only the thread's evidence names (history rows, by set_at: a value
        another thread taught or said again stays with it), and its current value if it is one of them: the fact
        then holds what its remaining history gives, replayed by time with set_fact's rule, or goes when none
        remains. A value the caller set, before or after, stays. Evidence written before set_at was kept (None) or
        that said a value again without naming it (SAID_AGAIN) names no value: in the thread, the fact goes whole
        when no other thread has evidence of it; in another thread, it may hold any value, and nothing goes.
        Returns (facts rows deleted, history rows deleted, facts rows rewritten)."""
        params = (owner.tenant, owner.user, key)
        cited = db.execute(self._sql(f"SELECT thread, set_at FROM learned_from WHERE {_USER} AND kind = 'fact'"
                                     " AND record = ?"), params).fetchall()
        here = {row[1] for row in cited if row[0] == thread}
        elsewhere = {row[1] for row in cited if row[0] != thread}
        unnamed = {None, self._time_in(SAID_AGAIN)}
        if elsewhere & unnamed or (here <= {None} and elsewhere):
            return 0, 0, 0
        if here <= {None}:
            gone = [db.execute(self._sql(f"DELETE FROM {table} WHERE {_USER} AND key = ?"), params).rowcount
                    for table in ("facts", "fact_history")]
            return gone[0], gone[1], 0
        taught = here - unnamed - elsewhere
        history = db.execute(self._sql(f"SELECT pk, value, source, set_at FROM fact_history WHERE {_USER}"
                                       " AND key = ? ORDER BY set_at, pk"), params).fetchall()
        learned = [row[0] for row in history if row[3] in taught]
        for pk in learned:
            db.execute(self._sql("DELETE FROM fact_history WHERE pk = ?"), (pk,))
        current = db.execute(self._sql(f"SELECT updated_at FROM facts WHERE {_USER} AND key = ?"), params).fetchone()
        if current is None or current[0] not in taught:
            return 0, len(learned), 0
        held = None
        for row in (row for row in history if row[3] not in taught):
            if held is None or (outranks(row[2], held[2]) if outranks else True):
                held = row
        if held is None:
            deleted = db.execute(self._sql(f"DELETE FROM facts WHERE {_USER} AND key = ?"), params).rowcount
            return deleted, len(learned), 0
        db.execute(self._sql(f"UPDATE facts SET value = ?, source = ?, updated_at = ? WHERE {_USER} AND key = ?"),
                   (held[1], held[2], held[3], *params))
        return 0, len(learned), 1

    def _learned_in(self, db: Statements, owner: Owner, thread: str, kind: str, only: bool) -> list[str]:
        """The records of a kind with evidence in the thread; with only, those whose every evidence row is there."""
        query = f"SELECT DISTINCT record FROM learned_from WHERE {_USER} AND kind = ? AND thread = ?"
        params: tuple = (owner.tenant, owner.user, kind, thread)
        if only:
            query += (" AND record NOT IN (SELECT o.record FROM learned_from o WHERE o.tenant = ? AND o.user_id = ?"
                      " AND o.kind = ? AND (o.thread IS NULL OR o.thread <> ?))")
            params += params
        rows = db.execute(self._sql(query + " ORDER BY record"), params).fetchall()
        return [r[0] for r in rows]

    def delete_message(self, owner: Owner, message_id: str) -> Erased:
        counts: dict[str, int] = {}
        with self._owner_scope(owner.tenant) as db:
            for table, column in (("messages", "id"), ("learned_from", "message_id")):
                counts[table] = db.execute(self._sql(f"DELETE FROM {table} WHERE {_USER} AND {column} = ?"),
                                           (owner.tenant, owner.user, message_id)).rowcount
                if not counts["messages"]:
                    break
            self._erasing(db, counts)
        pending = self._erased(counts, set(), whole_owner=False) if counts["messages"] else self.scrub_pending
        return erased_from(counts, scrub_pending=pending)

    def forget_thread(self, owner: Owner, thread: str, cascade: bool,
                      outranks: Callable[[str, str], bool] | None = None) -> Erased:
        """One transaction: what was learned only from the thread (with cascade), then the thread's evidence,
        watermark and messages. outranks(new, held): whether a value from source `new` replaces one from `held`
        (set_fact's rule, the Shelf's sources), to find a fact's value once the learned ones are gone; without it,
        the latest remaining value."""
        user_thread = self._sql(f"WHERE {_USER} AND thread = ?")
        params = (owner.tenant, owner.user, thread)
        counts: dict[str, int] = {}
        touched: set[str] = set()
        rewrites = 0  # facts whose current value was replaced by an older one: its old text is to be scrubbed
        with self._owner_scope(owner.tenant) as db:
            self._hold_messages(db, self._sql(f"{_USER} AND thread = ?"), params)
            if cascade:
                memories = self._learned_in(db, owner, thread, "memory", only=True)
                self._hand_back_places(db, owner, memories)
                counts["memories"], touched = self._delete_memories(db, owner, memories) if memories else (0, set())
                counts["facts"] = counts["fact_history"] = 0
                emptied = []  # facts erased whole: their evidence in other threads goes too
                for key in self._learned_in(db, owner, thread, "fact", only=False):
                    gone_fact, gone_changes, rewritten = self._forget_learned_fact(db, owner, thread, key, outranks)
                    counts["facts"] += gone_fact
                    counts["fact_history"] += gone_changes
                    rewrites += rewritten
                    emptied += [key] if gone_fact else []
                counts["learned_from"] = (self._drop_evidence(db, owner, "memory", memories)
                                          + self._drop_evidence(db, owner, "fact", emptied))
            for table in ("learned_from", "learn_marks", "messages"):
                counts[table] = counts.get(table, 0) + db.execute(f"DELETE FROM {table} {user_thread}",
                                                                  params).rowcount
            scrubbed = {**counts, "facts": counts.get("facts", 0) + rewrites}
            self._erasing(db, scrubbed)
        pending = self._erased(scrubbed, touched, whole_owner=False) if any(scrubbed.values()) else self.scrub_pending
        return erased_from(counts, scrub_pending=pending)

    # ------------------------------------------------------------ API keys (admin: a key names its tenant)
    def _key(self, row: Sequence) -> ApiKey:
        return ApiKey(row[0], row[1], row[2], self._time_out(row[3]), self._time_out(row[4]))

    def add_key(self, key: ApiKey, secret_hash: str) -> None:
        with self._admin_scope() as db:
            db.execute(self._sql("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)"),
                       (key.id, key.tenant, key.name, secret_hash, self._time_in(key.created_at)))

    def key_by_hash(self, secret_hash: str) -> ApiKey | None:
        with self._admin_scope(write=False) as db:
            row = db.execute(self._sql(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE secret_hash = ?"
                                       " AND revoked_at IS NULL"), (secret_hash,)).fetchone()
        return None if row is None else self._key(row)

    def list_keys(self, tenant: str | None) -> list[ApiKey]:
        where = self._sql(" WHERE tenant = ?") if tenant is not None else ""
        with self._admin_scope(write=False) as db:
            rows = db.execute(f"SELECT {_KEY_COLUMNS} FROM api_keys{where} ORDER BY created_at, id",
                              (tenant,) if tenant is not None else ()).fetchall()
        return [self._key(r) for r in rows]

    def api_keys(self) -> list[tuple[ApiKey, str]]:
        with self._admin_scope(write=False) as db:
            rows = db.execute(f"SELECT {_KEY_COLUMNS}, secret_hash FROM api_keys ORDER BY created_at, id").fetchall()
        return [(self._key(r), r[5]) for r in rows]

    def revoke_key(self, key_id: str, now: datetime) -> bool:
        with self._admin_scope() as db:
            return db.execute(self._sql("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL"),
                              (self._time_in(now), key_id)).rowcount > 0

    def revoke_tenant_keys(self, tenant: str, now: datetime) -> int:
        with self._admin_scope() as db:
            return db.execute(self._sql("UPDATE api_keys SET revoked_at = ? WHERE tenant = ? AND revoked_at IS NULL"),
                              (self._time_in(now), tenant)).rowcount

    # ------------------------------------------------------------ admin: erasure, purge, owners, stats
    def erase_user(self, owner: Owner) -> Erased:
        return self._erase(owner.tenant, _USER, (owner.tenant, owner.user), whole_tenant=None)

    def erase_tenant(self, tenant: str) -> Erased:
        return self._erase(tenant, "tenant = ?", (tenant,), whole_tenant=tenant)

    def _erase(self, tenant: str, where: str, params: tuple, whole_tenant: str | None) -> Erased:
        """Delete every row `where` selects from every erased table of the registry, and the backend's derived
        tables; the memories through the memory half, which also drops what it indexed them by."""
        where = self._sql(where)
        with self._owner_scope(tenant) as db:
            self._hold_messages(db, where, params)
            memories, touched = self._remove_memories(db, where, params, whole_tenant)
            counts = {"memories": memories}
            for entry in record_tables():
                counts[entry.name] = db.execute(f"DELETE FROM {entry.name} WHERE {where}", params).rowcount
            for derived in self.DERIVED_TABLES:
                db.execute(f"DELETE FROM {derived} WHERE {where}", params)
            self._erasing(db, counts)
        return erased_from(counts, scrub_pending=self._erased(counts, touched, whole_owner=True))

    def purge_expired(self, now: datetime) -> Erased:
        expired = self._sql("expires_at IS NOT NULL AND expires_at <= ?")
        with self._admin_scope() as db:
            memories, touched = self._purge_memories(db, now)
            counts = {"memories": memories}
            for entry in expiring_record_tables():
                counts[entry.name] = db.execute(f"DELETE FROM {entry.name} WHERE {expired}",
                                                (self._time_in(now),)).rowcount
            self._erasing(db, counts)
        pending = self._erased(counts, touched, whole_owner=False) if any(counts.values()) else self.scrub_pending
        return erased_from(counts, scrub_pending=pending)

    def owners(self) -> list[Owner]:
        with self._admin_scope(write=False) as db:
            rows = db.execute(owner_listing_sql()).fetchall()
        return [Owner.stored(r[0], r[1]) for r in rows]

    def page_users(self, tenant: str, after: str | None, limit: int, contains: str | None,
                   now: datetime) -> list[UserSummary]:
        """One statement in the tenant's scope: the page's users (_listed_users), each counted (_counts_of_listed)."""
        at = self._time_in(now)
        listed, listed_params = self._listed_users(tenant, after, limit, contains, at)
        columns, joins, counted_params = self._counts_of_listed(tenant, at)
        query = f"WITH listed AS ({listed}) SELECT p.user_id, {columns} FROM listed p{joins} ORDER BY p.user_id"
        with self._owner_scope(tenant, write=False) as db:
            rows = db.execute(self._sql(query), (*listed_params, *counted_params)).fetchall()
        return [self._summary(row) for row in rows]

    def _listed_users(self, tenant: str, after: str | None, limit: int, contains: str | None,
                      at: Any) -> tuple[str, list[Any]]:
        """SQL (with `?`) selecting the page's user ids, and its parameters: each listed table gives its first
        `limit` users past `after` with a live row that matches the filter (so an index on (tenant, user_id) serves
        every page), and the first `limit` of them all are the page."""
        selects, params = [], []
        for n, entry in enumerate(listed_user_tables()):
            where, more = self._listed_where(entry, after, contains, at)
            selects.append(f"SELECT user_id FROM (SELECT DISTINCT user_id FROM {entry.name} WHERE tenant = ?{where}"
                           f" ORDER BY user_id LIMIT ?) AS l{n}")
            params += [tenant, *more, limit]
        return f"SELECT user_id FROM ({' UNION '.join(selects)}) AS u ORDER BY user_id LIMIT ?", params + [limit]

    def _listed_where(self, entry: OwnerTable, after: str | None, contains: str | None,
                      at: Any) -> tuple[str, list[Any]]:
        """The conditions (with `?`, each starting with AND) and parameters a table's row must meet to list its
        user on this page: past `after`, not expired, and matching the filter."""
        where, params = "", []
        if after is not None:
            where, params = " AND user_id > ?", [after]
        if entry.expires:
            where, params = where + _LIVE, params + [at]
        if contains:
            folded = self.FOLDED.format("user_id")
            where, params = where + f" AND {folded} LIKE ? ESCAPE '\\'", params + [_like_pattern(contains)]
        return where, params

    @staticmethod
    def _counts_of_listed(tenant: str, at: Any) -> tuple[str, str, list[Any]]:
        """The columns (each counted table's count and newest time), the joins that make them for the users of
        `listed`, and the joins' parameters."""
        columns, joins, params = [], "", []
        for n, (name, dated, also) in enumerate(_COUNTED):
            live = _LIVE if table(name).expires else ""
            joins += (f" LEFT JOIN (SELECT user_id, count(*) AS n, max({dated}) AS newest FROM {name} WHERE tenant = ?"
                      f" AND user_id IN (SELECT user_id FROM listed){also}{live} GROUP BY user_id) AS c{n}"
                      f" ON c{n}.user_id = p.user_id")
            columns.append(f"coalesce(c{n}.n, 0), c{n}.newest")
            params += [tenant, *([at] if live else [])]
        return ", ".join(columns), joins, params

    def _summary(self, row: Sequence) -> UserSummary:
        """A UserSummary from (user, then a count and a newest time per counted table)."""
        newest = [self._time_out(value) for value in row[2::2] if value is not None]
        return UserSummary(row[0], row[1], row[3], row[5], max(newest, default=None))

    def stats(self) -> dict[str, int]:
        query, names = stats_sql()
        with self._admin_scope(write=False) as db:
            row = db.execute(query).fetchone()
        return dict(zip(names, row))
