"""The registry of owner tables (stores/tables.py) against the real schemas: every table it lists exists on both
backends with its owner columns, erasure leaves no row of an owner in any of them (nor in a backend's derived
tables), and on PostgreSQL every one is walled by row-level security, as a table added later would be."""

from __future__ import annotations

import contextlib
from memshelf.stores.sqlite import sqlite3  # the store's own SQLite: another in this process must not open its files
from typing import Any

import pytest
from fakes import HashEmbedder

from memshelf import Owner, Shelf
from memshelf.stores.tables import OWNER_TABLES, erased_tables, walled_tables

KALEB = Owner("acme", "kaleb")
OTHER = Owner("acme", "other")


def _rows(backend: str, target: str, query: str, params: tuple = ()) -> list[tuple[Any, ...]]:
    """Run a query straight on the database, outside memshelf (on PostgreSQL as the test server's superuser, whom
    row-level security does not filter). Placeholders are written `?`."""
    if backend == "sqlite":
        with contextlib.closing(sqlite3.connect(target)) as conn:
            return conn.execute(query, params).fetchall()
    import psycopg

    with psycopg.connect(target) as conn:
        return conn.execute(query.replace("?", "%s"), params).fetchall()  # type: ignore[arg-type]


def _columns(backend: str, target: str, table: str) -> set[str]:
    if backend == "sqlite":
        return {r[1] for r in _rows(backend, target, f"PRAGMA table_info({table})")}
    return {r[0] for r in _rows(backend, target, "SELECT column_name FROM information_schema.columns"
                                                 " WHERE table_name = ?", (table,))}


def _fill(shelf, owner: Owner) -> None:
    printer = shelf.remember(owner, "printer", f"{owner.user}'s printer is on the third floor")
    shelf.set_expiry(owner, printer.id, ttl=86_400)  # a change of a memory (SQLite logs it in owner_changes)
    pieced = Shelf(shelf.store, embedder=HashEmbedder(window_chars=60))  # a long memory: its pieces' vectors
    pieced.remember(owner, "printer", f"{owner.user}'s printer manual says: " + "press the green button twice, " * 5)
    shelf.set_fact(owner, "desk", "3.14")
    shelf.set_fact(owner, "desk", "3.15")
    shelf.log_message(owner, "t1", "user", "where is my printer?")
    shelf.log_message(owner, "t2", "user", "I live in Lisbon.")
    shelf.learn(owner, thread="t2")  # a watermark (learn_marks) and the evidence of home_city (learned_from)


def _count(backend: str, target: str, table: str, owner: Owner) -> int:
    return _rows(backend, target, f"SELECT count(*) FROM {table} WHERE tenant = ? AND user_id = ?",
                 (owner.tenant, owner.user))[0][0]


def test_every_registry_table_exists_with_its_owner_columns(backend, target, shelf):
    for entry in OWNER_TABLES:
        columns = _columns(backend, target, entry.name)
        assert set(entry.owner) <= columns, entry.name
        assert not entry.expires or "expires_at" in columns, entry.name


def test_erasing_an_owner_empties_every_erased_table_and_counts_it_as_the_registry_says(backend, target, shelf):
    _fill(shelf, KALEB)
    _fill(shelf, OTHER)
    per_user = [t for t in erased_tables() if t.per_user]
    derived = type(shelf.store).DERIVED_TABLES  # type: ignore[attr-defined]
    before = {t.name: _count(backend, target, t.name, KALEB) for t in per_user}
    assert all(before.values()), before  # the fill reaches every table, or this test proves nothing

    erased = shelf.forget_user(KALEB).as_dict()

    assert {t.counted_as: before[t.name] for t in per_user if t.counted_as} == {
        k: v for k, v in erased.items() if k != "scrub_pending"}
    for table in [t.name for t in per_user] + list(derived):
        assert _count(backend, target, table, KALEB) == 0, table
        assert _count(backend, target, table, OTHER) > 0, table
    assert shelf.store.owners() == [OTHER]


def test_owners_and_stats_cover_the_registry(backend, target, shelf):
    _fill(shelf, KALEB)
    shelf.set_fact(OTHER, "only", "a fact")  # an owner with nothing but a fact is an owner too
    assert shelf.store.owners() == [KALEB, OTHER]
    stats = shelf.store.stats()
    assert stats == {t.counted_as: _rows(backend, target, f"SELECT count(*) FROM {t.name}")[0][0]
                     for t in OWNER_TABLES if t.in_stats}


# ---------------------------------------------------------------- PostgreSQL: the wall follows the registry
def _wall(url: str, table: str) -> tuple[bool, bool, set[str]]:
    import psycopg

    with psycopg.connect(url) as conn:
        secured, forced = conn.execute("SELECT relrowsecurity, relforcerowsecurity FROM pg_class"
                                       " WHERE oid = to_regclass(%s)", (table,)).fetchone()  # type: ignore[misc]
        policies = {r[0] for r in conn.execute("SELECT policyname FROM pg_policies WHERE tablename = %s", (table,))}
    return secured, forced, policies


@pytest.mark.parametrize("table", walled_tables())
def test_every_registry_table_has_row_level_security_enabled_forced_and_both_policies(pg_url, table):
    assert _wall(pg_url, table) == (True, True, {"memshelf_tenant", "memshelf_admin"})


def test_the_scrub_queue_accepts_every_table_an_erasure_touches(pg_url):
    import psycopg

    with psycopg.connect(pg_url) as conn:
        for entry in erased_tables():
            conn.execute("INSERT INTO memshelf_scrub (relation) VALUES (%s)", (entry.name,))
        conn.rollback()


def test_tenant_wall_gives_a_table_added_later_the_same_wall(pg_fresh_url):
    """What a migration adding an owner table runs (_postgres_schema.tenant_wall and scrub_relations), on a scratch
    table: the same wall as the registry's tables, and the scrub queue takes it."""
    import psycopg

    from memshelf.stores._postgres_schema import APP_ROLE, scrub_relations, tenant_wall

    with psycopg.connect(pg_fresh_url) as conn:
        conn.execute("CREATE TABLE probe (tenant text NOT NULL, user_id text NOT NULL, note text)")
        conn.execute(tenant_wall(["probe"]))  # type: ignore[arg-type]
        conn.execute(scrub_relations([*(t.name for t in erased_tables()), "probe"]))  # type: ignore[arg-type]
        conn.execute("INSERT INTO probe VALUES ('a', 'alice', 'mine'), ('b', 'bob', 'theirs')")
        conn.execute("INSERT INTO memshelf_scrub (relation) VALUES ('probe')")
        conn.commit()
    assert _wall(pg_fresh_url, "probe") == (True, True, {"memshelf_tenant", "memshelf_admin"})
    with psycopg.connect(pg_fresh_url) as conn:
        conn.execute(f"SET LOCAL ROLE {APP_ROLE}")
        assert conn.execute("SELECT tenant FROM probe").fetchall() == []  # no tenant set: nothing
        conn.execute("SELECT set_config('memshelf.tenant', 'a', true)")
        assert conn.execute("SELECT tenant FROM probe").fetchall() == [("a",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO probe VALUES ('b', 'bob', 'not mine to write')")


# ---------------------------------------------------------------- what a SQL backend writes
def test_a_sql_backend_writes_only_the_memory_half_and_a_small_dialect():
    """The records and admin halves are written once (sql_records.py): what is left abstract for a SQL backend is
    the memory-and-search half, its transactions, and the dialect; and both built-in backends fill in exactly that."""
    from memshelf.stores.base import AdminStore, MemoryStore, RecordStore, Store
    from memshelf.stores.postgres import PostgresStore
    from memshelf.stores.sql_records import SQLRecords
    from memshelf.stores.sqlite import SQLiteStore

    dialect = {"_time_in", "_time_out", "_owner_scope", "_admin_scope", "_remove_memories", "_purge_memories",
               "_delete_memories"}
    written_once = {"page_memories"}  # plain SQL over the memories table, filters and both orders alike
    assert SQLRecords.__abstractmethods__ == (MemoryStore.__abstractmethods__ - written_once) | {"atomic", "close"} \
        | dialect
    assert not SQLRecords.__abstractmethods__ & (RecordStore.__abstractmethods__ | AdminStore.__abstractmethods__)
    assert Store.__abstractmethods__ == (MemoryStore.__abstractmethods__ | RecordStore.__abstractmethods__
                                         | AdminStore.__abstractmethods__ | {"atomic", "close"})
    for backend in (SQLiteStore, PostgresStore):
        assert not backend.__abstractmethods__
        overridden = {name for name in RecordStore.__abstractmethods__ | AdminStore.__abstractmethods__
                      if name in vars(backend)}
        overridden |= written_once & set(vars(backend))
        assert overridden == set(), f"{backend.__name__} writes {overridden} again instead of sharing them"


def test_a_user_is_listed_exactly_while_an_export_of_them_holds_a_record(backend, target, shelf):
    """Store.page_users reads the registry's tables: a user left with only a learning watermark is listed, with
    nothing counted, as an export of them still holds that record; erased, they are gone from the list."""
    from memshelf import UserSummary
    from memshelf.stores.base import Mark

    shelf.store.set_learn_mark(OTHER, "t1", Mark("msg_0123456789abcdef", shelf.now()), shelf.now())
    assert [r["kind"] for r in shelf.export(OTHER)] == ["memshelf-export", "learn_mark"]
    assert shelf.list_users("acme") == ([UserSummary("other", 0, 0, 0, None)], None)
    shelf.forget_user(OTHER)
    assert shelf.list_users("acme") == ([], None)
