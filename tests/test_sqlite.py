"""What only the embedded SQLite backend has to prove: the file itself, several processes, migrations."""

from __future__ import annotations

import multiprocessing
from memshelf.stores.sqlite import sqlite3  # the store's own SQLite: another in this process must not open its files
from pathlib import Path

import pytest

from memshelf import Owner, Shelf, StoreError
from memshelf.stores.sqlite import SQLiteStore
from memshelf.stores._sqlite_schema import MIGRATIONS

KALEB = Owner("home", "kaleb")
SECRET = "Kaleb's locker combination is zanzibarquux 4471."


def file_bytes(db: Path) -> bytes:
    data = b""
    for suffix in ("", "-wal", "-shm", "-journal"):
        path = Path(str(db) + suffix)
        if path.exists():
            data += path.read_bytes()
    return data


@pytest.mark.parametrize("erase", ["forget_user", "forget_each", "purge"])
def test_erased_text_is_nowhere_in_the_database_files(tmp_path, clock, erase):
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None, clock=clock)
    for i in range(200):  # another user's rows, enough to give the full-text index several pages
        shelf.remember(Owner("home", "maya"), "filler", f"Filler statement number {i} about the weather.")
    memory = shelf.remember(KALEB, "secrets", SECRET, ttl=10)
    shelf.set_fact(KALEB, "locker", "zanzibarquux")
    shelf.log_message(KALEB, "t1", "user", SECRET, ttl=10)
    assert b"zanzibarquux" in file_bytes(db)
    if erase == "forget_user":
        shelf.forget_user(KALEB)
    elif erase == "forget_each":
        shelf.forget(KALEB, memory.id)
        shelf.forget_fact(KALEB, "locker")
        clock.advance(3600)
        shelf.purge_expired()  # the message went by its own retention
    else:
        shelf.forget_fact(KALEB, "locker")
        clock.advance(3600)
        assert shelf.purge_expired().as_dict() == {"memories": 1, "facts": 0, "fact_changes": 0, "messages": 1,
                                                    "scrub_pending": False}
    shelf.close()
    leftover = file_bytes(db)
    assert b"zanzibarquux" not in leftover
    assert b"locker combination" not in leftover  # not a digit needle: random hex ids contain digits
    assert b"Filler statement number 7 " in leftover  # the file is readable text: the check can fail


@pytest.mark.parametrize("erase", ["forget_messages", "inside_atomic"])
def test_an_erasure_inside_a_transaction_is_scrubbed_when_it_commits(tmp_path, erase):
    """The checkpoint that overwrites erased text ran inside the transaction, where nothing was committed, and was
    not tried again for a second: Shelf.forget_messages (one transaction) left the messages' words in the files
    and reported scrub_pending. Now the outermost commit runs it, before the call returns."""
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    for i in range(100):
        shelf.remember(Owner("home", "maya"), "filler", f"Filler statement number {i} about the weather.")
    said = [shelf.log_message(KALEB, "t1", "user", SECRET),
            shelf.log_message(KALEB, "t1", "user", "The gate word is quillworthy.")]
    memory = shelf.remember(KALEB, "secrets", "The vault word is xanthopsia.")
    assert b"zanzibarquux" in file_bytes(db) and b"xanthopsia" in file_bytes(db)
    if erase == "forget_messages":
        erased = shelf.forget_messages(KALEB, [m.id for m in said])
        assert (erased.messages, erased.scrub_pending) == (2, False)
        needles = [b"zanzibarquux", b"quillworthy"]
    else:
        with shelf.store.atomic():
            shelf.forget(KALEB, memory.id)
            shelf.forget_message(KALEB, said[0].id)
        needles = [b"zanzibarquux", b"xanthopsia"]
    assert not shelf.store.scrub_pending
    leftover = file_bytes(db)
    assert [needle for needle in needles if needle in leftover] == []
    assert b"Filler statement number 7 " in leftover  # the check can fail
    shelf.close()


def test_a_memory_forgotten_after_a_purge_rewrote_its_context_leaves_no_word_behind(tmp_path, clock):
    """A purge of many rows merges the tenant's index at its end and deletes by marker until then; the memories
    after the purged ones had their conversation context rewritten meanwhile (deleted by marker, indexed again
    under the same key). Forgotten later, in place, such a memory left its words in the context index's pages
    (SQLite 3.45 and newer, where deletions are in place)."""
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None, clock=clock)
    for i in range(20):  # more than are deleted in place: the purge merges instead
        shelf.remember(KALEB, "notes", f"short lived note {i}", ttl=10)
    words = ["zqkvnmtrxhg", "zqwpjthgkmx", "zqrxnvhtkjm", "zqmgtxkwvrp", "zqhjtvmnxkq", "zqtnkxgpjwv"]
    kept = [shelf.remember(KALEB, "notes", f"the word is {word} today") for word in words]
    clock.advance(60)
    assert shelf.purge_expired().memories == 20
    for memory in kept:
        assert not shelf.forget(KALEB, memory.id).scrub_pending
    leftover = file_bytes(db)
    assert [word for word in words if word[-6:].encode() in leftover] == []  # FTS5 keeps a term's shared start
    shelf.close()


def test_forget_one_memory_removes_its_words_from_the_index(tmp_path):
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    for i in range(100):
        shelf.remember(KALEB, "filler", f"Filler statement number {i}.")
    memory = shelf.remember(KALEB, "secrets", "The safe word is xylophagous.")
    shelf.forget(KALEB, memory.id)
    shelf.close()
    assert b"xylophag" not in file_bytes(db)


def test_migrations_run_once_and_twice_is_safe(tmp_path):
    db = str(tmp_path / "memory.db")
    first = SQLiteStore(db)
    assert first.applied_migrations() == [name for name, _ in MIGRATIONS]
    first.close()
    second = SQLiteStore(db)  # opening again applies nothing new and fails nothing
    assert second.applied_migrations() == [name for name, _ in MIGRATIONS]
    second.close()


def _writer(db: str, worker: int, count: int) -> None:
    shelf = Shelf.open(db, embedder=None)
    owner = Owner("home", f"user{worker % 2}")
    for i in range(count):
        shelf.remember(owner, "load", f"worker {worker} statement {i}")
        if i % 10 == 0:
            shelf.set_fact(owner, f"w{worker}", str(i))
    shelf.close()


def test_several_processes_write_one_file(tmp_path):
    db = str(tmp_path / "memory.db")
    Shelf.open(db, embedder=None).close()
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_writer, args=(db, w, 150)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(120)
    assert [p.exitcode for p in workers] == [0, 0, 0, 0]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 600
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_threads_share_one_shelf(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    shelf = Shelf.open(tmp_path / "memory.db", embedder=None)

    def work(i: int) -> int:
        shelf.remember(KALEB, "t", f"threaded statement {i}")
        return len(shelf.search(KALEB, f"statement {i}", limit=3))

    with ThreadPoolExecutor(8) as pool:
        assert all(n >= 1 for n in pool.map(work, range(80)))
    assert len(shelf.list_memories(KALEB, limit=100)[0]) == 80
    shelf.close()


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        Shelf.open(tmp_path / "nope" / "memory.db", embedder=None)


def test_memory_database_is_shared_across_threads():
    from threading import Thread

    shelf = Shelf.open(":memory:", embedder=None)
    shelf.remember(KALEB, "t", "in memory")
    seen = []
    thread = Thread(target=lambda: seen.append(len(shelf.search(KALEB, "memory"))))
    thread.start()
    thread.join()
    assert seen == [1]


def test_threads_writing_and_reading_a_memory_database_wait_for_each_other():
    """Connections to one ':memory:' database share a cache, where another's table lock was an immediate 'table
    is locked' (no busy timeout): a LangGraph store's abatch or four threads remembering failed at once."""
    from concurrent.futures import ThreadPoolExecutor

    shelf = Shelf.open(":memory:", embedder=None)

    def work(n: int) -> int:
        shelf.remember(KALEB, "notes", f"Note {n} about the garden.")
        shelf.set_fact(KALEB, f"k{n % 5}", str(n))
        return len(shelf.list_memories(KALEB, limit=200)[0]) + len(shelf.search(KALEB, "garden", limit=3))

    with ThreadPoolExecutor(4) as pool:
        assert all(seen >= 2 for seen in pool.map(work, range(120)))
    assert len(shelf.list_memories(KALEB, limit=200)[0]) == 120
    shelf.close()


def test_forgetting_a_memory_removes_it_from_its_neighbours_context(tmp_path):
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    for i in range(50):
        shelf.remember(Owner("home", "maya"), "filler", f"Filler statement number {i}.")
    secret = shelf.remember(KALEB, "chat", "My bank pin is quetzalcoatl.")
    shelf.remember(KALEB, "chat", "Noted, I will not tell anyone.")
    shelf.remember(KALEB, "chat", "Thanks.")
    shelf.forget(KALEB, secret.id)
    shelf.close()
    assert b"quetzalcoatl" not in file_bytes(db)
    assert b"Noted, I will not tell anyone." in file_bytes(db)


def test_keyword_scores_do_not_depend_on_other_tenants(tmp_path):
    """bm25 statistics are per tenant: another tenant's words move neither the scores nor the order of a tenant's
    hits (no side channel across tenants through ranking)."""
    shelf = Shelf.open(tmp_path / "memory.db", embedder=None)
    acme = Owner("acme", "ann")
    shelf.remember(acme, "t", "The falcon report is due.")
    shelf.remember(acme, "t", "The budget report is late and the budget is tight.")
    before = [(h.memory.content, h.score) for h in shelf.search(acme, "falcon budget report")]
    rival = Owner("rival", "bob")
    shelf.remember_many(rival, [{"topic": "t", "content": f"falcon falcon note {i}"} for i in range(300)])
    after = [(h.memory.content, h.score) for h in shelf.search(acme, "falcon budget report")]
    assert after == before
    assert len(shelf.search(rival, "falcon", limit=1000)) == 300


def test_erasing_a_tenant_drops_its_full_text_tables(tmp_path):
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    shelf.remember(Owner("gone", "u"), "t", "Erase me entirely.")
    shelf.remember(Owner("kept", "u"), "t", "Keep me.")
    shelf.forget_tenant("gone")
    names = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    words_tables = {name for name in names if name.startswith("fts_") and "_" not in name[4:]} - {"fts_tenants"}
    assert len(words_tables) == 1  # only the kept tenant's
    assert shelf.search(Owner("kept", "u"), "keep")[0].memory.content == "Keep me."
    assert list(shelf.search(Owner("gone", "u"), "erase")) == []
    shelf.close()


def test_a_tenants_tables_index_the_rows_it_already_has(tmp_path):
    """What upgrading a database from before per-tenant indexes relies on (m004 creates them for every tenant)."""
    from memshelf.stores.sqlite import owner_tag

    store = SQLiteStore(str(tmp_path / "memory.db"))
    with store.atomic():  # a row written the way an older memshelf left it: no per-tenant index yet
        store._q("INSERT INTO memories (id, tenant, user_id, topic, content, digest, owner_tag, source, confidence,"
                 " created_at, last_seen) VALUES ('m_1', 'home', 'kaleb', 'network', 'The printer is old.', 'd1', ?,"
                 " 'stated', 1.0, '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z')", (owner_tag(KALEB),))
        assert store._fts.names("home") is None
        store._fts.index_existing("home")
    shelf = Shelf(store)
    assert [h.memory.content for h in shelf.search(KALEB, "printer")] == ["The printer is old."]
    shelf.close()
