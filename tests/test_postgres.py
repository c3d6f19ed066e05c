"""PostgreSQL-only behaviour, on a real server (tests/pg.py): migrations, the row-level security wall, owner-filtered
vector search against exact numpy, erasure, and migration between backends."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path
import threading
from datetime import datetime, timedelta, UTC

import httpx
import numpy as np
import psycopg
import pytest
from psycopg import sql
from fakes import HashEmbedder
from test_tables import _rows as _raw_rows

from memshelf import ConfigError, DimensionMismatch, Owner, Shelf
from memshelf.migrate import MigrationConflict, copy_store, migrate, owner_check
from memshelf.model import Memory, NewMemory
from memshelf.stores.base import CURRENT, Evidence, View
from memshelf.stores.postgres import (
    Blob, PostgresStore, bm25_query, exact_query, index_names, index_statements)
from memshelf.stores._postgres_schema import APP_ROLE, MIGRATIONS, OWNER_TABLES
from memshelf.stores import postgres as pg_module
from memshelf.stores.sqlite import SQLiteStore
from memshelf.testing import Clock
from memshelf._vectors import pack

A = Owner("tenant-a", "alice")
B = Owner("tenant-b", "bob")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def store(pg_url):
    opened = PostgresStore(pg_url)
    yield opened
    opened.close()


def _fill(shelf: Shelf, owner: Owner, word: str) -> None:
    shelf.remember(owner, "note", f"{owner.user} keeps a {word} in the drawer")
    shelf.set_fact(owner, "colour", f"{word}-blue")
    shelf.set_fact(owner, "colour", f"{word}-green")
    shelf.log_message(owner, "t1", "user", f"where is my {word}?")


def _fill_learned(shelf: Shelf, owner: Owner, word: str) -> None:
    """_fill, and what learning keeps: a thread's watermark and a record's evidence; and a long memory's pieces."""
    _fill(shelf, owner, word)
    pieced = Shelf(shelf.store, embedder=HashEmbedder(window_chars=60))
    pieced.remember(owner, "manual", f"The {word} manual says: " + f"keep the {word} dry and away from light, " * 4)
    shelf.learn(owner, thread="t1")  # a question: nothing learned, but the watermark moves
    said = shelf.messages(owner, "t1")[0]
    shelf.store.add_evidence(owner, [Evidence("fact", "colour", said.id, "t1", said.created_at)])


# ---------------------------------------------------------------- migrations
def test_migrations_are_recorded_and_running_them_again_changes_nothing(pg_url, store):
    names = [name for name, _ in MIGRATIONS]
    assert store.applied_migrations() == names
    again = PostgresStore(pg_url)
    try:
        assert again.applied_migrations() == names
    finally:
        again.close()


def test_migrations_from_two_processes_and_threads_at_once(pg_server):
    url = pg_server.empty_database()
    code = "import sys; from memshelf.stores.postgres import PostgresStore; PostgresStore(sys.argv[1]).close()"
    processes = [subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE) for _ in range(2)]
    errors: list[BaseException] = []

    def migrate_in_thread() -> None:
        try:
            PostgresStore(url, pool_size=1).close()
        except BaseException as exc:  # noqa: BLE001  reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=migrate_in_thread) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for process in processes:
        assert process.wait(timeout=60) == 0, process.stderr.read().decode()
    assert errors == []
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT name, count(*) FROM memshelf_migrations GROUP BY name ORDER BY name").fetchall()
    assert rows == [(name, 1) for name, _ in MIGRATIONS]


def test_a_database_from_before_m003_upgrades_in_place(pg_server, monkeypatch):
    """Rows written under m001-m002 (no context, vectors wherever PostgreSQL put them) stay searchable after the
    later migrations; the first search of their model builds the missing covering index in the background."""
    from memshelf.stores.postgres import digest

    url = pg_server.empty_database()
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:2])
    PostgresStore(url).close()
    monkeypatch.undo()
    owner, dims = Owner("old", "olive"), 16
    rng = np.random.default_rng(3)
    block = rng.normal(size=(30, dims)).astype(np.float32)
    block /= np.linalg.norm(block, axis=1, keepdims=True)
    with psycopg.connect(url) as conn:  # what the m002-era store wrote
        for i, vector in enumerate(block):
            content = f"Old note {i} about the {'boiler' if i % 3 == 0 else 'garden'}."
            conn.execute(
                "INSERT INTO memories (id, tenant, user_id, topic, content, digest, source, confidence, created_at,"
                " last_seen, embedding, embed_model) VALUES (%s, %s, %s, 'notes', %s, %s, 'stated', 1.0, %s, %s,"
                " %s::vector, 'old-16')",
                (f"old-{i}", owner.tenant, owner.user, content, digest("notes", content), T0, T0,
                 "[" + ",".join(repr(float(x)) for x in vector) + "]"))
    store = PostgresStore(url)
    try:
        assert store.applied_migrations() == [name for name, _ in MIGRATIONS]
        query = block[4] + 0.2 * block[9]
        expected = [f"old-{i}" for i in np.argsort(-(block @ (query / np.linalg.norm(query))), kind="stable")[:K]]
        assert [s.memory.id for s in store.vector_search(owner, "old-16", query, K, -1.0, T0)] == expected
        assert len(store.keyword_search(owner, ["boiler"], 50, T0, by_confidence=False)) == 10
        assert store.delete_memory(owner, "old-0")  # rewrites the context of its followers, old-1 and old-2
        store.import_memories(owner, [Memory("new-0", "notes", "A new note about the boiler.", "stated", 1.0, T0,
                                             embed_model="old-16")], [pack(block[0])])
        assert store.wait_for_indexes(120)
        with psycopg.connect(url) as conn:
            made = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'memories'")}
            contexts = dict(conn.execute("SELECT id, context_search::text FROM memories WHERE id IN"
                                         " ('old-2', 'old-5', 'new-0')").fetchall())
        assert set(index_names("old-16", dims).values()) <= made
        assert contexts["old-5"] is None  # untouched old rows have no context: ranked by their own words
        assert "'garden'" in contexts["old-2"] and "'1':" in contexts["old-2"]  # rewritten: now it follows old-1
        assert "'28':" in contexts["new-0"] and "'29':" in contexts["new-0"]  # the last two old notes
        # through the covering index now; new-0 has old-0's vector, so it takes old-0's place
        assert [s.memory.id for s in store.vector_search(owner, "old-16", query, K, -1.0, T0)] == [
            "new-0" if i == "old-0" else i for i in expected]
    finally:
        store.close()


def test_open_by_url_gives_a_working_shelf(pg_url):
    with Shelf.open(pg_url, embedder=None) as shelf:
        memory = shelf.remember(A, "network", "The office printer is on 192.168.1.40.")
        assert [h.memory.id for h in shelf.search(A, "printers")] == [memory.id]
        assert list(shelf.search(B, "printer")) == []


# ---------------------------------------------------------------- the row-level security wall
@pytest.fixture(scope="module")
def two_tenants(pg_url):
    with Shelf.open(pg_url, embedder=None) as shelf:
        _fill_learned(shelf, Owner("wall-a", "alice"), "stapler")
        _fill_learned(shelf, Owner("wall-b", "bob"), "compass")
        shelf.create_key("wall-b", "bob's key")
    return pg_url


def _unfiltered(url: str, table: str, *, role: str | None, tenant: str | None) -> list[tuple]:
    """SELECT * with no WHERE at all, as the given role with the given tenant set for the transaction."""
    with psycopg.connect(url) as conn:
        if role is not None:
            conn.execute(f"SET LOCAL ROLE {role}")
        if tenant is not None:
            conn.execute("SELECT set_config('memshelf.tenant', %s, true)", (tenant,))
        return conn.execute(f"SELECT tenant FROM {table}").fetchall()


@pytest.mark.parametrize("table", OWNER_TABLES)
def test_an_unfiltered_query_sees_only_the_tenant_set_for_the_transaction(two_tenants, table):
    seen = _unfiltered(two_tenants, table, role=APP_ROLE, tenant="wall-a")
    assert ("wall-b",) not in seen
    if table != "api_keys":
        assert set(seen) == {("wall-a",)}
    assert _unfiltered(two_tenants, table, role=APP_ROLE, tenant="wall-b") != []


@pytest.mark.parametrize("table", OWNER_TABLES)
def test_an_unfiltered_query_with_no_tenant_set_sees_nothing(two_tenants, table):
    assert _unfiltered(two_tenants, table, role=APP_ROLE, tenant=None) == []


@pytest.mark.parametrize("table", OWNER_TABLES)
def test_the_admin_policy_is_memshelf_admins_alone(two_tenants, table):
    """The admin policy's test (current_user is memshelf_admin) holds for no other role, but a policy for every
    role is tested on every row a query reads; for memshelf_admin alone, the tenant's policy is tested once."""
    with psycopg.connect(two_tenants) as conn:
        assert conn.execute("SELECT roles FROM pg_policies WHERE tablename = %s AND policyname = 'memshelf_admin'",
                            (table,)).fetchall() == [(["memshelf_admin"],)]


def test_an_owners_postings_are_read_without_a_policy_test_per_row(pg_fresh_url):
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.remember_many(A, [{"topic": "t", "content": f"The falcon report {i} is filed."} for i in range(50)])
        store = shelf.store
        assert isinstance(store, PostgresStore)
        with store._tenant(A.tenant) as cur:
            plan = cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM memory_words"
                               " WHERE tenant = %s AND user_id = %s AND word = 'falcon'", (A.tenant, A.user)
                               ).fetchone()[0]
    nodes = _plan_nodes(plan[0]["Plan"])
    scan = next(node for node in nodes if node.get("Relation Name") == "memory_words")
    assert scan["Actual Rows"] == 50 and "Filter" not in scan
    assert any("memshelf.tenant" in node.get("One-Time Filter", "") for node in nodes)


def test_the_stores_own_scope_walls_an_unfiltered_query(two_tenants):
    store = PostgresStore(two_tenants, pool_size=1)
    try:
        with store._tenant("wall-a") as cur:  # the scope every owner operation of the store runs in
            tenants = {r[0] for r in cur.execute("SELECT tenant FROM memories")}
            facts = {r[0] for r in cur.execute("SELECT tenant FROM fact_history")}
        assert tenants == {"wall-a"} and facts == {"wall-a"}
    finally:
        store.close()


def test_the_wall_refuses_writing_into_another_tenant(two_tenants):
    with psycopg.connect(two_tenants) as conn:
        conn.execute(f"SET LOCAL ROLE {APP_ROLE}")
        conn.execute("SELECT set_config('memshelf.tenant', 'wall-a', true)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO facts VALUES ('wall-b', 'bob', 'k', 'v', 'stated', now())")


@pytest.fixture(scope="module")
def login_role(pg_server):
    """The README's production setup, filled through memshelf: two tenants with every kind of record."""
    url, role = pg_server.login_role_database()
    with Shelf.open(url, embedder=None) as shelf:
        _fill_learned(shelf, Owner("wall-a", "alice"), "stapler")
        _fill_learned(shelf, Owner("wall-b", "bob"), "compass")
        shelf.create_key("wall-b", "bob's key")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
                            ).fetchone() == (False,)
        assert conn.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'memories'").fetchone() == (role,)
    return url


@pytest.mark.parametrize("table", OWNER_TABLES)
def test_the_documented_login_role_sees_nothing_unless_a_tenant_is_set(login_role, table):
    """Connected as memshelf's login role and acting as nothing else (no SET ROLE): a query with no filter sees
    no row without a tenant, and only that tenant's rows with one."""
    assert _unfiltered(login_role, table, role=None, tenant=None) == []
    assert _unfiltered(login_role, table, role=None, tenant="") == []
    seen = set(_unfiltered(login_role, table, role=None, tenant="wall-a"))
    assert seen <= {("wall-a",)} and (seen or table == "api_keys")
    assert _unfiltered(login_role, table, role=APP_ROLE, tenant=None) == []


def test_the_documented_login_role_runs_every_operation(login_role, tmp_path):
    """Owner operations through memshelf_app and admin ones (owners, purge, keys, tenant erasure, migration)
    through memshelf_admin, all from the login role."""
    store = PostgresStore(login_role)
    try:
        assert {(o.tenant, o.user) for o in store.owners()} == {("wall-a", "alice"), ("wall-b", "bob")}
        assert [k.tenant for k in store.list_keys(None)] == ["wall-b"]
        assert store.purge_expired(datetime.now(UTC) + timedelta(days=3650)).messages == 2
        assert store.erase_tenant("wall-a").facts == 1
        assert [o.tenant for o in store.owners()] == ["wall-b"]
        assert store.scrub() == ["fact_history", "facts", "learn_marks", "learned_from", "memories",
                                 "memory_pieces", "memory_words", "messages"]  # no CHECKPOINT right: skipped
        store.add_memories(Owner("wall-b", "bob"), _new(_unit_rows(6, 5, 8), "login-8"), T0)
        assert store.wait_for_indexes(120)
        assert all(_index_state(login_role, "login-8", 8).values())
    finally:
        store.close()
    with Shelf.open(str(tmp_path / "local.db"), embedder=None) as local:
        _fill(local, Owner("moved", "mo"), "kettle")
    assert migrate(str(tmp_path / "local.db"), login_role).owners == 1
    with Shelf.open(login_role, embedder=None) as shelf:
        found = shelf.search(Owner("moved", "mo"), "kettle")
        assert [h.memory.content for h in found] == ["mo keeps a kettle in the drawer"]


# ---------------------------------------------------------------- owner-filtered vector search
DIMS = 48
TENANTS = 100
PER_OWNER = 150
K = 10


def _clustered(rng: np.random.Generator, n: int) -> np.ndarray:
    centres = rng.normal(size=(20, DIMS)).astype(np.float32)
    points = centres[rng.integers(0, 20, n)] + 0.35 * rng.normal(size=(n, DIMS)).astype(np.float32)
    return points / np.linalg.norm(points, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def crowd(pg_server):
    """100 tenants of 150 memories each in one table: each owner is 1% of the rows."""
    url = pg_server.fresh_database()
    rng = np.random.default_rng(7)
    vectors = _clustered(rng, TENANTS * PER_OWNER)
    store = PostgresStore(url)
    owners = [Owner(f"t{i:03d}", "user") for i in range(TENANTS)]
    with store.bulk_load():  # one build of each index at the end instead of 15,000 inserts into the graph
        for i, owner in enumerate(owners):
            block = vectors[i * PER_OWNER:(i + 1) * PER_OWNER]
            items = [Memory(f"m_{i}_{j}", "topic", f"memory {j} of tenant {i}", "stated", 1.0, T0,
                            embed_model="test-48") for j in range(PER_OWNER)]
            store.import_memories(owner, items, [pack(v) for v in block])
    yield store, owners, vectors, url
    store.close()
    pg_server.drop(url)


def _exact_top(vectors: np.ndarray, owner_index: int, query: np.ndarray) -> list[str]:
    block = vectors[owner_index * PER_OWNER:(owner_index + 1) * PER_OWNER]
    scores = block @ (query / np.linalg.norm(query))
    return [f"m_{owner_index}_{j}" for j in np.argsort(-scores, kind="stable")[:K]]


def test_a_small_owners_top_k_is_exactly_its_exact_top_k(crowd):
    store, owners, vectors, _ = crowd
    rng = np.random.default_rng(11)
    for owner_index in (0, 37, 99):
        for query in _clustered(rng, 5):
            found = store.vector_search(owners[owner_index], "test-48", query, K, -1.0, T0)
            assert [s.memory.id for s in found] == _exact_top(vectors, owner_index, query)


def test_the_hnsw_path_with_a_tenant_filter_does_not_lose_results(crowd):
    store, owners, vectors, url = crowd
    indexed = PostgresStore(url, exact_max_rows=0)  # force the index even for a small owner
    try:
        rng = np.random.default_rng(12)
        recalls = []
        for owner_index in (3, 50, 98):
            for query in _clustered(rng, 5):
                found = indexed.vector_search(owners[owner_index], "test-48", query, K, -1.0, T0)
                assert len(found) == K, "the owner filter starved the index scan"
                assert {s.memory.id for s in found} <= {f"m_{owner_index}_{j}" for j in range(PER_OWNER)}
                recalls.append(len({s.memory.id for s in found} & set(_exact_top(vectors, owner_index, query))) / K)
        assert np.mean(recalls) >= 0.95
        with psycopg.connect(url) as conn:
            plan = "\n".join(r[0] for r in conn.execute(
                "SELECT 'x' UNION ALL SELECT indexdef FROM pg_indexes WHERE indexname LIKE 'memories_hnsw_%%'"))
        assert "hnsw" in plan and "vector(48)" in plan
    finally:
        indexed.close()


def test_a_wider_search_keeps_the_exact_path_for_larger_owners(crowd, monkeypatch):
    """HNSW walks the whole table for its candidates, 4x the limit: the hybrid's 50 would cost it five times the top
    10's, so an owner just past the top 10's exact size is still scanned exactly for 50 (and found exactly)."""
    _, owners, vectors, url = crowd
    store = PostgresStore(url, exact_max_rows=PER_OWNER - 50)
    paths: list[int] = []
    approximate = store._approximate
    monkeypatch.setattr(store, "_approximate", lambda *a, **k: paths.append(a[5]) or approximate(*a, **k))
    try:
        assert store.exact_rows(10) == PER_OWNER - 50 < PER_OWNER < store.exact_rows(50) < store.exact_rows(100)
        query = _clustered(np.random.default_rng(13), 1)[0]
        assert len(store.vector_search(owners[7], "test-48", query, K, -1.0, T0)) == K
        assert paths == [K]  # the top 10 of an owner over exact_max_rows: HNSW
        wide = store.vector_search(owners[7], "test-48", query, 50, -1.0, T0)
        assert paths == [K]  # the top 50: exact
        block = vectors[7 * PER_OWNER:8 * PER_OWNER] @ query
        assert [s.memory.id for s in wide] == [f"m_7_{j}" for j in np.argsort(-block, kind="stable")[:50]]
    finally:
        store.close()


def test_floor_and_dimension_checks(crowd):
    store, owners, vectors, _ = crowd
    query = vectors[0]
    assert all(s.score >= 0.9 for s in store.vector_search(owners[0], "test-48", query, K, 0.9, T0))
    assert store.vector_search(owners[0], "another-model", query, K, -1.0, T0) == []
    with pytest.raises(DimensionMismatch, match="48"):
        store.vector_search(owners[0], "test-48", np.ones(12, dtype=np.float32), K, -1.0, T0)


def test_the_exact_path_reads_the_covering_index_and_never_the_table(crowd):
    """An owner's entries lie together in the covering index, so the exact scan costs the same however the
    owner's rows are spread over the table (BENCHMARKS.md: 25 ms from the table, 4.5 ms from the index)."""
    store, owners, vectors, url = crowd
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE memories")  # what autovacuum does: index-only scans need the visibility map
    owner = owners[37]
    with store._tenant(owner.tenant) as cur:
        plan = "\n".join(r[0] for r in cur.execute(
            sql.SQL("EXPLAIN ") + exact_query(owner, "test-48", DIMS),
            (Blob(pack(vectors[0])), owner.tenant, owner.user, T0, K, owner.tenant, owner.user, owner.tenant, -1.0,
             K)))
    assert f"Index Only Scan using {index_names('test-48', DIMS)['exact']}" in plan


def test_errors_past_a_server_limit_do_not_blame_the_connection():
    from memshelf.stores.postgres import _translate
    message = str(_translate(psycopg.errors.ProgramLimitExceeded("index row size 3208 exceeds maximum"), "url"))
    assert "limits" in message and "cannot talk" not in message
    assert "cannot talk" in str(_translate(psycopg.OperationalError("connection refused"), "url"))


def _raised_by(url: str, *statements: str) -> psycopg.Error:
    """The error the server raises for the last statement (each runs on one autocommit connection)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements[:-1]:
            conn.execute(statement)
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(statements[-1])
    return caught.value


def test_each_server_error_is_translated_to_what_it_means(pg_url):
    """Bad values are InvalidInput (HTTP 422), a busy server StoreUnavailable (503, retry), the rest StoreError."""
    from memshelf import InvalidInput, StoreError, StoreUnavailable
    from memshelf.stores.postgres import _translate

    assert isinstance(_translate(_raised_by(pg_url, "SELECT 1 / 0"), "url"), InvalidInput)
    duplicate = _raised_by(pg_url, "CREATE TEMP TABLE t (k int PRIMARY KEY)", "INSERT INTO t VALUES (1)",
                           "INSERT INTO t VALUES (1)")
    assert isinstance(_translate(duplicate, "url"), InvalidInput)
    with psycopg.connect(pg_url) as holder:  # holds a lock the other connection cannot get in time
        holder.execute("CREATE TABLE IF NOT EXISTS lock_probe (k int)")
        holder.commit()
        holder.execute("LOCK TABLE lock_probe IN ACCESS EXCLUSIVE MODE")
        busy = _raised_by(pg_url, "SET lock_timeout = '50ms'", "SELECT * FROM lock_probe")
        holder.rollback()
    translated = _translate(busy, "url")
    assert isinstance(translated, StoreUnavailable) and "retry" in str(translated)
    other = _translate(_raised_by(pg_url, "SELECT * FROM no_such_table"), "url")
    assert type(other) is StoreError and "no_such_table" in str(other) and "cannot talk" not in str(other)


def test_long_owner_keys_and_wide_vectors_are_stored_and_searched_exactly(pg_url):
    """Past the covering index's limits (owner key over 512 bytes, over 512 dimensions) and pgvector's HNSW limit
    (2,000 dimensions) writes still succeed and searches still find the exact top-k, from the table."""
    store = PostgresStore(pg_url, exact_max_rows=0)  # take the HNSW path wherever there is an index
    try:
        rng = np.random.default_rng(5)
        letters = "".join(chr(c) for c in rng.integers(0x1D400, 0x1D6A0, 400))  # 4-byte letters: incompressible
        owners = [Owner("wide", "short"),
                  Owner(letters[:64], letters[64:128]),  # 512 bytes: the longest key the covering index takes
                  Owner(letters[:200], letters[200:])]  # 1,600 bytes: scanned from the table
        for dims in (384, 512, 513, 2048):
            model = f"wide-{dims}"
            block = rng.normal(size=(60, dims)).astype(np.float32)
            block /= np.linalg.norm(block, axis=1, keepdims=True)
            for owner in owners:
                items = [Memory(f"w{dims}-{i}", "wide", f"wide vector {i} of {dims}", "stated", 1.0, T0,
                                embed_model=model) for i in range(len(block))]
                assert store.import_memories(owner, items, [pack(v) for v in block]) == len(block)
                query = block[7] + 0.3 * block[11]
                found = store.vector_search(owner, model, query, K, -1.0, T0)
                expected = np.argsort(-(block @ (query / np.linalg.norm(query))), kind="stable")[:K]
                assert [s.memory.id for s in found] == [f"w{dims}-{i}" for i in expected]
        assert store.wait_for_indexes(120)
        with psycopg.connect(pg_url) as conn:
            made = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'memories'")}
        assert set(index_names("wide-384", 384).values()) <= made  # both kinds
        assert list(index_names("wide-513", 513)) == ["hnsw"] and index_names("wide-513", 513)["hnsw"] in made
        assert index_names("wide-2048", 2048) == {}
    finally:
        store.close()


@pytest.mark.parametrize("dims", [384, 1536])
def test_vectors_and_search_text_stay_in_the_row(store, pg_url, dims):
    """A vector or tsvector moved out of line to TOAST costs several extra buffer reads per scanned row (the
    exact path scans every row of the owner): rows of common sizes keep both in the row (m003)."""
    owner = Owner("layout", f"u{dims}")
    text = "The office printer on the third floor is at 192.168.1.40 and takes A4 paper. " * 4
    vector = np.random.default_rng(dims).normal(size=dims).astype(np.float32)
    store.import_memories(owner, [Memory(f"layout-{dims}", "printer", text, "stated", 1.0, T0,
                                         embed_model=f"layout-{dims}")], [pack(vector)])
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT pg_column_toast_chunk_id(embedding), pg_column_toast_chunk_id(search),"
                           " pg_column_size(embedding) FROM memories WHERE tenant = %s AND user_id = %s",
                           (owner.tenant, owner.user)).fetchone()
    assert row == (None, None, 8 + 4 * dims)  # in the row, and not compressed either


# ---------------------------------------------------------------- vector indexes, built off the request path
def _index_state(url: str, model: str, dims: int) -> dict[str, bool]:
    """Each of the pair's indexes that exists, and whether it is valid (usable by the planner)."""
    with psycopg.connect(url) as conn:
        return dict(conn.execute(
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE c.relname = ANY(%s)", (list(index_names(model, dims).values()),)).fetchall())


def _memshelf_indexes(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE indexname LIKE 'memories_hnsw_%%'"
                                           " OR indexname LIKE 'memories_exact_%%'")]


def _unit_rows(seed: int, n: int, dims: int) -> np.ndarray:
    block = np.random.default_rng(seed).normal(size=(n, dims)).astype(np.float32)
    return block / np.linalg.norm(block, axis=1, keepdims=True)


def _new(block: np.ndarray, model: str, word: str = "note") -> list[NewMemory]:
    return [NewMemory("notes", f"{word} {i}", "stated", 1.0, None, pack(v), model, T0) for i, v in enumerate(block)]


def _exact_ids(block: np.ndarray, query: np.ndarray, word: str = "note") -> list[str]:
    order = np.argsort(-(block @ (query / np.linalg.norm(query))), kind="stable")[:K]
    return [f"{word} {i}" for i in order]


def test_a_write_of_a_new_model_returns_at_once_and_search_is_exact_until_the_index_is_valid(pg_fresh_url):
    """Another transaction holds a write lock on memories (any long write does): a build inside the writer's
    transaction would wait for it, and every later write would queue behind the build."""
    owner, model, dims = Owner("build", "bea"), "build-32", 32
    block = _unit_rows(1, 60, dims)
    query = block[3] + 0.3 * block[17]
    store = PostgresStore(pg_fresh_url, exact_max_rows=0)  # HNSW as soon as it is valid, whatever the owner's size
    blocker = psycopg.connect(pg_fresh_url)
    try:
        blocker.execute("LOCK TABLE memories IN ROW EXCLUSIVE MODE")
        written = threading.Event()
        writer = threading.Thread(target=lambda: (store.add_memories(owner, _new(block, model), T0), written.set()),
                                  daemon=True)
        writer.start()
        assert written.wait(15), "the write waited for an index build"
        assert not any(_index_state(pg_fresh_url, model, dims).values())  # the build waits for the blocker
        found = store.vector_search(owner, model, query, K, -1.0, T0)
        assert [s.memory.content for s in found] == _exact_ids(block, query)
    finally:
        blocker.rollback()
        blocker.close()
    try:
        assert store.wait_for_indexes(120)
        assert _index_state(pg_fresh_url, model, dims) == dict.fromkeys(index_names(model, dims).values(), True)
        found = store.vector_search(owner, model, query, K, -1.0, T0)
        assert [s.memory.content for s in found] == _exact_ids(block, query)
    finally:
        store.close()


def test_imports_of_any_model_stamp_build_no_index(pg_fresh_url, tmp_path):
    """A tenant's imports (no embedder on the server) carry whatever model stamps they like: the server builds
    indexes only for models it serves."""
    records = []
    for i in range(30):
        with Shelf.open(str(tmp_path / f"source{i}.db"), embedder=HashEmbedder(f"stamp:{i}", 8 + i)) as source:
            source.remember(A, "notes", f"imported note {i}")
            records.append(list(source.export(A)))
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        for exported in records:
            assert shelf.import_(A, exported)["memories"] == 1
        assert shelf.store.wait_for_indexes(60)
        assert len(shelf.search(A, "imported")) == 5
    assert _memshelf_indexes(pg_fresh_url) == []


def test_two_stores_racing_to_build_the_same_indexes_do_not_error(pg_fresh_url, caplog):
    model, dims = "race-16", 16
    first, second = PostgresStore(pg_fresh_url), PostgresStore(pg_fresh_url)
    try:
        first.add_memories(A, _new(_unit_rows(2, 50, dims), model), T0)
        for store in (first, second):
            store.serve_model(model, dims)
        assert first.wait_for_indexes(120) and second.wait_for_indexes(120)
    finally:
        first.close()
        second.close()
    assert _index_state(pg_fresh_url, model, dims) == dict.fromkeys(index_names(model, dims).values(), True)
    assert not [r for r in caplog.records if "upkeep failed" in r.getMessage()]


def test_an_invalid_index_left_by_a_failed_build_is_dropped_and_built_again(pg_fresh_url):
    model, dims = "broken-16", 16
    block = _unit_rows(3, 40, dims)
    store = PostgresStore(pg_fresh_url)
    try:
        store.import_memories(A, [Memory(f"b{i}", "notes", f"note {i}", "stated", 1.0, T0, embed_model=model)
                                  for i in range(len(block))], [pack(v) for v in block])
        with psycopg.connect(pg_fresh_url) as blocker, psycopg.connect(pg_fresh_url, autocommit=True) as conn:
            blocker.execute("LOCK TABLE memories IN ROW EXCLUSIVE MODE")
            conn.execute("SET statement_timeout = '300ms'")
            for _, create in index_statements(model, dims, concurrently=True):
                with pytest.raises(psycopg.errors.QueryCanceled):  # waiting for the blocker: the build fails
                    conn.execute(create)
        assert _index_state(pg_fresh_url, model, dims) == dict.fromkeys(index_names(model, dims).values(), False)
        store.serve_model(model, dims)
        assert store.wait_for_indexes(120)
        assert _index_state(pg_fresh_url, model, dims) == dict.fromkeys(index_names(model, dims).values(), True)
        query = block[5]
        assert [s.memory.content for s in store.vector_search(A, model, query, K, -1.0, T0)] == _exact_ids(block, query)
    finally:
        store.close()


def test_a_bulk_load_in_one_thread_does_not_defer_another_threads_builds(pg_fresh_url):
    store = PostgresStore(pg_fresh_url)
    inside, finish = threading.Event(), threading.Event()
    loaded = _unit_rows(4, 30, 24)

    def bulk() -> None:
        with store.bulk_load():
            store.import_memories(B, [Memory(f"l{i}", "notes", f"loaded {i}", "stated", 1.0, T0,
                                             embed_model="bulk-24") for i in range(len(loaded))],
                                  [pack(v) for v in loaded])
            inside.set()
            finish.wait(60)

    loader = threading.Thread(target=bulk)
    loader.start()
    try:
        assert inside.wait(30)
        store.add_memories(A, _new(_unit_rows(5, 30, 16), "served-16"), T0)  # served by this other thread
        assert store.wait_for_indexes(120)
        assert all(_index_state(pg_fresh_url, "served-16", 16).values())
        assert _index_state(pg_fresh_url, "bulk-24", 24) == {}  # the bulk load's own model waits for its end
    finally:
        finish.set()
        loader.join()
    assert _index_state(pg_fresh_url, "bulk-24", 24) == dict.fromkeys(index_names("bulk-24", 24).values(), True)
    store.close()


# ---------------------------------------------------------------- erasure
def _rows_of(url: str, where: str, params: tuple) -> dict[str, int]:
    with psycopg.connect(url) as conn:  # the login role (a superuser here): sees past row-level security
        return {t: conn.execute(f"SELECT count(*) FROM {t} WHERE {where}", params).fetchone()[0]
                for t in ("memories", "facts", "fact_history", "messages")}


def test_erase_user_and_tenant_leave_no_rows(pg_server):
    url = pg_server.fresh_database()
    carol, dave, erin = Owner("erase-x", "carol"), Owner("erase-x", "dave"), Owner("erase-y", "erin")
    with Shelf.open(url, embedder=HashEmbedder()) as shelf:
        for owner in (carol, dave, erin):
            _fill(shelf, owner, "secret-" + owner.user)
        erased = shelf.forget_user(carol)
        assert erased.as_dict() == {"memories": 1, "facts": 1, "fact_changes": 2, "messages": 1,
                                    "scrub_pending": True}  # queued for the background scrub
        assert _rows_of(url, "user_id = %s", ("carol",)) == dict.fromkeys(_rows_of(url, "true", ()), 0)
        assert shelf.forget_tenant("erase-x").memories == 1
        assert set(_rows_of(url, "tenant = %s", ("erase-x",)).values()) == {0}
        assert _rows_of(url, "tenant = %s", ("erase-y",))["memories"] == 1
    with psycopg.connect(url) as conn:
        hits = conn.execute("SELECT count(*) FROM memories WHERE search @@ to_tsquery('memshelf_text', 'carol')"
                            " OR content LIKE '%%secret-carol%%' OR content LIKE '%%secret-dave%%'").fetchone()[0]
        assert hits == 0
    pg_server.drop(url)


SECRET = "The quokkavault combination is 31-7-44, do not tell anyone."


def _files_holding(data_dir: str, url: str, needles: list[bytes]) -> dict[str, str]:
    """Every file of this database's directory and of the server's shared folders (not pg_wal, not other
    databases) that holds one of the needles: its path -> the relkind of the relation it stores ('r' table,
    't' TOAST table, 'i' index; '' for a file that is no relation's)."""
    with psycopg.connect(url) as conn:
        oid = str(conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0])
        kinds = dict(conn.execute("SELECT pg_relation_filepath(oid), relkind::text FROM pg_class"
                                  " WHERE pg_relation_filepath(oid) IS NOT NULL").fetchall())
    root, hits = Path(data_dir), {}
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if not path.is_file() or parts[0] == "pg_wal" or (parts[0] == "base" and parts[1] != oid):
            continue
        data = path.read_bytes()
        if any(needle in data for needle in needles):
            relation = str(path.relative_to(root)).split(".")[0].removesuffix("_fsm").removesuffix("_vm")
            hits[str(path.relative_to(root))] = kinds.get(relation, "")
    return hits


@pytest.mark.parametrize(("erase", "full"), [("forget_user", False), ("forget_each", False),
                                             ("forget_tenant", False), ("forget_user", True), ("forget_each", True)])
def test_a_scrub_removes_erased_text_and_vectors_from_every_index_file_and_a_full_one_from_every_file(
        pg_server, clock, erase, full):
    """The bytes on disk, as the SQLite test reads its file: after a scrub (VACUUM, REINDEX CONCURRENTLY,
    CHECKPOINT) no index file holds the erased text, owner or vector, and at most the free space of table pages
    does; after a full scrub (VACUUM FULL) no file of the database does. WAL is not scanned (README)."""
    if pg_server.data_dir is None:
        pytest.skip("needs the embedded server's data directory (MEMSHELF_TEST_DATABASE_URL is set)")
    url, kaleb, embedder = pg_server.fresh_database(), Owner("scrub", "kaleb-quokkauser"), HashEmbedder()
    needles = [b"quokkavault", b"quokkatopic", b"quokkakey", b"quokkavalue", b"quokkathread", b"Quokkaville",
               pack(embedder.embed(SECRET))]
    if erase != "forget_each":
        needles.append(b"kaleb-quokkauser")
    with Shelf.open(url, embedder=embedder, clock=clock) as shelf:
        for i in range(200):  # another user's rows first: the secret rows end up last on their pages
            shelf.remember(Owner("scrub", "maya"), "filler", f"Filler statement number {i} about the weather.")
        memory = shelf.remember(kaleb, "quokkatopic", SECRET)
        shelf.set_fact(kaleb, "quokkakey", "quokkavalue")
        shelf.log_message(kaleb, "quokkathread", "user", SECRET, ttl=10)
        shelf.log_message(kaleb, "quokkathread", "user", "I live in Quokkaville.")
        shelf.learn(kaleb, thread="quokkathread")  # a watermark and evidence naming the thread, a learned fact
        store = shelf.store
        assert store.wait_for_indexes(120)
        store.scrub()  # nothing erased yet: nothing to do, but CHECKPOINT writes the rows to the files
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")  # as autovacuum may have: the planner's statistics hold sample values
            assert conn.execute("SELECT count(*) FROM pg_stats WHERE most_common_vals::text LIKE %s",
                                ("%kaleb-quokkauser%",)).fetchone()[0] > 0
            conn.execute("CHECKPOINT")
        assert {"r", "i"} <= set(_files_holding(pg_server.data_dir, url, needles).values())  # the scan sees them
        if erase == "forget_user":
            shelf.forget_user(kaleb)
        elif erase == "forget_tenant":
            shelf.forget_tenant(kaleb.tenant)
        else:
            shelf.forget(kaleb, memory.id)
            shelf.forget_fact(kaleb, "quokkakey")
            clock.advance(3600)
            assert shelf.purge_expired().messages == 1  # the message went by its own retention
            assert shelf.forget_thread(kaleb, "quokkathread", cascade=True).facts == 1  # and what was learned
        assert set(store.scrub(full=full)) >= {"memories", "facts", "fact_history", "messages", "learn_marks",
                                               "learned_from"}
        left = _files_holding(pg_server.data_dir, url, needles)
        if erase != "forget_each":  # all of the owner went: the planner's statistics were made again, or cleared
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT tablename, attname FROM pg_stats WHERE most_common_vals::text LIKE %s"
                                    " OR histogram_bounds::text LIKE %s", ("%quokka%",) * 2).fetchall() == []
    if full:
        assert left == {}
    else:
        assert set(left.values()) <= {"r", "t"}, left  # no index; at most unused space in table pages
    pg_server.drop(url)


def test_a_scrub_waits_for_a_transaction_that_could_still_see_the_erased_rows(pg_server):
    """A reader open since before the erasure (a report, a pg_dump) keeps the erased rows alive: the scrub waits
    for it instead of finishing with the rows still in the index files."""
    if pg_server.data_dir is None:
        pytest.skip("needs the embedded server's data directory (MEMSHELF_TEST_DATABASE_URL is set)")
    url = pg_server.fresh_database()
    with Shelf.open(url, embedder=None) as shelf:
        shelf.remember(A, "quokkatopic", SECRET)
        reader = psycopg.connect(url)
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert reader.execute("SELECT count(*) FROM memories").fetchone() == (1,)  # its snapshot sees the row
        shelf.forget_user(A)
        scrubbed: list[list[str]] = []
        scrubber = threading.Thread(target=lambda: scrubbed.append(shelf.store.scrub()))
        scrubber.start()
        scrubber.join(3)
        assert scrubber.is_alive()  # waiting for the reader
        reader.rollback()
        reader.close()
        scrubber.join(60)
        assert scrubbed == [["memories", "memory_pieces", "memory_words"]]  # pieces and words go with their memory
    assert set(_files_holding(pg_server.data_dir, url, [b"quokkavault", b"quokkatopic"]).values()) <= {"r", "t"}
    pg_server.drop(url)


def test_a_scrub_drops_the_invalid_copies_a_failed_reindex_left(pg_fresh_url):
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.set_fact(A, "colour", "blue")
        with psycopg.connect(pg_fresh_url) as blocker, psycopg.connect(pg_fresh_url, autocommit=True) as conn:
            blocker.execute("LOCK TABLE facts IN ROW EXCLUSIVE MODE")
            conn.execute("SET statement_timeout = '300ms'")
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("REINDEX TABLE CONCURRENTLY facts")
        with psycopg.connect(pg_fresh_url, autocommit=True) as conn:
            leftovers = "SELECT count(*) FROM pg_indexes WHERE tablename = 'facts' AND indexname LIKE '%%ccnew%%'"
            assert conn.execute(leftovers).fetchone()[0] > 0
            shelf.forget_fact(A, "colour")
            assert shelf.store.scrub() == ["fact_history", "facts"]
            assert conn.execute(leftovers).fetchone()[0] == 0


def _queued(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT relation FROM memshelf_scrub")}


def _relfilenode(url: str, relation: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT relfilenode FROM pg_class WHERE relname = %s", (relation,)).fetchone()[0]


def test_erasures_queued_by_a_stopped_store_are_scrubbed_in_the_background_by_the_next(pg_fresh_url, monkeypatch):
    monkeypatch.setenv("MEMSHELF_PG_SCRUB", "off")
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        _fill(shelf, A, "thimble")
        shelf.forget_user(A)
    assert _queued(pg_fresh_url) == {"memories", "memory_pieces", "memory_words", "facts", "fact_history", "messages"}
    words = _relfilenode(pg_fresh_url, "memory_words_pkey")
    monkeypatch.setenv("MEMSHELF_PG_SCRUB", "vacuum")
    monkeypatch.setenv("MEMSHELF_PG_SCRUB_DELAY", "0")
    store = PostgresStore(pg_fresh_url)
    try:
        deadline = time.monotonic() + 60
        while _queued(pg_fresh_url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _queued(pg_fresh_url) == set()
        assert _relfilenode(pg_fresh_url, "memory_words_pkey") != words  # reindexed into a new file
    finally:
        store.close()


def test_forgetting_a_thread_that_rewrote_a_fact_queues_the_facts_for_the_scrub(pg_fresh_url, monkeypatch):
    """The cascade puts the caller's earlier value back in the facts row (no row deleted there): the taught value's
    text is still in that table's files, so the facts table is queued too, beside the history it deleted from."""
    monkeypatch.setenv("MEMSHELF_PG_SCRUB", "off")
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.set_fact(A, "home_city", "Porto")
        said = shelf.log_message(A, "t1", "user", "I live in Quixotania now.")
        taught = shelf.set_fact(A, "home_city", "Quixotania")
        shelf.store.add_evidence(A, [Evidence("fact", "home_city", said.id, "t1", said.created_at,
                                              taught.updated_at)])
        erased = shelf.forget_thread(A, "t1", cascade=True)
        assert (erased.facts, erased.fact_changes, erased.scrub_pending) == (0, 1, True)
        assert [f.value for f in shelf.facts(A)] == ["Porto"]
        assert {"facts", "fact_history", "messages"} <= _queued(pg_fresh_url)


def test_an_erasure_says_its_scrub_is_pending_until_a_scrub_has_run(pg_fresh_url, monkeypatch):
    """Erased.scrub_pending on PostgreSQL: the erased rows wait in the table and index files for the queued
    scrub, so every face says so (here the library and HTTP's header) until Shelf.scrub() or the background
    scrub has run; a process that only reads the queue (another store) sees the same."""
    from test_server import LiveServer, bearer

    from memshelf.server import SCRUB_PENDING_HEADER, create_app

    monkeypatch.setenv("MEMSHELF_PG_SCRUB", "off")  # no background scrub: nothing runs it but the calls below
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        assert shelf.store.scrub_pending is False and shelf.scrub() is False  # nothing erased yet
        memory = shelf.remember(A, "secrets", "The vault word is xanthopsia.")
        shelf.set_fact(A, "locker", "quizzaciously")
        assert shelf.forget(A, memory.id).scrub_pending is True
        with Shelf.open(pg_fresh_url, embedder=None) as other:
            assert other.store.scrub_pending is True
        assert shelf.scrub() is False
        assert _queued(pg_fresh_url) == set() and shelf.store.scrub_pending is False
        assert shelf.forget_fact(A, "locker").scrub_pending is True
        secret, admin = shelf.create_key(A.tenant)[1], shelf.create_key(None)[1]
        second = shelf.remember(A, "secrets", "The gate word is quillwort.")
        shelf.scrub()
    with LiveServer(create_app(target=pg_fresh_url, embedder=None)) as live:
        gone = httpx.delete(f"{live.url}/v1/users/{A.user}/memories/{second.id}", headers=bearer(secret), timeout=30)
        assert gone.status_code == 204 and gone.headers[SCRUB_PENDING_HEADER] == "true"
        assert _queued(pg_fresh_url) == {"memories", "memory_pieces", "memory_words"}
        scrubbed = httpx.post(f"{live.url}/v1/admin/scrub", headers=bearer(admin), timeout=60)
        assert scrubbed.json() == {"scrub_pending": False} and _queued(pg_fresh_url) == set()
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        assert shelf.scrub(full=True) is False and _queued(pg_fresh_url) == set()


def test_an_erasure_that_committed_is_no_error_when_the_scrub_queue_cannot_be_read(pg_fresh_url, monkeypatch):
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        memory = shelf.remember(A, "secrets", "The vault word is xanthopsia.")
        store = shelf.store
        real = store._pool.connection  # type: ignore[attr-defined]
        calls = []

        def out_of_reach(*args, **kwargs):  # the erasure's own transaction gets through; the look after it not
            calls.append(1)
            if len(calls) > 1:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return real(*args, **kwargs)

        monkeypatch.setattr(store._pool, "connection", out_of_reach)  # type: ignore[attr-defined]
        assert shelf.forget(A, memory.id).scrub_pending is True
        monkeypatch.undo()
        assert shelf.search(A, "xanthopsia") == []


@pytest.mark.parametrize(("name", "value"), [("MEMSHELF_PG_SCRUB", "sometimes"), ("MEMSHELF_PG_SCRUB_DELAY", "-1"),
                                             ("MEMSHELF_PG_SCRUB_DELAY", "soon")])
def test_a_bad_scrub_setting_is_refused_before_anything_is_opened(pg_fresh_url, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        PostgresStore(pg_fresh_url)


# ---------------------------------------------------------------- migration between backends
def _populate(shelf: Shelf) -> list[Owner]:
    owners = [Owner("acme", "maya"), Owner("acme", "li"), Owner("home", "kaleb")]
    for n, owner in enumerate(owners):
        shelf.remember_many(owner, [{"topic": "t", "content": f"{owner.user} fact {i}", "source": "mined"}
                                    for i in range(25)])
        shelf.remember(owner, "t", f"{owner.user} fact 0", source="stated")  # a second observation
        shelf.remember(owner, "gone", f"{owner.user} expired", ttl=1)
        shelf.set_fact(owner, "name", owner.user)
        shelf.set_fact(owner, "name", owner.user.upper())
        for i in range(n + 2):
            shelf.log_message(owner, "thread", "user", f"hello {i}", ttl=None)
    return owners


def _exports(shelf: Shelf, owners: list[Owner]) -> list[list[dict]]:
    return [list(shelf.export(owner)) for owner in owners]


def test_migrate_sqlite_to_postgres_and_back_gives_identical_exports(pg_server, tmp_path):
    url = pg_server.fresh_database()
    clock = iter(T0 + timedelta(seconds=i) for i in range(10_000))
    with Shelf.open(str(tmp_path / "a.db"), embedder=HashEmbedder(), clock=lambda: next(clock)) as first:
        owners = _populate(first)
        first.create_key("acme", "acme key")
        original = _exports(first, owners)

    seen: list[tuple[int, int]] = []
    report = migrate(str(tmp_path / "a.db"), url, batch=10, progress=lambda done, total: seen.append((done, total)))
    assert report.owners == 3 and report.copied["memories"] == 3 * 26
    assert seen[-1][0] == seen[-1][1] and len(seen) > 3
    assert report.copied["api_keys"] == 1 and report.notes == []

    again = migrate(str(tmp_path / "a.db"), url, batch=10)  # resumable: a second run adds nothing
    assert sum(again.copied.values()) == 0

    with Shelf.open(url, embedder=HashEmbedder()) as middle:
        assert _exports(middle, owners) == original
        middle.create_key("home", "home key")
    back = migrate(url, str(tmp_path / "b.db"))
    assert back.copied["api_keys"] == 2 and back.notes == []
    with Shelf.open(str(tmp_path / "b.db"), embedder=HashEmbedder()) as last:
        assert _exports(last, owners) == original
        assert sorted(k.name for k in last.list_keys()) == ["acme key", "home key"]
    pg_server.drop(url)


def test_an_interrupted_migration_resumes_and_a_diverged_destination_is_refused(pg_server, tmp_path):
    url = pg_server.fresh_database()
    with Shelf.open(str(tmp_path / "a.db"), embedder=None) as first:
        owners = _populate(first)
    source, dest = SQLiteStore(str(tmp_path / "a.db")), PostgresStore(url)
    try:
        def interrupt(done: int, total: int) -> None:
            if done > 30:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            copy_store(source, dest, batch=10, progress=interrupt)
        copy_store(source, dest, batch=10)
        assert [owner_check(dest, o) for o in owners] == [owner_check(source, o) for o in owners]

        dest.set_fact(owners[0], "extra", "only here", "stated", T0)
        with pytest.raises(MigrationConflict, match="acme/maya.*migrate into another, empty destination"):
            copy_store(source, dest)
    finally:
        source.close()
        dest.close()
    pg_server.drop(url)


# ---------------------------------------------------------------- keyword ranking: bm25 over the owner's memories
FILLER = [f"The weekly report number {i} is filed." for i in range(12)]


def _ranked(shelf: Shelf, owner: Owner, question: str) -> list[tuple[str, float]]:
    return [(hit.memory.content, hit.score) for hit in shelf.search(owner, question, mode="keyword", limit=20)]


def test_a_rare_word_outranks_a_common_one(pg_fresh_url):
    """Inverse document frequency: 'falcon' is in one of the owner's memories, 'report' in thirteen, so the line
    with the rare word comes first although the other is newer (plain ts_rank scored them the same)."""
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.remember_many(A, [{"topic": "t", "content": text} for text in FILLER])
        shelf.remember(A, "t", "The falcon landed.")
        shelf.remember(A, "t", "The report landed.")
        ranked = _ranked(shelf, A, "falcon report")
        assert ranked[0][0] == "The falcon landed."
        assert ranked[0][1] > 2 * ranked[1][1]


def test_a_longer_memory_does_not_win_by_length(pg_fresh_url):
    """Length normalisation: one mention in a short line beats one mention in a long one, which is newer."""
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.remember(A, "t", "The falcon landed.")
        shelf.remember(A, "t", "The falcon landed on the old red barn roof near the river after a long flight over "
                               "the hills and three villages.")
        ranked = _ranked(shelf, A, "falcon")
        assert ranked[0][0] == "The falcon landed."
        assert ranked[0][1] > ranked[1][1]


def test_keyword_statistics_are_the_owners_own(pg_fresh_url):
    """The corpus is the owner's memories: another user of the same tenant, or another tenant, storing the same
    words moves neither the scores nor the order of the owner's hits (no side channel through ranking)."""
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.remember_many(A, [{"topic": "t", "content": text} for text in FILLER])
        shelf.remember(A, "t", "The falcon report is due.")
        before = _ranked(shelf, A, "falcon report")
        for other in (Owner(A.tenant, "alma"), B):
            shelf.remember_many(other, [{"topic": "t", "content": f"falcon falcon note {i}"} for i in range(50)])
        assert _ranked(shelf, A, "falcon report") == before
        assert len(shelf.search(B, "falcon", mode="keyword", limit=100)) == 50


def test_expired_and_superseded_memories_do_not_make_a_word_common(pg_fresh_url):
    """A word's document frequency counts only the memories the search can return: an owner whose other falcon
    lines expired or were superseded scores exactly like one whose expired and superseded lines said something else
    (the number of memories, the other statistic, counts every row of the owner, as FTS5's counts every row)."""
    clock = Clock()
    plain, churned = Owner("t1", "plain"), Owner("t2", "churned")
    with Shelf.open(pg_fresh_url, embedder=None, clock=clock) as shelf:
        for owner, word in ((plain, "old"), (churned, "falcon")):
            shelf.remember_many(owner, [{"topic": "t", "content": text} for text in FILLER])
            shelf.remember_many(owner, [{"topic": "t", "content": f"A {word} memo {i}.", "ttl": 60} for i in range(5)])
            shelf.remember(owner, "t", f"The {word} memo moved.")
        clock.advance(120)
        for owner, word in ((plain, "old"), (churned, "falcon")):
            shelf.remember(owner, "t", "The falcon report is due.")
            newer = shelf.remember(owner, "t", "Memos now go to Dana.")
            replaced = shelf.search(owner, f"{word} moved", mode="keyword")[0].memory
            assert shelf.store.supersede_memory(owner, replaced.id, newer.id, clock())
        assert _ranked(shelf, churned, "falcon report") == _ranked(shelf, plain, "falcon report")
        assert [text for text, _ in _ranked(shelf, churned, "falcon")] == ["The falcon report is due."]


def test_the_hybrid_side_scores_bm25_with_the_context_in_the_row_length(pg_fresh_url):
    """The hybrid's keyword candidates, scored by hand from the rows' own numbers: a term counts 1 in the row's own
    words plus CONTEXT_WEIGHT in its conversation context, and the row's length is its own words' plus all of its
    context's, as FTS5 counts every column (bm25_query's docstring)."""
    turns = ["We drove home through the hills after the long autumn fair yesterday.", "The falcon landed.",
             "It sat on the barn roof.", "Falcons nest on cliffs.", "The report is due on Friday.",
             "A falcon report came from the river bank."]
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.remember_many(A, [{"topic": "t", "content": text} for text in turns])
        store = shelf.store
        assert isinstance(store, PostgresStore)
        terms = ["falcon", "report"]
        found = store.keyword_search(A, terms, 10, datetime.now(UTC), by_confidence=False)
        with psycopg.connect(pg_fresh_url) as conn:
            rows = conn.execute(
                "SELECT content, length(search), length(coalesce(context_search, ''::tsvector)),"
                " ARRAY[search @@ q.falcon, search @@ q.report],"
                " ARRAY[coalesce(context_search @@ q.falcon, false), coalesce(context_search @@ q.report, false)]"
                " FROM memories, (SELECT to_tsquery('memshelf_text', 'falcon') AS falcon,"
                " to_tsquery('memshelf_text', 'report') AS report) q"
                " WHERE tenant = %s AND user_id = %s", (A.tenant, A.user)).fetchall()
    hits = [r for r in rows if any(r[3])]
    n, avgdl = len(rows), sum(r[1] + r[2] for r in hits) / len(hits)
    df = [sum(r[3][i] for r in hits) for i in range(len(terms))]
    expected = {}
    for content, own_length, context_length, own, near in hits:
        dl, score = own_length + context_length, 0.0
        for i in range(len(terms)):
            tf = own[i] + pg_module.CONTEXT_WEIGHT * near[i]
            idf = math.log(1 + (n - df[i] + 0.5) / (df[i] + 0.5))
            score += idf * tf * (pg_module.K1 + 1) / (tf + pg_module.K1 * (1 - pg_module.B + pg_module.B * dl / avgdl))
        expected[content] = score
    assert {s.memory.content: s.score for s in found} == pytest.approx(expected, rel=1e-9)
    assert len(expected) == 4 and any(r[2] and any(r[4]) for r in hits)  # hits with a context that matches


def _plan_nodes(node: dict) -> list[dict]:
    return [node, *(child for sub in node.get("Plans", []) for child in _plan_nodes(sub))]


@pytest.mark.parametrize("with_context", [False, True], ids=["keyword", "hybrid side"])
def test_the_keyword_statistics_are_gathered_once_per_query_not_once_per_hit(pg_fresh_url, with_context):
    """The bm25 statistics (document frequencies, average length) are one aggregate over the hits. Under row-level
    security PostgreSQL estimates one hit, and when it may inline that aggregate it recomputes it for every hit:
    quadratic in the matches (14 ms instead of 1.4 ms for 268 hits of a LoCoMo owner, BENCHMARKS.md)."""
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.remember_many(A, [{"topic": "t", "content": f"The falcon report {i} is filed."} for i in range(60)])
        store = shelf.store
        assert isinstance(store, PostgresStore)
        terms = ["falcon", "report"]
        query, params = bm25_query(terms, with_context, "rank DESC, created_at DESC, pk DESC", ("", ()), A,
                                   datetime.now(UTC), 10)
        with store._tenant(A.tenant) as cur:
            plan = cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params, prepare=False).fetchone()[0]
        nodes = _plan_nodes(plan[0]["Plan"])
        aggregates = [node for node in nodes if node["Node Type"] == "Aggregate"]
        # once, or once per word of the question (its postings counted), never once per hit
        assert aggregates and all(node["Actual Loops"] <= len(terms) for node in aggregates)
        assert max(node["Actual Rows"] for node in nodes if node.get("CTE Name") == "hits") >= 60  # enough to tell
        found = store.keyword_search(A, terms, 10, datetime.now(UTC), by_confidence=not with_context)
        assert len(found) == 10


def test_an_owners_vector_dimensions_come_through_its_index_whatever_its_share_of_the_table(pg_fresh_url):
    """Every vector search first reads the dimensions of the owner's vectors. For an owner holding half the table,
    stored after the other half, a bare LIMIT 1 let the planner scan the table from the start (it expected a match
    among the first rows): thousands of other rows read on every search. Through the owner index, a handful."""
    store = PostgresStore(pg_fresh_url)
    try:
        rng = np.random.default_rng(3)
        early, late = Owner("shared", "early"), Owner("shared", "late")
        for owner in (early, late):
            block = rng.normal(size=(3000, DIMS)).astype(np.float32)
            items = [Memory(f"{owner.user}_{j}", "t", f"note {j} of {owner.user}", "stated", 1.0, T0,
                            embed_model="test-48") for j in range(3000)]
            store.import_memories(owner, items, [pack(v) for v in block])
        with psycopg.connect(pg_fresh_url, autocommit=True) as conn:
            conn.execute("ANALYZE memories")
        with store._tenant(late.tenant) as cur:
            plan = cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + pg_module.NEWEST_DIMENSIONS,
                               (late.tenant, late.user, "test-48")).fetchone()[0]
        nodes = _plan_nodes(plan[0]["Plan"])
        scans = [node for node in nodes if "Scan" in node["Node Type"]]
        assert [node.get("Index Name") for node in scans] == ["memories_owner_created"], scans
        assert sum(node.get("Rows Removed by Filter", 0) for node in scans) == 0
        assert store.vector_dimensions(late, "test-48") == DIMS
    finally:
        store.close()


# ---------------------------------------------------------------- remember_many in a few statements
def _rows(url: str, owner: Owner) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT topic, content, source, confidence, observations, expires_at, embed_model, embedding::text,"
            " context_search::text, (SELECT count(*) FROM memory_pieces p WHERE p.memory_pk = m.pk)"
            " FROM memories m WHERE tenant = %s AND user_id = %s ORDER BY pk", (owner.tenant, owner.user)).fetchall()


def test_a_batch_stores_what_remembering_one_at_a_time_stores(pg_fresh_url):
    """add_memories writes a batch's new rows with one COPY and one INSERT; the rows, their conversation contexts
    and pieces, and the memories returned are what one remember_many call per item gives. A repeat, of a stored
    memory or of one earlier in the batch, is another observation of it, in the order given."""
    embedder = HashEmbedder(window_chars=60)
    batched, single = Owner("t", "batched"), Owner("t", "single")
    first = [{"topic": "s1", "content": "The boiler is in the cellar."}]
    items = [{"topic": f"s{n % 3}", "content": f"Turn {n} is about the boiler {n % 4}.",
              "source": ("stated", "mined", "inferred")[n % 3]} for n in range(12)]
    items += [{"topic": "s1", "content": "The boiler is in the cellar.", "source": "mined"},  # stored before
              {"topic": "s0", "content": "Turn 0 is about the boiler 0.", "ttl": 3600},  # earlier in the batch
              {"topic": "s2", "content": "A long note. " + "The pump and the valve sit by the boiler. " * 5}]
    with Shelf.open(pg_fresh_url, embedder=embedder) as shelf:
        for owner in (batched, single):
            shelf.remember_many(owner, first)
        together = shelf.remember_many(batched, items)
        apart = [shelf.remember_many(single, [item])[0] for item in items]
    assert [(m.topic, m.content, m.source, m.observations, m.expires_at is None) for m in together] == \
           [(m.topic, m.content, m.source, m.observations, m.expires_at is None) for m in apart]
    assert together[13].id == together[0].id and together[13].observations == 2
    assert _rows(pg_fresh_url, batched) == _rows(pg_fresh_url, single)
    assert _rows(pg_fresh_url, batched)[-1][-1] > 0  # the long note's later pieces


def test_a_text_another_writer_stored_meanwhile_is_observed_not_lost(pg_fresh_url, monkeypatch):
    """Between the look for stored texts and the INSERT another transaction may store the same text: the INSERT
    skips it, and the batch observes that row instead (here the look is made to miss it)."""
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        stored = shelf.remember(A, "t", "The key is under the mat.")
        held = PostgresStore._held
        calls = []

        def missing_once(cur, owner, keys):
            calls.append(keys)
            return {} if len(calls) == 1 else held(cur, owner, keys)

        monkeypatch.setattr(PostgresStore, "_held", staticmethod(missing_once))
        again, new = shelf.remember_many(A, [{"topic": "t", "content": "The key is under the mat."},
                                             {"topic": "t", "content": "The door sticks."}])
    assert again.id == stored.id and again.observations == 2
    assert new.content == "The door sticks." and new.observations == 1


# ---------------------------------------------------------------- the words' btree (m015)
WORD_TEXTS = [
    ("office", "The office printer is on 192.168.1.40."), ("office", "Printing manuals live on the shelf."),
    ("travel", "Kaleb lives in Zürich."), ("travel", "Kaleb flew to Zu\u0308rich in March."),
    ("travel", "அவர் சென்னையில் வசிக்கிறார்."), ("office", "東京の事務所は三階です。"),
    ("email", "Don't e-mail the quarterly report before Friday."), ("garden", "The quokka visits the garden."),
]
WORD_QUESTIONS = [["printer"], ["print"], ["192", "168"], ["zurich"], ["zürich", "march"], ["சென்னையில்"],
                  ["事務", "務所"], ["e", "mail"], ["don"], ["quokka", "garden"], ["office"], ["absent"], ["the"],
                  ["kaleb", "friday", "shelf"]]


def _memory_words(url: str, condition: str = "true") -> list[tuple]:
    return _raw_rows("postgres", url,
                     f"SELECT tenant, user_id, word FROM memory_words WHERE {condition} ORDER BY 1, 2, 3")


def test_keyword_search_finds_the_same_through_the_words_btree_as_through_every_row(pg_fresh_url, monkeypatch):
    """A question's hits come from memory_words' postings when they are few and from every row of the owner
    otherwise: the same memories with the same scores either way, for every kind of word (prefixes, numbers, marks,
    CJK pairs, words a hyphen or an apostrophe splits), whatever changed the rows since."""
    other = Owner(A.tenant, "another")
    clock = Clock()
    with Shelf.open(pg_fresh_url, embedder=None, clock=clock) as shelf:
        kept = [shelf.remember(A, topic, content) for topic, content in WORD_TEXTS]
        shelf.remember(other, "garden", "The quokka of another user.")
        shelf.remember(B, "garden", "The quokka of another tenant.")
        shelf.remember(A, "garden", "The quokka leaves at noon.", ttl=60)  # expires
        gone = shelf.remember(A, "garden", "The garden quokka xanthopsia is forgotten.")
        shelf.forget(A, gone.id)
        with psycopg.connect(pg_fresh_url) as conn:  # a row's words follow its text, however it changed
            conn.execute("UPDATE memories SET content = 'The office printer moved to 192.168.1.41 today.'"
                         " WHERE id = %s", (kept[0].id,))
        clock.advance(300)
        now, store = shelf.now(), shelf.store
        assert isinstance(store, PostgresStore)
        answers = {}
        monkeypatch.setattr(pg_module, "WORDS_MIN_ROWS", 0)  # this small owner's statement has both ways too
        for share in (0.0, 1e9):  # every row of the owner; the postings, whatever their number
            monkeypatch.setattr(pg_module, "WORDS_SHARE", share)
            answers[share] = [[(s.memory.content, round(s.score, 9)) for s in
                               store.keyword_search(A, terms, 10, now, by_confidence=by_confidence)]
                              for terms in WORD_QUESTIONS for by_confidence in (True, False)]
        assert answers[0.0] == answers[1e9]
        found = dict(zip([" ".join(t) for t in WORD_QUESTIONS], answers[1e9][::2]))
        assert [c for c, _ in found["printer"]] == ["The office printer moved to 192.168.1.41 today."]
        assert [c for c, _ in found["192 168"]] == ["The office printer moved to 192.168.1.41 today."]
        assert {c for c, _ in found["print"]} == {"The office printer moved to 192.168.1.41 today.",
                                                 "Printing manuals live on the shelf."}
        assert len(found["zurich"]) == 2 and len(found["சென்னையில்"]) == 1 and len(found["事務 務所"]) == 1
        assert [c for c, _ in found["quokka garden"]] == ["The quokka visits the garden."]
        assert found["absent"] == []
        assert _memory_words(pg_fresh_url, "word ^@ 'xanthops'") == []  # the forgotten memory's words went with it
        assert _memory_words(pg_fresh_url, "word = '40'") == []  # and the changed row's old ones
        assert ("tenant-a", "alice", "41") in _memory_words(pg_fresh_url)
        assert _memory_words(pg_fresh_url, "word = 'noon'") != []
        shelf.purge_expired()
        assert _memory_words(pg_fresh_url, "word = 'noon'") == []  # an expired memory's, once purged
        shelf.forget_user(other)
        shelf.forget_tenant(B.tenant)
        assert _memory_words(pg_fresh_url, "user_id = 'another' OR tenant = 'tenant-b'") == []
        with psycopg.connect(pg_fresh_url) as conn:  # every word left is a word of a memory still stored
            assert conn.execute("SELECT count(*) FROM memory_words w WHERE NOT EXISTS (SELECT 1 FROM memories m"
                                " WHERE m.pk = w.memory_pk AND w.word = ANY(tsvector_to_array(m.search)))"
                                ).fetchone() == (0,)
            assert conn.execute("SELECT sum(length(search)) FROM memories").fetchone()[0] == len(
                _memory_words(pg_fresh_url))


def _memories_read(store: PostgresStore, terms: list[str], **bounds: float) -> int:
    """How many of the memories' rows a keyword search of `terms` by Alice reads to find its hits."""
    query, params = bm25_query(terms, False, "confidence DESC, rank DESC, created_at DESC, pk DESC",
                               ("", ()), A, datetime.now(UTC), 5, **bounds)  # type: ignore[arg-type]
    with store._tenant(A.tenant) as cur:
        plan = cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params, prepare=False).fetchone()[0]
    hits = next(node for node in _plan_nodes(plan[0]["Plan"]) if node.get("Subplan Name") == "CTE hits")
    return sum(node["Actual Rows"] * node["Actual Loops"] for node in _plan_nodes(hits)
               if node.get("Relation Name") == "memories")


def test_a_rare_word_is_read_through_its_postings_and_a_common_one_from_every_row(pg_fresh_url):
    """The postings pay only when they skip most of the owner's rows (WORDS_SHARE): a rare word's hits are read by
    their keys, and a word in most rows reads the owner's rows once instead of each hit through the index."""
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.remember_many(A, [{"topic": "t", "content": f"The falcon report {i} is filed."} for i in range(300)])
        shelf.remember(A, "t", "The quokka report is late.")
        store = shelf.store
        assert isinstance(store, PostgresStore)
        assert _memories_read(store, ["quokka"]) == 1
        assert _memories_read(store, ["falcon"]) >= 300
        assert [s.memory.content for s in store.keyword_search(A, ["quokka"], 5, datetime.now(UTC), True)] == [
            "The quokka report is late."]


def test_a_common_words_newest_matches_are_ranked_with_every_match_of_the_rarer_words(pg_fresh_url, monkeypatch):
    """A term whose own word has more than RANKED postings is common: only its newest matches are ranked, beside
    every match of the question's rarer words, so a question of a common word reads a bounded number of rows
    however many hold it, and the rare word's old match still comes first."""
    monkeypatch.setattr(pg_module, "RANKED", 20)
    monkeypatch.setattr(pg_module, "NEWEST_RANKED", 6)
    monkeypatch.setattr(pg_module, "WORDS_MIN_ROWS", 0)
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.remember(A, "t", "The quokka report is late.")  # the oldest row
        shelf.remember_many(A, [{"topic": "t", "content": f"The falcon report {i} is filed."} for i in range(60)])
        store = shelf.store
        assert isinstance(store, PostgresStore)
        assert _memories_read(store, ["report"], bound=20, newest=6) == 6  # the newest six of 61
        assert _memories_read(store, ["report", "quokka"], bound=20, newest=6) == 7
        assert _memories_read(store, ["report"]) == 61  # unbounded, as before: every row
        found = store.keyword_search(A, ["report", "quokka"], 3, shelf.now(), True)
        assert [s.memory.content for s in found] == ["The quokka report is late.", "The falcon report 59 is filed.",
                                                     "The falcon report 58 is filed."]
        newest = [s.memory.content for s in store.keyword_search(A, ["falcon"], 10, shelf.now(), True)]
        assert newest == [f"The falcon report {i} is filed." for i in range(59, 49, -1)]  # the limit, if more


def test_a_bounded_keyword_search_ranks_every_match_when_the_newest_cannot_be_the_answer(pg_fresh_url, monkeypatch):
    """When too few of a common word's newest matches are current, or an older match may be more confident than
    the last hit, every match is ranked: the bound never loses a hit or lets a guess outrank a statement."""
    monkeypatch.setattr(pg_module, "RANKED", 20)
    monkeypatch.setattr(pg_module, "NEWEST_RANKED", 6)
    monkeypatch.setattr(pg_module, "WORDS_MIN_ROWS", 0)
    clock = Clock()
    with Shelf.open(pg_fresh_url, embedder=None, clock=clock) as shelf:
        shelf.remember_many(A, [{"topic": "t", "content": f"The heron report {i} is stated."} for i in range(30)])
        shelf.remember_many(A, [{"topic": "t", "content": f"The heron report {i} is a guess.", "source": "inferred"}
                                for i in range(30)])
        shelf.remember_many(A, [{"topic": "t", "content": f"The heron report {i} goes soon.", "ttl": 60}
                                for i in range(30)])
        store = shelf.store
        assert isinstance(store, PostgresStore)
        found = store.keyword_search(A, ["heron"], 8, shelf.now(), True)  # the newest are stated, for now
        assert [s.memory.content for s in found] == [f"The heron report {i} goes soon." for i in range(29, 21, -1)]
        clock.advance(120)  # the newest thirty expire: the next newest are guesses, the statements older still
        found = store.keyword_search(A, ["heron"], 8, shelf.now(), True)
        assert [s.memory.content for s in found] == [f"The heron report {i} is stated." for i in range(29, 21, -1)]
        shelf.purge_expired()  # now the newest six are guesses, five enough for the limit
        found = store.keyword_search(A, ["heron"], 5, shelf.now(), True)
        assert [s.memory.content for s in found] == [f"The heron report {i} is stated." for i in range(29, 24, -1)]
        hybrid = store.keyword_search(A, ["heron"], 40, shelf.now(), False)  # more than the guesses among the newest
        assert len(hybrid) == 40 and {s.memory.source for s in hybrid} == {"stated", "inferred"}


def test_a_database_from_before_m015_gets_every_rows_words_once_opened(pg_server, monkeypatch):
    url = pg_server.empty_database()
    monkeypatch.setattr(pg_module, "MIGRATIONS", [m for m in MIGRATIONS if m[0] < "m015"])  # as it was then
    with Shelf(PostgresStore(url), embedder=None) as shelf:
        shelf.remember(A, "garden", "The quokka visits the garden.")
        shelf.remember(B, "office", "The printer is on the third floor.")
    monkeypatch.undo()
    monkeypatch.setattr(pg_module, "WORDS_SHARE", 1e9)  # through the postings only
    monkeypatch.setattr(pg_module, "WORDS_MIN_ROWS", 0)
    with Shelf(PostgresStore(url), embedder=None) as shelf:
        assert "m015_memory_words" in shelf.store.applied_migrations()  # type: ignore[attr-defined]
        assert [h.memory.content for h in shelf.search(A, "quokka")] == ["The quokka visits the garden."]
        assert [h.memory.content for h in shelf.search(B, "printer floor")] == ["The printer is on the third floor."]
        assert list(shelf.search(B, "quokka")) == []
    assert ("tenant-b", "bob", "third") in _memory_words(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE memory_words")  # the words and owners leave no sample in the planner's statistics
        assert conn.execute("SELECT attname FROM pg_stats WHERE tablename = 'memory_words'").fetchall() == [
            ("memory_pk",)]
        assert conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname = 'memories_search'").fetchone() == (0,)
    pg_server.drop(url)


def test_a_large_owners_keyword_search_runs_one_generic_plan_with_the_same_answers(pg_fresh_url, monkeypatch):
    """The statement that can read memory_words is prepared and runs its generic plan (planning it was a quarter of
    its time); inside a caller's transaction it is planned for the question, as before. Both answer the same, in
    every way the statement can take: common and rare words, a prefix, no match, the hybrid's context, the past."""
    monkeypatch.setattr(pg_module, "WORDS_MIN_ROWS", 0)
    monkeypatch.setattr(pg_module, "RANKED", 6)
    monkeypatch.setattr(pg_module, "NEWEST_RANKED", 3)
    clock = Clock()
    store = PostgresStore(pg_fresh_url, pool_size=1)  # one connection: its prepared statements can be read
    with Shelf(store, embedder=None, clock=clock) as shelf:
        shelf.remember_many(A, [{"topic": "garden", "content": f"The garden hose {i} leaks near the shed."}
                                for i in range(12)])
        clock.advance(3600)
        old = shelf.remember(A, "tools", "The ladder is behind the gardenias.", "inferred")
        new = shelf.remember(A, "tools", "The ladder is in the garage.")
        store.supersede_memory(A, old.id, new.id, clock())
        before = clock() - timedelta(minutes=30)
        questions = [["garden"], ["garden", "shed"], ["ladder"], ["gard"], ["zebra"], ["hose", "ladder", "garage"]]

        def answers() -> list[list[tuple[str, float]]]:
            found = []
            for terms in questions:
                for by_confidence, view in ((True, CURRENT), (False, CURRENT), (True, View(before, False)),
                                            (True, View(None, True))):
                    found.append([(s.memory.id, round(s.score, 9))
                                  for s in store.keyword_search(A, terms, 5, clock(), by_confidence, view)])
            return found

        generic = answers()
        with store.atomic():  # a caller's transaction: each question planned for itself, nothing prepared
            planned = answers()
        assert generic == planned and any(generic) and not all(generic)
        with store._tenant(A.tenant) as cur:
            plans = cur.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                                " WHERE statement LIKE '%memory_words%'").fetchall()
        assert plans and all(g > 0 and c == 0 for g, c in plans), plans


def test_an_owner_known_to_be_small_is_searched_without_the_words(pg_fresh_url, monkeypatch):
    """The store keeps each owner's row count from its last keyword search (counted before its first one): an owner
    below WORDS_MIN_ROWS gets the statement with only the scan of its rows (cheaper to plan and run at a few hundred
    rows), a larger one the statement that can read the postings, with the same answer."""
    used: list[bool] = []

    def spy(*args, **kwargs):
        used.append(kwargs["words"])
        return bm25_query(*args, **kwargs)

    monkeypatch.setattr(pg_module, "bm25_query", spy)
    monkeypatch.setattr(pg_module, "WORDS_MIN_ROWS", 30)
    with Shelf.open(pg_fresh_url, embedder=None) as shelf:
        shelf.remember_many(A, [{"topic": "t", "content": f"The falcon report {i} is filed."} for i in range(20)])
        store = shelf.store
        assert isinstance(store, PostgresStore)

        def ask() -> list[tuple[str, float]]:
            return [(s.memory.content, s.score) for s in store.keyword_search(A, ["report"], 5, shelf.now(), True)]

        first = ask()
        assert used == [False] and store._owner_rows[A] == 20  # counted first: small, from its first search
        monkeypatch.setattr(store, "_owner_rows", {})
        monkeypatch.setattr(pg_module, "WORDS_MIN_ROWS", 20)
        second = ask()
        assert used == [False, True] and first == second and len(first) == 5 and store._owner_rows[A] == 20
        monkeypatch.setattr(pg_module, "WORDS_MIN_ROWS", 30)
        assert store.keyword_search(A, ["absent"], 5, shelf.now(), True) == [] and store._owner_rows[A] == 20
        shelf.remember_many(A, [{"topic": "t", "content": f"The heron report {i} is late."} for i in range(20)])
        ask()  # still small by the hint, which now learns the owner's 40 rows
        assert store._owner_rows[A] == 40
        ask()
        assert used[-2:] == [False, True]
