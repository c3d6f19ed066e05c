"""memshelf's own storage backends, declared in pyproject.toml's `memshelf.stores` entry points exactly as a
plugin declares its own. Importing this module is cheap: each backend's module (and for PostgreSQL the psycopg
driver) is imported when a store is opened or checked, not before."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InvalidInput
from .registry import StoreProvider

if TYPE_CHECKING:
    from .base import Store

REQUIRED_TABLES = {"memshelf_migrations", "memories"}
"""Tables every memshelf store has, whatever its backend: a database without them is not one."""


def _open_sqlite(target: str) -> Store:
    from .sqlite import SQLiteStore

    return SQLiteStore(target.removeprefix("sqlite://"))


def _check_sqlite_source(target: str) -> None:
    path = Path(target.removeprefix("sqlite://")).expanduser()
    if path.is_dir():
        raise InvalidInput(f"the source {target!r} is a folder, not a SQLite file: nothing was copied or created. "
                           "Give the path of the memshelf database file inside it (memshelf.db by default)")
    if not path.is_file():
        raise InvalidInput(f"the source {target!r} does not exist: nothing was copied or created. Check the path of "
                           "the SQLite file to copy from (the one MEMSHELF_DB or --db named), or give a "
                           "postgresql:// URL")
    from ._sqlite_lib import sqlite3  # here, not at import: a bad MEMSHELF_SQLITE must not stop PostgreSQL

    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        raise InvalidInput(f"cannot read the source {target!r} as a SQLite database ({exc}): nothing was copied. "
                           "Check that the path names the file memshelf wrote") from exc
    _require_tables(target, tables)


def _open_postgres(target: str) -> Store:
    from .postgres import PostgresStore

    return PostgresStore(target)


def _check_postgres_source(target: str) -> None:
    import psycopg

    from .postgres import _redact

    try:
        with psycopg.connect(target, connect_timeout=15) as conn:
            rows = conn.execute("SELECT c.relname FROM pg_class c WHERE c.relkind IN ('r', 'p')"
                                " AND c.relname = ANY(%s) AND pg_table_is_visible(c.oid)",
                                (sorted(REQUIRED_TABLES),)).fetchall()
    except psycopg.Error as exc:  # libpq's first line says what failed; the rest is its advice, said below
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InvalidInput(f"cannot read the source {_redact(target)} ({said}): nothing was copied. "
                           "Check the URL, that the database exists and that the server is running") from exc
    _require_tables(_redact(target), {r[0] for r in rows})


def _require_tables(where: str, tables: set[str]) -> None:
    if not REQUIRED_TABLES <= tables:
        raise InvalidInput(f"the source {where} has no memshelf tables: nothing was copied or created. Check that "
                           "it names the store memshelf wrote to (source first, destination second)")


sqlite = StoreProvider(_open_sqlite, check_existing=_check_sqlite_source)
"""The embedded default (entry point `sqlite`; plain paths are sqlite targets)."""

postgres = StoreProvider(_open_postgres, requires=("psycopg", "psycopg_pool"),
                         install="pip install 'memshelf[postgres]'", check_existing=_check_postgres_source)
"""PostgreSQL with pgvector (entry points `postgresql` and `postgres`)."""
