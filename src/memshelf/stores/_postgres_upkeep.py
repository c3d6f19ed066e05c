"""Work on memshelf's PostgreSQL tables that no request waits for: building the vector indexes of the models a
store serves (CREATE INDEX CONCURRENTLY), and scrubbing erased rows off disk (VACUUM, REINDEX CONCURRENTLY,
CHECKPOINT).

A request only queues work. One daemon thread per store does it, each job on a fresh autocommit connection of the
login role (the tables' owner). Across stores and processes memshelf's DDL is serialized by a session advisory
lock taken with pg_try_advisory_lock in a polling loop: a blocking wait could deadlock, because CREATE INDEX
CONCURRENTLY waits for every older snapshot, including that of a session queued on the lock.

Erasures are queued in the table memshelf_scrub (migration m006) inside the erasing transaction, so a scrub
still pending when a process stops is done by the next store that opens the database.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial

import psycopg
from psycopg import sql

from ..errors import ConfigError, StoreError

log = logging.getLogger("memshelf")

DDL_LOCK = 7_406_931_214_886_052_102
"""Key of the session advisory lock held while memshelf builds indexes or scrubs (MIGRATION_LOCK + 1)."""
POLL_SECONDS = 0.2
RETRY_SECONDS = 30.0
"""How long a failed background build or scrub waits before it is tried again."""
SCRUB_MODES = ("vacuum", "full", "off")
SCRUB_DELAY = 60.0
"""Seconds between an erasure and the background scrub, so that erasures arriving together share one scrub."""

Pair = tuple[str, int]
"""An embedding model and its dimensions: the unit that gets vector indexes."""
Statements = Callable[[str, int, bool], list[tuple[str, sql.Composed]]]
"""(model, dimensions, concurrently) -> each index the pair gets: (name, CREATE INDEX ... IF NOT EXISTS)."""


def scrub_settings() -> tuple[str, float]:
    """MEMSHELF_PG_SCRUB (vacuum, full or off; default vacuum) and MEMSHELF_PG_SCRUB_DELAY (seconds, default 60)."""
    mode = os.environ.get("MEMSHELF_PG_SCRUB", "vacuum").strip().lower()
    if mode not in SCRUB_MODES:
        raise ConfigError(f"MEMSHELF_PG_SCRUB must be one of {', '.join(SCRUB_MODES)}, got {mode!r}")
    text = os.environ.get("MEMSHELF_PG_SCRUB_DELAY", str(SCRUB_DELAY))
    try:
        delay = float(text)
    except ValueError:
        delay = -1.0
    if not 0 <= delay <= 86_400:
        raise ConfigError(f"MEMSHELF_PG_SCRUB_DELAY must be a number of seconds from 0 to 86400, got {text!r}")
    return mode, delay


class Upkeep:
    """The background builder and scrubber of one store."""

    def __init__(self, connect: Callable[[], psycopg.Connection], statements: Statements, *, mode: str,
                 delay: float) -> None:
        self._connect = connect
        self._statements = statements
        self.mode = mode
        self.delay = delay
        self._cond = threading.Condition()
        self._builds: dict[Pair, float] = {}  # pair -> when it may be tried (monotonic), in queue order
        self._scrub_at: float | None = None
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._running: psycopg.Connection | None = None

    # ------------------------------------------------------------ what requests call
    def build(self, pairs: Iterable[Pair]) -> None:
        """Queue concurrent builds of the pairs' indexes; returns at once."""
        with self._cond:
            for pair in pairs:
                self._builds.setdefault(pair, 0.0)
            self._wake()

    def erased(self) -> None:
        """Rows were erased (and queued in memshelf_scrub): scrub within `delay` seconds, unless scrubbing is off."""
        if self.mode == "off":
            return
        with self._cond:
            if self._scrub_at is None:
                self._scrub_at = time.monotonic() + self.delay
            self._wake()

    def wait(self, timeout: float) -> bool:
        """Until every queued build is done (True) or `timeout` seconds passed (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._builds and not self._busy, timeout)

    def close(self) -> None:
        """Stop the thread; a build in progress is cancelled (it leaves an INVALID index, which the next build of
        that pair drops and makes again)."""
        with self._cond:
            self._closing = True
            running, thread = self._running, self._thread
            self._cond.notify_all()
        if running is not None:
            running.cancel_safe()
        if thread is not None:
            thread.join()

    def _wake(self) -> None:
        if self._thread is None and not self._closing:
            self._thread = threading.Thread(target=self._run, name="memshelf-pg-upkeep", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            try:
                job()
            except (psycopg.Error, StoreError) as exc:
                if self._closing:
                    return
                log.warning("memshelf PostgreSQL upkeep failed, retrying in %.0f s: %s", RETRY_SECONDS, exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _next_job(self) -> Callable[[], object] | None:
        """Wait for the next due job and mark the upkeep busy; None when closing."""
        with self._cond:
            while not self._closing:
                now = time.monotonic()
                due = [pair for pair, at in self._builds.items() if at <= now]
                if due:
                    pair = due[0]
                    self._builds[pair] = now + RETRY_SECONDS  # stays queued until built: a failure retries later
                    self._busy = True
                    return partial(self._build_in_background, pair)
                if self._scrub_at is not None and self._scrub_at <= now:
                    self._scrub_at = None
                    self._busy = True
                    return self._scrub_in_background
                wakes = [*self._builds.values(), *([self._scrub_at] if self._scrub_at is not None else [])]
                self._cond.wait(max(0.0, min(wakes) - now) if wakes else None)
        return None

    def _build_in_background(self, pair: Pair) -> None:
        with self._connection() as conn, self._ddl_lock(conn):
            self.build_pair(conn, pair, concurrently=True)
        with self._cond:
            self._builds.pop(pair, None)

    def _scrub_in_background(self) -> None:
        try:
            with self._connection() as conn:
                self._scrub_on(conn, None)
        except (psycopg.Error, StoreError):
            with self._cond:  # still queued in memshelf_scrub: try again later
                self._scrub_at = time.monotonic() + RETRY_SECONDS
            raise

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        with self._connect() as conn:
            with self._cond:
                self._running = conn
                if self._closing:  # close() came while connecting, too early to cancel this connection
                    raise StoreError("the store was closed; reopen it to finish its upkeep")
            try:
                yield conn
            finally:
                with self._cond:
                    self._running = None

    # ------------------------------------------------------------ the work itself
    @contextmanager
    def _ddl_lock(self, conn: psycopg.Connection) -> Iterator[None]:
        while not conn.execute("SELECT pg_try_advisory_lock(%s)", (DDL_LOCK,)).fetchone()[0]:  # type: ignore[index]
            if self._closing:
                raise StoreError("the store was closed while waiting to maintain its indexes; reopen it to finish")
            time.sleep(POLL_SECONDS)
        try:
            yield
        finally:
            if not conn.closed:
                conn.execute("SELECT pg_advisory_unlock(%s)", (DDL_LOCK,))

    def build_pair(self, conn: psycopg.Connection, pair: Pair, *, concurrently: bool) -> None:
        """Make each missing or INVALID index of the pair (the caller holds the DDL lock). An INVALID index is
        what a failed or cancelled concurrent build leaves behind: it is dropped and built again."""
        for name, create in self._statements(*pair, concurrently):
            state = conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                                 (name,)).fetchone()
            if state == (True,):
                continue
            if state is not None:
                conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
            conn.execute(create)

    def build_now(self, pairs: Iterable[Pair], memory: str) -> None:
        """Build the pairs' indexes in this thread, not concurrently (faster; writes to memories wait meanwhile):
        the end of a bulk load. `memory` is maintenance_work_mem for the build."""
        with self._connect() as conn, self._ddl_lock(conn):
            conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", (memory,))
            for pair in sorted(pairs):
                self.build_pair(conn, pair, concurrently=False)

    def scrub(self, full: bool | None) -> list[str]:
        """Scrub every table with erasures queued in memshelf_scrub, now; returns those tables.

        vacuum: REINDEX TABLE CONCURRENTLY (fresh index files without the erased keys, vectors and owner ids; the
        old files are deleted), VACUUM ANALYZE (dead rows and their TOAST chunks go; empty pages at the end are cut
        off; the planner's statistics are made from the rows left, _statistics_scrubbed), then CHECKPOINT. full:
        VACUUM FULL instead, which also rewrites the table files and pg_statistic (the tables are locked while
        rewritten). `full=None` follows MEMSHELF_PG_SCRUB."""
        with self._connect() as conn:
            return self._scrub_on(conn, full)

    def _scrub_on(self, conn: psycopg.Connection, full: bool | None) -> list[str]:
        full = self.mode == "full" if full is None else full
        with self._ddl_lock(conn):
            queued = conn.execute("SELECT array_agg(pk), array_agg(DISTINCT relation) FROM memshelf_scrub").fetchone()
            pks, tables = queued if queued is not None and queued[0] is not None else ([], [])
            if not tables:
                return []
            names = sql.SQL(", ").join(sql.Identifier(t) for t in sorted(tables))
            if full:
                conn.execute(sql.SQL("VACUUM (FULL, ANALYZE) {}").format(names))
            else:
                # Reindexing first: it waits for every transaction older than it to end, so the VACUUM after it
                # is not kept from removing the erased rows by a snapshot that could still see them.
                for table in sorted(tables):
                    self._drop_failed_reindexes(conn, table)
                    conn.execute(sql.SQL("REINDEX TABLE CONCURRENTLY {}").format(sql.Identifier(table)))
                conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(names))
            self._statistics_scrubbed(conn, sorted(tables), full)
            self._checkpoint(conn)
            conn.execute("DELETE FROM memshelf_scrub WHERE pk = ANY(%s)", (pks,))  # only what this scrub saw
        return sorted(tables)

    @staticmethod
    def _statistics_scrubbed(conn: psycopg.Connection, tables: list[str], full: bool) -> None:
        """The planner's statistics (pg_statistic) hold sample values of every column, owner ids and text among
        them. The ANALYZE above made them again from the rows left; but ANALYZE leaves an emptied table's
        statistics as they were, so those are cleared (pg_clear_attribute_stats, PostgreSQL 18; older servers keep
        them until the table has rows again and is analyzed). Then pg_statistic is vacuumed like the tables, which
        needs the database's owner or a superuser (otherwise the server skips it with a warning in its log)."""
        emptied = [name for (name,) in conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.oid = ANY(%s::regclass[]) AND c.reltuples = 0",
            (tables,)).fetchall()]
        if emptied:
            if conn.execute("SELECT to_regprocedure('pg_clear_attribute_stats(text, text, text, boolean)')"
                            ).fetchone() == (None,):
                log.info("memshelf scrub: PostgreSQL before 18 cannot clear an emptied table's statistics; "
                         "%s keep their sample values until they hold rows again and are analyzed", emptied)
            else:
                conn.execute("SELECT pg_clear_attribute_stats(n.nspname::text, c.relname::text, a.attname::text,"
                             " false) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                             " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
                             " WHERE c.oid = ANY(%s::regclass[])", (emptied,))
        conn.execute("VACUUM (FULL) pg_statistic" if full else "VACUUM pg_statistic")

    @staticmethod
    def _drop_failed_reindexes(conn: psycopg.Connection, table: str) -> None:
        """A REINDEX CONCURRENTLY that failed (cancelled, server restarted) leaves INVALID copies named *_ccnew or
        *_ccold, kept up to date by every write and never used: drop them (the caller holds the DDL lock)."""
        left = conn.execute("SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                            " WHERE i.indrelid = to_regclass(%s) AND NOT i.indisvalid"
                            " AND c.relname ~ '_cc(new|old)[0-9]*$'", (table,)).fetchall()
        for (name,) in left:
            conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))

    @staticmethod
    def _checkpoint(conn: psycopg.Connection) -> None:
        """Write the scrubbed pages to the data files now. Needs superuser or pg_checkpoint (PostgreSQL 15+);
        without it the server's next checkpoint writes them (checkpoint_timeout, 5 minutes by default)."""
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            log.info("memshelf scrub: no CHECKPOINT privilege (GRANT pg_checkpoint to the login role); "
                     "the server's next checkpoint writes the scrubbed pages")
