"""SQLite storage correctness: the full-text index stays exact through every kind of write and thousands of
erasures, erasure never holds writers behind a reader, and every SQLite error becomes the memshelf error that says
what happened (busy: retry; bad data: fix it; anything else: what SQLite said)."""

from __future__ import annotations

import json
from memshelf.stores.sqlite import sqlite3  # the store's own SQLite: another in this process must not open its files
import threading
import time
from datetime import datetime, timedelta, UTC
from pathlib import Path

import httpx
import pytest

from fakes import HashEmbedder
from test_sqlite import file_bytes
from memshelf import InvalidInput, Owner, Shelf, StoreError, StoreUnavailable
from memshelf.model import NewMemory
from memshelf.server import create_app
from memshelf.stores import sqlite as sqlite_store
from memshelf.stores.sqlite import SQLiteStore
from memshelf.stores._sqlite_schema import MIGRATIONS

KALEB = Owner("home", "kaleb")
MAYA = Owner("home", "maya")


def assert_index_consistent(db: Path) -> None:
    """Each tenant's full-text tables index exactly that tenant's rows, once each: FTS5's integrity-check against
    the content (run on a copy whose memories table holds only that tenant's rows, since the content table is
    shared), for every owner as many index entries as rows, and the tenant's row count (fts_tenants.rows) right."""
    copy = sqlite3.connect(":memory:", isolation_level=None)
    with sqlite3.connect(db) as source:
        source.backup(copy)
    counted = copy.execute("SELECT tenant, rows, (SELECT count(*) FROM memories m WHERE m.tenant = f.tenant)"
                           " FROM fts_tenants f").fetchall()
    assert [(tenant, rows) for tenant, rows, _ in counted] == [(tenant, real) for tenant, _, real in counted]
    tables = {r[0]: (r[1], r[2]) for r in copy.execute("SELECT tenant, words, context FROM fts_tenants")}
    with_rows = {r[0] for r in copy.execute("SELECT DISTINCT tenant FROM memories")}
    assert with_rows <= set(tables), f"tenants without full-text tables: {with_rows - set(tables)}"
    for tenant, names in tables.items():
        copy.execute("BEGIN")
        copy.execute("DELETE FROM memories WHERE tenant != ?", (tenant,))
        rows = copy.execute("SELECT count(*) FROM memories").fetchone()[0]
        owners = copy.execute("SELECT owner_tag, count(*) FROM memories GROUP BY owner_tag").fetchall()
        for name in names:
            try:
                copy.execute(f"INSERT INTO {name} ({name}, rank) VALUES ('integrity-check', 1)")
            except sqlite3.DatabaseError as exc:
                raise AssertionError(f"{name} of tenant {tenant!r} fails FTS5's integrity-check: {exc}") from exc
            assert copy.execute(f"SELECT count(*) FROM {name}_docsize").fetchone()[0] == rows, (tenant, name)
            for tag, count in owners:
                indexed = copy.execute(f"SELECT count(*) FROM {name} WHERE {name} MATCH ?",
                                       (f'owner_tag : "{tag}"',)).fetchone()[0]
                assert indexed == count, (tenant, name, tag)
        copy.execute("ROLLBACK")
    copy.close()


# ---------------------------------------------------------------------------------------------- index integrity

def test_the_first_memory_of_a_tenant_is_indexed_once(tmp_path):
    db = tmp_path / "memory.db"
    printer, router = "The printer is on the second floor.", "The router is in the cupboard."
    with Shelf.open(db, embedder=None) as shelf:
        shelf.remember(KALEB, "network", printer)
        assert_index_consistent(db)
        shelf.remember(KALEB, "network", router)
        assert_index_consistent(db)
        with Shelf.open(tmp_path / "other.db", embedder=None) as other:  # the same rows, the router first
            other.remember(KALEB, "network", router)
            other.remember(KALEB, "network", printer)
            # bm25 counted the tenant's first row twice: then the order of the writes moved the scores
            assert shelf.search(KALEB, "printer")[0].score == other.search(KALEB, "printer")[0].score


def test_the_index_matches_the_rows_after_every_kind_of_write(tmp_path, clock):
    db = tmp_path / "memory.db"
    embedder = HashEmbedder()
    shelf = Shelf.open(db, embedder=None, clock=clock)
    writes = {
        "remember": lambda: shelf.remember(KALEB, "chat", "The printer is old."),
        "remember more": lambda: shelf.remember_many(MAYA, [{"topic": "chat", "content": f"Maya said {i}."}
                                                            for i in range(5)]),
        "repeat": lambda: shelf.remember(KALEB, "chat", "The printer is old."),
        "expiring": lambda: shelf.remember(KALEB, "chat", "The code is 1234 today.", ttl=10),
        "import": lambda: shelf.import_(Owner("other", "ann"), (json.loads(line) for line in
                                                               _export_lines(shelf, KALEB))),
        "forget": lambda: shelf.forget(MAYA, shelf.list_memories(MAYA)[0][0].id),
        "purge": lambda: (clock.advance(60), shelf.purge_expired()),
        "set_vectors": lambda: Shelf(shelf.store, embedder=embedder).backfill(),
        "forget_user": lambda: shelf.forget_user(MAYA),
        "forget_tenant": lambda: shelf.forget_tenant("other"),
    }
    for name, write in writes.items():
        write()
        try:
            assert_index_consistent(db)
        except AssertionError as exc:
            raise AssertionError(f"after {name}: {exc}") from exc
    assert [h.memory.content for h in shelf.search(KALEB, "printer")] == ["The printer is old."]
    shelf.close()


def _export_lines(shelf: Shelf, owner: Owner) -> list[str]:
    return [json.dumps(record) for record in shelf.export(owner)]


def test_upgrading_repairs_a_double_indexed_tenant(tmp_path, monkeypatch):
    """A file written before m005: each tenant's first memory indexed twice, and levels piled up by full merges.
    Opening it with this version rebuilds each tenant's tables from that tenant's rows only."""
    db = tmp_path / "memory.db"
    # the file before m005, with the columns this version reads (m008 and later) so that it can write to it
    monkeypatch.setattr(sqlite_store, "MIGRATIONS", [*MIGRATIONS[:4], *(m for m in MIGRATIONS if m[0] >= "m008")])
    old = SQLiteStore(str(db))
    shelf = Shelf(old, embedder=None)
    for owner in (KALEB, Owner("acme", "ann")):
        shelf.remember(owner, "network", f"{owner.user} says the printer is old.")
        shelf.remember(owner, "network", f"{owner.user} says the router is new.")
    with old.atomic():  # what older versions did: the first row indexed again, then a full merge per erasure
        for tenant, words, context in old._q("SELECT tenant, words, context FROM fts_tenants").fetchall():
            pk, topic, content, tag, ctx = old._q("SELECT pk, topic, content, owner_tag, context FROM memories"
                                                  " WHERE tenant = ? ORDER BY pk LIMIT 1", (tenant,)).fetchone()
            old._q(f"INSERT INTO {words} (rowid, topic, content, owner_tag) VALUES (?, ?, ?, ?)",
                   (pk, topic, content, tag))
            old._q(f"INSERT INTO {context} (rowid, topic, content, owner_tag, context) VALUES (?, ?, ?, ?, ?)",
                   (pk, topic, content, tag, ctx))
            for _ in range(3):
                old._q(f"INSERT INTO {words} ({words}) VALUES ('optimize')")
    old.close()
    with pytest.raises(AssertionError):
        assert_index_consistent(db)
    monkeypatch.setattr(sqlite_store, "MIGRATIONS", MIGRATIONS)
    with Shelf.open(db, embedder=None) as shelf:
        assert "m005_fts_reindex" in shelf.store.applied_migrations()  # type: ignore[attr-defined]
        assert_index_consistent(db)
        assert len(shelf.search(KALEB, "printer router")) == 2
        shelf.remember(KALEB, "network", "The scanner is broken.")
        assert_index_consistent(db)


@pytest.mark.slow
def test_thousands_of_forgets_in_one_tenant_leave_everything_working(tmp_path):
    """Every erasure scrubs the index with a full merge; on SQLite 3.40 each one added levels, and after about a
    thousand forgets in one tenant its tables read as corrupt: remember, forget and even forget_tenant failed."""
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    shelf.store._connection().execute("PRAGMA synchronous = OFF")  # type: ignore[attr-defined]  # fsync is not
    # under test here, and took four fifths of the time
    ann, bob = Owner("acme", "ann"), Owner("acme", "bob")
    kept = shelf.remember_many(bob, [{"topic": "notes", "content": f"Bob keeps note {i}."} for i in range(50)])
    doomed = shelf.remember_many(ann, [{"topic": "notes", "content": f"Ann's note {i} says quokka{i}x."}
                                       for i in range(2_100)])
    for memory in doomed[:2_000]:
        shelf.forget(ann, memory.id)
    assert_index_consistent(db)
    assert b"quokka1234x" not in file_bytes(db) and b"quokka7x" not in file_bytes(db)
    assert len(shelf.search(ann, "note", limit=1000)) == 100
    shelf.remember(ann, "notes", "Ann's fresh note about a wombat.")
    assert shelf.search(ann, "wombat")[0].memory.content == "Ann's fresh note about a wombat."
    shelf.forget(bob, kept[0].id)
    assert_index_consistent(db)
    assert shelf.forget_user(ann).memories == 101
    assert_index_consistent(db)
    assert shelf.forget_tenant("acme").memories == 49
    assert_index_consistent(db)
    shelf.close()


# ---------------------------------------------------------------------------------------------- scrub and readers

def _hold_a_reader(db: Path) -> sqlite3.Connection:
    """Another connection in the middle of a read transaction (what a backup, a shell or a second process does)."""
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM memories").fetchone()
    return reader


def test_an_erasure_behind_a_reader_returns_at_once_and_scrubs_after_it(tmp_path):
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    for i in range(100):
        shelf.remember(MAYA, "filler", f"Filler statement number {i}.")
    secret = shelf.remember(KALEB, "secrets", "The vault word is xanthopsia.")
    shelf.set_fact(KALEB, "locker", "quizzaciously")
    reader = _hold_a_reader(db)
    started = time.monotonic()
    erased = shelf.forget(KALEB, secret.id)
    assert time.monotonic() - started < 2  # it waited 30 s (the busy timeout) before
    assert erased.scrub_pending and erased.as_dict()["scrub_pending"] is True
    started = time.monotonic()
    shelf.remember(MAYA, "chat", "Another writer is not held either.")
    assert shelf.forget_fact(KALEB, "locker").scrub_pending
    assert time.monotonic() - started < 2
    assert list(shelf.search(KALEB, "xanthopsia")) == []  # gone from every read at once
    reader.close()
    finished = shelf.forget_user(Owner("home", "nobody"))  # the next erasure finishes the scrub
    assert not finished.scrub_pending and not shelf.store.scrub_pending
    leftover = file_bytes(db)  # before close: the scrub, not closing the file, removed them
    assert b"xanthopsia" not in leftover and b"quizzaciously" not in leftover
    assert b"Filler statement number 7." in leftover
    shelf.close()


def test_a_pending_scrub_is_finished_by_the_next_write(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_store, "SCRUB_RETRY_S", 0.0)
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    for i in range(100):
        shelf.remember(MAYA, "filler", f"Filler statement number {i}.")
    secret = shelf.remember(KALEB, "secrets", "The vault word is xanthopsia.")
    reader = _hold_a_reader(db)
    assert shelf.forget(KALEB, secret.id).scrub_pending
    assert b"xanthopsia" in file_bytes(db)  # the reader's snapshot still needs those pages
    reader.close()
    shelf.remember(MAYA, "chat", "Any write will do.")
    assert not shelf.store.scrub_pending
    assert b"xanthopsia" not in file_bytes(db)
    shelf.close()


def test_http_erasures_behind_a_reader_say_the_scrub_is_pending(tmp_path):
    """DELETE of one memory or fact answers 204 with no body; a header carries what Erased.scrub_pending says."""
    from test_server import LiveServer, bearer

    from memshelf.server import SCRUB_PENDING_HEADER, create_app

    db = tmp_path / "memory.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key("home")[1]
        first = shelf.remember(KALEB, "secrets", "The vault word is xanthopsia.")
        second = shelf.remember(KALEB, "secrets", "The gate word is quillwort.")
        shelf.set_fact(KALEB, "locker", "quizzaciously")
    with LiveServer(create_app(target=str(db), embedder=None)) as live, \
            httpx.Client(base_url=live.url, headers=bearer(secret), timeout=30) as client:
        gone = client.delete(f"/v1/users/kaleb/memories/{first.id}")
        assert gone.status_code == 204 and SCRUB_PENDING_HEADER not in gone.headers
        reader = _hold_a_reader(db)
        held = client.delete(f"/v1/users/kaleb/memories/{second.id}")
        assert held.status_code == 204 and held.headers[SCRUB_PENDING_HEADER] == "true"
        fact = client.delete("/v1/users/kaleb/facts/locker")
        assert fact.status_code == 204 and fact.headers[SCRUB_PENDING_HEADER] == "true"
        reader.close()


def test_forget_fact_removes_the_key_and_values_from_the_files(tmp_path):
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    shelf.remember(MAYA, "filler", "Something to keep.")
    shelf.set_fact(KALEB, "zygomorphic_key", "first quillwort value")
    shelf.set_fact(KALEB, "zygomorphic_key", "second quillwort value")
    assert b"quillwort" in file_bytes(db)
    shelf.forget_fact(KALEB, "zygomorphic_key")
    leftover = file_bytes(db)  # the shelf is still open: no close-time checkpoint helps
    assert b"quillwort" not in leftover and b"zygomorphic" not in leftover
    assert b"Something to keep." in leftover
    shelf.close()


@pytest.mark.parametrize("erase", ["forget_user", "forget_thread"])
def test_what_was_learned_from_a_thread_leaves_the_files_with_it(tmp_path, erase):
    """Learning keeps the thread's name (its watermark, its evidence rows), the values it set and the memories it
    wrote: erasing the owner, or the thread with cascade, takes every byte of them out of the file."""
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    for i in range(200):  # another user's rows, enough to give the full-text index several pages
        shelf.remember(MAYA, "filler", f"Filler statement number {i} about the weather.")
    shelf.log_message(KALEB, "quokkathread", "user", "I live in Quokkaville. Remember that my locker is quokkasafe.")
    shelf.log_message(KALEB, "other", "user", "I work at Acme.")
    shelf.learn(KALEB, thread="quokkathread")
    shelf.learn(KALEB, thread="other")
    assert {f.key for f in shelf.facts(KALEB)} == {"home_city", "employer"} and shelf.list_memories(KALEB)[0]
    assert b"quokkathread" in file_bytes(db) and b"Quokkaville" in file_bytes(db)
    if erase == "forget_user":
        shelf.forget_user(KALEB)
    else:
        erased = shelf.forget_thread(KALEB, "quokkathread", cascade=True)
        assert (erased.memories, erased.facts, erased.messages) == (1, 1, 1)
        assert [f.key for f in shelf.facts(KALEB)] == ["employer"]  # learned in another thread: kept
    leftover = file_bytes(db)  # the shelf is still open: no close-time checkpoint helps
    for needle in (b"quokkathread", b"Quokkaville", b"quokkasafe"):
        assert needle not in leftover, needle
    assert b"Filler statement number 7 " in leftover  # the file is readable text: the check can fail
    shelf.close()


# ---------------------------------------------------------------------------------------------- errors

def _hold_the_write_lock(db: Path) -> sqlite3.Connection:
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    return writer


def test_a_locked_file_is_retryable_and_writes_nothing(tmp_path):
    db = tmp_path / "memory.db"
    shelf = Shelf(SQLiteStore(str(db), busy_timeout_ms=200), embedder=None)
    shelf.remember(KALEB, "t", "Before the lock.")
    writer = _hold_the_write_lock(db)
    with pytest.raises(StoreUnavailable, match="busy.*retry"):
        shelf.remember(KALEB, "t", "During the lock.")
    writer.close()
    assert [m.content for m in shelf.list_memories(KALEB)[0]] == ["Before the lock."]
    shelf.remember(KALEB, "t", "After the lock.")  # the same call succeeds once the lock is gone
    assert_index_consistent(db)
    shelf.close()


def test_migrations_on_a_locked_file_are_retryable(tmp_path):
    db = tmp_path / "memory.db"
    sqlite3.connect(db).close()
    writer = _hold_the_write_lock(db)
    with pytest.raises(StoreUnavailable):
        SQLiteStore(str(db), busy_timeout_ms=100)
    writer.close()
    store = SQLiteStore(str(db), busy_timeout_ms=100)
    assert store.applied_migrations() == [name for name, _ in MIGRATIONS]
    store.close()


def test_bad_data_is_invalid_input_and_writes_nothing(tmp_path):
    db = tmp_path / "memory.db"
    store = SQLiteStore(str(db))
    good = NewMemory("t", "A fine memory.", "stated", 1.0, None)
    nan = NewMemory("t", "A memory with no confidence.", "stated", float("nan"), None)
    with pytest.raises(InvalidInput, match="refused a value"):
        store.add_memories(KALEB, [good, nan], good.created_at)
    assert store.stats()["memories"] == 0
    assert_index_consistent(db)
    store.close()


def test_a_failed_rollback_does_not_hide_the_first_error(tmp_path):
    """When ROLLBACK itself fails (here SQLite interrupts it), the caller sees the error that made atomic() roll
    back, not the rollback's; and the transaction is gone all the same."""
    shelf = Shelf.open(tmp_path / "memory.db", embedder=None)
    shelf.remember(KALEB, "t", "Still here afterwards.")
    store = shelf.store
    with pytest.raises(ZeroDivisionError):
        with store.atomic():
            store._q("DELETE FROM memories")  # type: ignore[attr-defined]
            store._connection().set_progress_handler(lambda: 1, 1)  # type: ignore[attr-defined]  # every statement
            1 / 0  # noqa: B018
    assert [m.content for m in shelf.list_memories(KALEB)[0]] == ["Still here afterwards."]
    shelf.remember(KALEB, "t", "And the store still writes.")
    shelf.close()


def test_a_full_disk_is_a_store_error_that_says_so(tmp_path):
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    shelf.remember(KALEB, "t", "Before the disk filled up.")
    conn = shelf.store._connection()  # type: ignore[attr-defined]
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
    with pytest.raises(StoreError, match="disk .* is full") as caught:
        shelf.remember(KALEB, "t", "x" * 15_000)
    assert not isinstance(caught.value, StoreUnavailable)  # retrying the same call cannot help
    conn.execute("PRAGMA max_page_count = 1073741823")
    shelf.remember(KALEB, "t", "After space was freed.")
    assert len(shelf.list_memories(KALEB)[0]) == 2
    assert_index_consistent(db)
    shelf.close()


@pytest.mark.slow
def test_http_says_503_for_busy_422_for_bad_data_500_for_the_rest(tmp_path):
    from test_server import LiveServer, bearer

    db = tmp_path / "memory.db"
    shelf = Shelf(SQLiteStore(str(db), busy_timeout_ms=200), embedder=None)
    secret = shelf.create_key("acme")[1]
    with sqlite3.connect(db) as conn:  # rules a DBA could add: the database itself refuses some rows
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON memories WHEN new.content LIKE '%forbidden%'"
                     " BEGIN SELECT RAISE(ABORT, 'forbidden word'); END")
        conn.execute("CREATE TRIGGER audit AFTER INSERT ON memories WHEN new.content LIKE '%audited%'"
                     " BEGIN SELECT json_extract('{broken', '$'); END")  # fails: the database's fault, not the caller's
    with LiveServer(create_app(shelf)) as live, \
            httpx.Client(base_url=live.url, headers=bearer(secret), timeout=30) as client:
        def post(content: str) -> httpx.Response:
            return client.post("/v1/users/kaleb/memories", json={"topic": "t", "content": content})

        assert post("A fine memory.").status_code == 201
        writer = _hold_the_write_lock(db)
        busy = post("Written while the file is locked.")
        writer.close()
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1", busy.text
        assert busy.json()["error"]["type"] == "store_unavailable"
        bad = post("A forbidden memory.")
        assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_input", bad.text
        assert "Retry-After" not in bad.headers
        broken = post("An audited memory.")
        assert broken.status_code == 500 and broken.json()["error"]["type"] == "store_error", broken.text
        assert "malformed JSON" in broken.json()["error"]["message"]
        assert post("Written after the lock.").status_code == 201
        contents = [m["content"] for m in client.get("/v1/users/kaleb/memories").json()["items"]]
        assert sorted(contents) == ["A fine memory.", "Written after the lock."]
    shelf.close()


def test_a_file_from_before_confirmations_gains_them_in_place(tmp_path):
    """m011_confirmed adds two columns to a file of the previous version; its memories read as before and can be
    confirmed. (The previous version's file is this one with the columns and the migration's record taken away.)"""
    db = tmp_path / "memory.db"
    owner = Owner("home", "kaleb")
    with Shelf.open(db, embedder=None) as shelf:
        guess = shelf.remember(owner, "office", "The printer is on 192.168.1.40.", "inferred")
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE memories DROP COLUMN confirmed_at")
        conn.execute("ALTER TABLE memories DROP COLUMN confirmed_from")
        conn.execute("DELETE FROM memshelf_migrations WHERE name = 'm011_confirmed'")
    with Shelf.open(db, embedder=None) as shelf:
        assert "m011_confirmed" in shelf.store.applied_migrations()  # type: ignore[attr-defined]
        assert shelf.get(owner, guess.id) == guess
        assert shelf.confirm(owner, guess.id).confirmed_from == "inferred"


def _counted(db: Path, owner: Owner) -> tuple[int, int]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT memories, appended FROM owner_generation WHERE tenant = ? AND user_id = ?",
                            (owner.tenant, owner.user)).fetchone()


def test_a_batch_counts_indexes_and_returns_each_row_as_a_read_would(tmp_path):
    """remember_many writes a batch's rows, then their index entries, then counts them once (stores/sqlite.py,
    add_memories): a repeat inside the batch or of a stored row is an observation, each new row is indexed once,
    and what it returns is what reading the rows back gives."""
    db = tmp_path / "memory.db"
    with Shelf.open(db, embedder=None) as shelf:
        old = shelf.remember(KALEB, "chat", "The boiler is in the attic.")
        texts = ["The printer is old.", "The router is new.", "The printer is old.", "The kettle is blue.",
                 "The boiler is in the attic."]
        stored = shelf.remember_many(KALEB, [{"topic": "chat", "content": text} for text in texts])
        assert stored[0].id == stored[2].id and stored[4].id == old.id
        assert [m.observations for m in stored] == [1, 1, 2, 1, 2]
        for memory in stored[1:]:
            assert shelf.get(KALEB, memory.id) == memory
        assert _counted(db, KALEB) == (4, 4)
        assert_index_consistent(db)
        assert [h.memory.id for h in shelf.search(KALEB, "printer", mode="keyword")] == [stored[0].id]
        shelf.remember_many(MAYA, [{"topic": "chat", "content": f"Maya said {i}."} for i in range(3)])
        assert _counted(db, MAYA) == (3, 3) and _counted(db, KALEB) == (4, 4)


def test_a_file_that_counted_rows_with_a_trigger_counts_them_once_after_upgrading(tmp_path):
    """m012 drops the trigger that counted each new row: the store counts a batch itself, and a row counted twice
    would make the vector cache miss rows and the keyword search pick the wrong plan."""
    db = tmp_path / "memory.db"
    with Shelf.open(db, embedder=None) as shelf:
        shelf.remember(KALEB, "chat", "The printer is old.")
    trigger = next(script for name, script in MIGRATIONS if name == "m001_initial").split(
        "CREATE TRIGGER memories_gen_insert", 1)[1].split("END;", 1)[0]
    with sqlite3.connect(db) as conn:  # the previous version's file: the trigger, and no record of m012
        conn.execute(f"CREATE TRIGGER memories_gen_insert{trigger}END;")
        conn.execute("DELETE FROM memshelf_migrations WHERE name = 'm012_count_inserts_per_batch'")
    with Shelf.open(db, embedder=None) as shelf:
        shelf.remember_many(KALEB, [{"topic": "chat", "content": f"Line {i}."} for i in range(3)])
        shelf.import_(MAYA, (json.loads(line) for line in _export_lines(shelf, KALEB)))
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'memories_gen_insert'").fetchone() == (0,)
    assert _counted(db, KALEB) == (4, 4) and _counted(db, MAYA) == (4, 4)
    assert_index_consistent(db)


def _trigger(migration: str, name: str) -> str:
    """The CREATE TRIGGER statement `name` as `migration` wrote it."""
    script = next(script for applied, script in MIGRATIONS if applied == migration)
    return f"CREATE TRIGGER {name}" + script.split(f"CREATE TRIGGER {name}", 1)[1].split("END;", 1)[0] + "END;"


def test_a_file_from_before_the_change_log_catches_up_after_upgrading(tmp_path):
    """m013 gives the generation triggers a log of the rows each change touched: after upgrading, a cached matrix
    catches up with a confirmation and a forget instead of reading every vector again."""
    db = tmp_path / "memory.db"
    with Shelf.open(db, embedder=HashEmbedder()) as shelf:
        guesses = shelf.remember_many(KALEB, [{"topic": "chat", "content": f"The printer note {i}.",
                                               "source": "inferred"} for i in range(12)])
    with sqlite3.connect(db) as conn:  # the previous version's file: its triggers, no log, no record of m013
        conn.executescript("DROP TABLE owner_changes; DROP TRIGGER memories_gen_delete; DROP TRIGGER"
                           " memories_gen_update; DROP TRIGGER memories_gen_supersede;"
                           + _trigger("m001_initial", "memories_gen_delete")
                           + _trigger("m001_initial", "memories_gen_update")
                           + _trigger("m008_learning", "memories_gen_supersede")
                           + "DELETE FROM memshelf_migrations WHERE name = 'm013_owner_changes';")
    with Shelf.open(db, embedder=HashEmbedder()) as shelf:
        assert "m013_owner_changes" in shelf.store.applied_migrations()  # type: ignore[attr-defined]
        assert len(shelf.search(KALEB, "printer note", mode="semantic", limit=20)) == 12
        reads: list[int] = []
        original = SQLiteStore._vector_rows
        shelf.store._vector_rows = lambda owner, model, after: reads.append(after) or original(  # type: ignore
            shelf.store, owner, model, after)
        shelf.confirm(KALEB, guesses[0].id)
        shelf.forget(KALEB, guesses[1].id)
        hits = shelf.search(KALEB, "printer note", mode="semantic", limit=20)
        assert {h.memory.id for h in hits} == {m.id for m in guesses} - {guesses[1].id}
        assert next(h.memory.confidence for h in hits if h.memory.id == guesses[0].id) == 1.0
        assert -1 not in reads  # caught up, not read again
        assert shelf.store._q("SELECT kind FROM owner_changes ORDER BY generation").fetchall() == [(0,), (2,)]


# ---------------------------------------------------------------------------------- keyword questions, common words
@pytest.fixture
def garden(tmp_path):
    """40 memories with "garden" in each but two, oldest first: the first says it three times and names the tulips;
    "gardener" (stemmed to garden) in the middle; "gardenias" (only a prefix match) among the newest; one guess."""
    shelf = Shelf.open(tmp_path / "garden.db", embedder=HashEmbedder())
    shelf.remember(KALEB, "home", "The garden garden garden has tulips by the gate.")
    for n in range(38):
        text = {19: "The gardener comes on Fridays.", 37: "The gardenias bloom in May."}.get(
            n, f"Note {n}: the garden needs water today.")
        shelf.remember(KALEB, "home", text, source="inferred" if n == 36 else "stated")
    shelf.remember(KALEB, "home", "The garden shed is locked.")
    yield shelf
    shelf.close()


def bound_ranked(monkeypatch, common: int, newest: int | None = None) -> None:
    """A term is common above `common` matches, and then its `newest` newest matches are ranked."""
    monkeypatch.setattr(sqlite_store, "RANKED", common)
    monkeypatch.setattr(sqlite_store, "NEWEST_RANKED", common if newest is None else newest)


def recorded_statements(shelf: Shelf, monkeypatch) -> list[str]:
    """The SQL the shelf's store runs from now on, in order."""
    statements: list[str] = []
    original = shelf.store._q
    monkeypatch.setattr(shelf.store, "_q", lambda sql, params=(): statements.append(sql) or original(sql, params))
    return statements


def keyword_answers(shelf: Shelf, question: str, limit: int = 5) -> list[str]:
    return [hit.memory.content for hit in shelf.search(KALEB, question, mode="keyword", limit=limit)]


def test_a_word_in_more_memories_than_are_ranked_ranks_its_newest_matches(garden, monkeypatch):
    every = keyword_answers(garden, "garden", limit=40)
    assert len(every) == 40 and every[0] == "The garden garden garden has tulips by the gate."  # best bm25
    assert "The gardenias bloom in May." in every  # a prefix match, while the word is not common
    assert every[-1] == "Note 36: the garden needs water today."  # the spec's order first: the guess last
    bound_ranked(monkeypatch, 10)
    newest = keyword_answers(garden, "garden")
    assert newest == ["The garden shed is locked."] + [f"Note {n}: the garden needs water today." for n in
                                                        (35, 34, 33, 32)]  # only the newest ten matches are ranked
    assert keyword_answers(garden, "garden", limit=40) == every  # a limit above the bound raises it
    bound_ranked(monkeypatch, 10, newest=6)  # common above ten matches, and then its newest six are ranked
    assert keyword_answers(garden, "garden") == newest
    # A seventh would be the guess: eight times as many newest matches are ranked (here all of them), the common
    # word as its own word, so "gardenias" is not among them.
    words = [content for content in every if content != "The gardenias bloom in May."]
    assert keyword_answers(garden, "garden", limit=7) == words[:7]
    bound_ranked(monkeypatch, 10)
    # The newest ten matches hold the guess: as a tenth hit it would stand where an older statement belongs, so
    # more are ranked and the ten are statements, the best first.
    assert keyword_answers(garden, "garden", limit=10) == words[:10]
    assert "The gardenias bloom in May." not in keyword_answers(garden, "garden", limit=8)  # a common word matches
    # its own word, not every word it begins


def test_a_common_word_finds_old_memories_under_newer_ones_without_it(tmp_path, monkeypatch):
    """The bound ranks a common word's newest matches, not the owner's newest memories: those may not hold it."""
    bound_ranked(monkeypatch, 10)
    shelf = Shelf.open(tmp_path / "old.db", embedder=None)
    shelf.remember_many(KALEB, [{"topic": "home", "content": f"Note {n}: the garden needs water today."}
                                for n in range(30)])
    shelf.remember_many(KALEB, [{"topic": "work", "content": f"Ticket {n}: the printer jams again."}
                                for n in range(20)])
    found = keyword_answers(shelf, "garden")
    assert found == [f"Note {n}: the garden needs water today." for n in (29, 28, 27, 26, 25)]
    monkeypatch.setattr(sqlite_store, "RANKED", 1_000_000)
    assert keyword_answers(shelf, "garden") == found  # what ranking every match gives
    shelf.close()


def test_an_old_statement_outranks_newer_guesses_of_a_common_word(tmp_path, monkeypatch):
    bound_ranked(monkeypatch, 10)
    shelf = Shelf.open(tmp_path / "said.db", embedder=None)
    shelf.remember(KALEB, "home", "The garden gate sticks in winter.")
    shelf.remember_many(KALEB, [{"topic": "home", "content": f"Guess {n}: the garden may need water.",
                                 "source": "inferred"} for n in range(30)])
    assert keyword_answers(shelf, "garden", limit=3)[0] == "The garden gate sticks in winter."
    shelf.close()


def test_an_owner_of_mostly_guesses_finds_its_statements_among_every_match(tmp_path, monkeypatch):
    """The newest matches of a common word hold too few statements: WIDER times as many are ranked where the
    statements among them, as many times over, would be enough; when that falls short, or is not tried, the matches
    more confident than the last hit are ranked among every match (for such an owner, few: only they are scored),
    and the best of both kept, as ranking every match finds them."""
    bound_ranked(monkeypatch, 10, newest=4)
    shelf = Shelf.open(tmp_path / "guesses.db", embedder=None)
    shelf.remember_many(KALEB, [{"topic": "home", "content": f"Note {n}: the garden needs water.",
                                 "source": "stated" if n % 20 == 19 else "inferred"} for n in range(60)])
    statements = recorded_statements(shelf, monkeypatch)
    found = {limit: keyword_answers(shelf, "garden", limit=limit) for limit in (3, 10)}
    ranked = [sql for sql in statements if "bm25(" in sql]
    assert ["json_each" in sql for sql in ranked] == [True, True, False, True, False]  # limit 3: the newest 4,
    # the newest 32 (one statement among the 4 could be three among 32), then the more confident; limit 10: the
    # newest 10 (one statement could not be ten among 80), then the more confident
    assert all("m.confidence > ?" in sql for sql in ranked if "json_each" not in sql)
    notes = [f"Note {n}: the garden needs water." for n in (59, 39, 19, 58, 57, 56, 55, 54, 53, 52)]
    assert found == {3: notes[:3], 10: notes}  # every statement, then the newest guesses
    monkeypatch.setattr(sqlite_store, "RANKED", 1_000_000)
    assert {limit: keyword_answers(shelf, "garden", limit=limit) for limit in (3, 10)} == found  # what ranking
    # every match gives
    shelf.close()


def test_an_owner_of_guesses_alone_is_answered_from_the_newest_matches(tmp_path, monkeypatch):
    """No memory of the owner has ever been more confident than its guesses: no older match can outrank the newest
    ones, so they are the answer, in one statement. A confirmation raises what the owner holds: then the confirmed
    memory is looked for among every match, and found first."""
    bound_ranked(monkeypatch, 10, newest=4)
    shelf = Shelf.open(tmp_path / "guesses.db", embedder=None)
    notes = shelf.remember_many(KALEB, [{"topic": "home", "content": f"Note {n}: the garden needs water.",
                                         "source": "inferred"} for n in range(60)])
    statements = recorded_statements(shelf, monkeypatch)
    newest = [f"Note {n}: the garden needs water." for n in (59, 58, 57)]
    assert keyword_answers(shelf, "garden", limit=3) == newest
    assert len([sql for sql in statements if "bm25(" in sql]) == 1
    shelf.confirm(KALEB, notes[5].id)
    statements.clear()
    assert keyword_answers(shelf, "garden", limit=3) == ["Note 5: the garden needs water.", *newest[:2]]
    assert ["m.confidence > ?" in sql for sql in statements if "bm25(" in sql] == [False, True]
    shelf.forget(KALEB, notes[5].id)  # the owner's highest confidence stays (a deletion never lowers it): safe
    assert keyword_answers(shelf, "garden", limit=3) == newest
    shelf.close()


def test_upgrading_counts_each_owners_most_confident_memory(tmp_path):
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    shelf.remember(KALEB, "home", "The garden gate sticks.")
    shelf.remember(MAYA, "home", "Maya may like tulips.", source="mined")
    store = shelf.store
    with store.atomic():  # the file as m015 left it
        store._q("DROP TRIGGER memories_most_confident")
        store._q("ALTER TABLE owner_generation DROP COLUMN most_confident")
        store._q("DELETE FROM memshelf_migrations WHERE name = 'm016_most_confident'")
    shelf.close()
    shelf = Shelf.open(db, embedder=None)
    assert dict(shelf.store._q("SELECT user_id, most_confident FROM owner_generation").fetchall()) == {
        "kaleb": 1.0, "maya": 0.6}
    shelf.close()


def test_too_few_current_newest_matches_rank_more_of_them_then_every_match(tmp_path, monkeypatch):
    """When the newest matches of a common word have mostly expired, WIDER times as many are ranked, then every
    match."""
    today = [datetime(2026, 5, 1, tzinfo=UTC)]
    shelf = Shelf.open(tmp_path / "expired.db", embedder=None, clock=lambda: today[0])
    shelf.remember_many(KALEB, [{"topic": "home", "content": f"Note {n}: the garden needs water."}
                                for n in range(40)])
    shelf.remember_many(KALEB, [{"topic": "home", "content": f"Reminder {n}: the garden hose is out.",
                                 "expires_at": today[0] + timedelta(days=1)} for n in range(40)])
    today[0] += timedelta(days=2)
    statements = recorded_statements(shelf, monkeypatch)
    notes = [f"Note {n}: the garden needs water." for n in (39, 38, 37)]
    for newest, asked in ((8, 2), (4, 3)):  # the newest 64 hold current notes; the newest 32 do not
        bound_ranked(monkeypatch, 10, newest=newest)
        statements.clear()
        assert keyword_answers(shelf, "garden", limit=3) == notes
        ranked = [sql for sql in statements if "bm25(" in sql]
        assert len(ranked) == asked and all("json_each" in sql for sql in ranked[:2])
    assert "json_each" not in ranked[-1]  # every match ranked
    shelf.close()


def test_a_common_word_in_a_shared_tenant_finds_the_owners_memories(tmp_path, monkeypatch):
    """When the owner holds a large share of the tenant, a common word's newest matches are the tenant's, and may
    all be another user's; and the newest may have expired. Either way the owner's current ones are found."""
    bound_ranked(monkeypatch, 10)
    today = [datetime(2026, 5, 1, tzinfo=UTC)]
    shelf = Shelf.open(tmp_path / "shared.db", embedder=None, clock=lambda: today[0])
    shelf.remember_many(KALEB, [{"topic": "home", "content": f"Note {n}: the garden needs water today."}
                                for n in range(30)])
    shelf.remember_many(MAYA, [{"topic": "home", "content": f"Maya's note {n}: the garden needs seeds."}
                               for n in range(20)])
    assert keyword_answers(shelf, "garden") == [f"Note {n}: the garden needs water today." for n in
                                                (29, 28, 27, 26, 25)]
    shelf.remember_many(KALEB, [{"topic": "home", "content": f"Soon gone {n}: the garden hose is out.",
                                 "ttl": 60} for n in range(15)])
    assert sum("hose" in found for found in keyword_answers(shelf, "garden", limit=50)) == 15
    today[0] += timedelta(minutes=2)
    assert keyword_answers(shelf, "garden") == [f"Note {n}: the garden needs water today." for n in
                                                (29, 28, 27, 26, 25)]
    shelf.close()


@pytest.mark.parametrize("guesses", [False, True])
def test_a_word_rarely_said_whole_but_often_begun_is_found_as_every_match_would_find_it(tmp_path, monkeypatch,
                                                                                         guesses):
    """A term whose own word is rare while the words it begins are common ("photo": "photography" in most of the
    owner's memories) is matched as its own word in the bounded query. The answer then ranked only the other term's
    matches and passed for complete: "apple photo" gave three guesses about apple tarts where ranking every match
    gives the owner's statements about photography, the most confident first."""
    bound_ranked(monkeypatch, 20, newest=5)
    shelf = Shelf.open(tmp_path / "photo.db", embedder=None)
    shelf.remember_many(MAYA, [{"topic": "food", "content": f"Apple pie number {n}."} for n in range(40)])
    shelf.remember_many(KALEB, [{"topic": "hobby", "content": f"Photography club meeting {n}."} for n in range(30)])
    shelf.remember_many(KALEB, [{"topic": "food", "content": f"An apple tart, recipe {n}.",
                                 "source": "inferred" if guesses else "stated"} for n in range(3 if not guesses
                                                                                            else 10)])
    limit = 3 if guesses else 10
    bounded = keyword_answers(shelf, "apple photo", limit=limit)
    bound_ranked(monkeypatch, 10**9)
    assert bounded == keyword_answers(shelf, "apple photo", limit=limit)
    assert len(bounded) == limit and all("Photography" in found for found in bounded)  # the rarer word wins
    shelf.close()


def test_a_rarer_word_beside_a_common_one_is_found_however_old(garden, monkeypatch):
    bound_ranked(monkeypatch, 10)
    for mode in ("keyword", "hybrid"):
        found = [hit.memory.content for hit in garden.search(KALEB, "garden tulips", mode=mode, limit=3)]
        assert found[0] == "The garden garden garden has tulips by the gate.", mode
        found = [hit.memory.content for hit in garden.search(KALEB, "gardener on fridays", mode=mode, limit=3)]
        assert found[0] == "The gardener comes on Fridays.", mode
    assert keyword_answers(garden, "tulips") == ["The garden garden garden has tulips by the gate."]


@pytest.mark.parametrize("split", [True, False])
def test_old_matches_of_a_rarer_word_keep_their_scores_beside_a_common_one(tmp_path, monkeypatch, split):
    """A rarer word's matches older than the common word's newest are ranked apart when that saves walking the
    common word's list (in one statement FTS5 would walk it from the oldest of them): those that hold the common word
    too, and those that do not. Each keeps the score ranking every match gives it, so the answer is the same."""
    shelf = Shelf.open(tmp_path / "tulips.db", embedder=None)
    shelf.remember_many(KALEB, [{"topic": "home", "content": text} for text in (
        "The tulips by the gate are red.", "The garden tulips need water.", "Tulips, tulips everywhere.",
        "Plant the tulips in the garden in autumn.")])
    shelf.remember_many(KALEB, [{"topic": "home", "content": f"Note {n}: the garden needs water today."}
                                for n in range(30)])
    statements = recorded_statements(shelf, monkeypatch)
    bound_ranked(monkeypatch, 10)
    monkeypatch.setattr(sqlite_store, "SPLIT_WALK", 0 if split else 10**9)
    bounded = [(hit.memory.content, hit.score) for hit in shelf.search(KALEB, "garden tulips", mode="keyword",
                                                                      limit=14)]
    # split: the newest matches, old ones with "garden", old ones without
    assert sum("bm25(" in sql for sql in statements) == (3 if split else 1)
    monkeypatch.setattr(sqlite_store, "RANKED", 1_000_000)
    every = [(hit.memory.content, hit.score) for hit in shelf.search(KALEB, "garden tulips", mode="keyword", limit=50)]
    assert {content for content, _ in every[:4]} == {
        "The garden tulips need water.", "Plant the tulips in the garden in autumn.", "Tulips, tulips everywhere.",
        "The tulips by the gate are red."}
    assert bounded == every[:14]  # the four, then the ten newest notes: same rows, order and scores
    shelf.close()


@pytest.mark.parametrize("split", [True, False])
def test_a_common_word_the_owner_holds_rarely_keeps_its_old_matches_beside_a_rarer_one(tmp_path, monkeypatch,
                                                                                      split):
    """A word common in the tenant whose every match of the owner's is ranked: its matches older than another common
    word's newest still count, whether or not the rarer word's older matches are ranked apart."""
    shelf = Shelf.open(tmp_path / "shared.db", embedder=None)
    shelf.remember_many(KALEB, [{"topic": "home", "content": text} for text in (
        "The tulips by the gate are red.", "Plant tulips in autumn.", "Tulips, tulips everywhere.")])
    shelf.remember_many(KALEB, [{"topic": "home", "content": text} for text in (
        "The garden gate is green.", "The garden shed is locked.", "The garden hose leaks.")])
    shelf.remember_many(MAYA, [{"topic": "home", "content": f"Maya's note {n}: the garden needs seeds."}
                               for n in range(20)])
    shelf.remember_many(MAYA, [{"topic": "home", "content": f"Maya's note {n}: the attic needs paint."}
                               for n in range(60)])
    shelf.remember_many(KALEB, [{"topic": "home", "content": f"Note {n}: the lawn needs water today."}
                                for n in range(30)])
    bound_ranked(monkeypatch, 10)  # "garden" is common in the tenant; the owner has three
    monkeypatch.setattr(sqlite_store, "SPLIT_WALK", 0 if split else 10**9)
    question = "garden tulips water"
    bounded = [(hit.memory.content, hit.score) for hit in shelf.search(KALEB, question, mode="keyword", limit=8)]
    monkeypatch.setattr(sqlite_store, "RANKED", 1_000_000)
    every = [(hit.memory.content, hit.score) for hit in shelf.search(KALEB, question, mode="keyword", limit=50)]
    assert [content for content, _ in every[3:6]] == [
        "The garden hose leaks.", "The garden shed is locked.", "The garden gate is green."]
    assert bounded == every[:8]  # three tulips, three gardens, then the two newest notes
    shelf.close()


def test_a_question_under_the_bound_ranks_every_match_as_before(garden, monkeypatch):
    expected = keyword_answers(garden, "garden tulips water", limit=40)
    monkeypatch.setattr(sqlite_store, "RANKED", 40)  # "garden" matches 39 rows: still ranked in full
    assert keyword_answers(garden, "garden tulips water", limit=40) == expected


def test_the_wal_is_copied_into_the_file_while_the_store_is_open(tmp_path):
    """Writers never checkpoint (wal_autocheckpoint 0); the store's own thread copies the WAL into the file soon
    after commits, so the file grows while the store is open and the WAL does not grow without bound."""
    path = tmp_path / "bulk.db"
    shelf = Shelf.open(path, embedder=None)
    conn = shelf.store._connection()
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    empty = path.stat().st_size
    shelf.remember_many(KALEB, [{"topic": "note", "content": f"bulk note number {n} " + "x" * 200}
                                for n in range(3000)])
    deadline = time.monotonic() + 10
    while path.stat().st_size < empty + 500_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.stat().st_size >= empty + 500_000  # copied by the background checkpoint, the store still open
    assert len(shelf.search(KALEB, "bulk note number 2999", mode="keyword", limit=1)) == 1
    shelf.close()
    assert not Path(str(path) + "-wal").exists() or Path(str(path) + "-wal").stat().st_size == 0


# ---------------------------------------------------------------------------------------------- import in batches
def _imported(store: SQLiteStore) -> list[tuple]:
    return store._q("SELECT pk, id, tenant, user_id, topic, content, source, confidence, created_at, last_seen,"
                    " observations, expires_at, embedding, embed_model, context, superseded_at, superseded_by,"
                    " confirmed_at, confirmed_from FROM memories ORDER BY pk").fetchall()


def test_a_batch_import_stores_what_importing_one_record_at_a_time_stores(tmp_path):
    """import_memories writes a batch with one statement; the rows, their conversation context, their pieces and
    their full-text entries are the same as importing the records one by one, and a record whose id or text the
    owner has (stored, or earlier in the batch) is skipped, so a second import adds nothing."""
    from datetime import UTC, datetime, timedelta

    from memshelf.model import Memory

    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    records = [Memory(f"m{i}", f"session_{i % 3}", f"Turn {i} of the talk about the boiler {i % 5}.",
                      ("stated", "mined", "inferred")[i % 3], (1.0, 0.6, 0.4)[i % 3], t0 + timedelta(minutes=i),
                      expires_at=t0 + timedelta(days=400) if i % 4 == 0 else None,
                      last_seen=t0 + timedelta(minutes=i, seconds=30), observations=1 + i % 2,
                      embed_model="test:hash-64" if i % 2 == 0 else None,
                      superseded_at=t0 + timedelta(hours=1) if i == 3 else None,
                      superseded_by="m4" if i == 3 else None,
                      confirmed_at=t0 + timedelta(hours=2) if i == 5 else None,
                      confirmed_from="mined" if i == 5 else None)
               for i in range(40)]
    records.append(Memory("m1", "elsewhere", "Same id, other text.", "stated", 1.0, t0))  # an id seen before
    records.append(Memory("m99", records[7].topic, records[7].content, "stated", 1.0, t0))  # a text seen before
    vectors = [bytes(range(8)) * 32 if r.embed_model else None for r in records]
    pieces = [[bytes(256)] * 2 if i == 6 else [] for i in range(len(records))]

    batched, single = SQLiteStore(str(tmp_path / "batched.db")), SQLiteStore(str(tmp_path / "single.db"))
    for store in (batched, single):  # something stored first, so contexts start from stored rows
        store.import_memories(KALEB, [Memory("m0-old", "session_0", "Before the import.", "stated", 1.0, t0)],
                              [None])
    assert batched.import_memories(KALEB, records, vectors, pieces) == 40
    assert sum(single.import_memories(KALEB, [r], [v], [p]) for r, v, p in zip(records, vectors, pieces)) == 40
    assert _imported(batched) == _imported(single)
    assert batched.memory_pieces(KALEB, ["m6"]) == single.memory_pieces(KALEB, ["m6"]) == {"m6": [bytes(256)] * 2}
    assert batched.import_memories(KALEB, records, vectors, pieces) == 0
    assert _imported(batched) == _imported(single)
    contexts = {row[1]: row[14] for row in _imported(batched)}
    assert contexts["m3"] == "Before the import.\nTurn 0 of the talk about the boiler 0."
    for store in (batched, single):
        store.close()
    assert_index_consistent(tmp_path / "batched.db")


# ------------------------------------------------------------------ keyword questions without the column filter
def test_a_question_about_owning_never_matches_the_owners_index_token(tmp_path):
    """Keyword search on a tenant's words table leaves FTS5's column filter out, unless a term could match the owner's
    index token ("own" and hex digits, in every row): then every memory would match "own", "owned" or "Ówn"."""
    shelf = Shelf.open(tmp_path / "own.db", embedder=None)
    shelf.remember_many(KALEB, [{"topic": "home", "content": text} for text in
                                ("I own a red bicycle.", "The printer is on floor 2.", "The owl lives in the barn.")])
    shelf.remember(MAYA, "home", "Maya owns the blue car.")
    for question in ("what do I own?", "things I owned", "ÓWN", "øwn", "øwned", "ｏｗｎ"):  # folded: fold()'s too
        assert keyword_answers(shelf, question) == ["I own a red bicycle."], question
    assert keyword_answers(shelf, sqlite_store.owner_tag(KALEB)[:5]) == []  # the start of Kaleb's own token
    assert keyword_answers(shelf, "owl") == ["The owl lives in the barn."]
    shelf.close()


def test_leaving_the_column_filter_out_changes_no_answer_nor_score(tmp_path, monkeypatch):
    shelf = Shelf.open(tmp_path / "same.db", embedder=None)
    words = ["garden", "gate", "printer", "toner", "router", "kitchen", "invoice", "holiday", "tulips", "gardens"]
    shelf.remember_many(KALEB, [{"topic": words[n % 3], "content": " ".join(words[(n * k) % len(words)]
                                                                             for k in range(1, 2 + n % 5)) + "."}
                                for n in range(60)])
    shelf.remember_many(MAYA, [{"topic": "home", "content": f"Maya's {w} and {w} again."} for w in words])
    questions = ["garden", "printer toner", "the gate of the garden", "kitchen invoice holiday", "tulip", "rout"]

    def asked() -> list:
        return [[(h.memory.id, h.score) for h in shelf.search(KALEB, q, mode="keyword", limit=20)] for q in questions]

    without = asked()
    monkeypatch.setattr(sqlite_store, "_may_match_tag", lambda term: True)  # the filter on every query
    assert asked() == without
    assert all(without)
    shelf.close()


def test_a_word_common_in_the_tenant_but_not_the_owners_finds_nothing_quickly(tmp_path, monkeypatch):
    bound_ranked(monkeypatch, 5)
    shelf = Shelf.open(tmp_path / "theirs.db", embedder=None)
    shelf.remember_many(KALEB, [{"topic": "home", "content": f"Note {n}: the garden needs water."} for n in range(3)])
    shelf.remember_many(MAYA, [{"topic": "home", "content": f"Maya's note {n}: the printer jams."} for n in range(7)])
    calls = []
    monkeypatch.setattr(shelf.store, "_q", lambda sql, *a, real=shelf.store._q: calls.append(sql) or real(sql, *a))
    assert keyword_answers(shelf, "printer") == []
    assert sum("bm25" in sql for sql in calls) == 1  # all of Kaleb's matches (none) were ranked: no second pass
    calls.clear()
    assert len(keyword_answers(shelf, "garden printer")) == 3 and sum("bm25" in sql for sql in calls) == 1
    shelf.close()


def test_closing_the_store_never_loses_the_checkpointers_wake_up(tmp_path):
    """close() sets stop, then wake, then waits for the checkpoint thread. When it came just after the thread's pause
    ran out and before the thread cleared its wake-up, the thread cleared close()'s wake-up too and waited for
    another that never came: Shelf.close() hung for good (found by tests/test_stateful.py)."""
    Shelf.open(tmp_path / "memory.db", embedder=None).close()
    checkpointer = sqlite_store._Checkpointer(f"{(tmp_path / 'memory.db').as_uri()}?mode=rw")

    class CloseComesFirst(threading.Event):
        def clear(self) -> None:  # close()'s two steps, just before the thread clears its wake-up
            checkpointer._stop.set()
            super().set()
            super().clear()

    waiting_on = checkpointer._wake
    checkpointer._wake = CloseComesFirst()  # what the thread clears, and then waits on
    waiting_on.set()  # a commit's wake-up
    checkpointer._thread.join(timeout=5)
    assert not checkpointer._thread.is_alive()
