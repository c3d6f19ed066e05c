"""Erasure on SQLite versions with and without FTS5's in-place deletion (stores/_sqlite_fts.py, SECURE_DELETE).

Python brings the SQLite it was built with; the pysqlite3-binary wheel (a test dependency on Linux x86-64) bundles a
newer one. The last test here runs the SQLite suites again under it, so what only a newer SQLite does is tested for
real, and a file it wrote is handed to the older one."""

from __future__ import annotations

import importlib.util
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from memshelf import ConfigError, Owner, Shelf, StoreError
from memshelf.stores import _sqlite_fts, _sqlite_lib
from memshelf.stores._sqlite_fts import READS_SECURE, SECURE_DELETE

from test_sqlite import file_bytes
from test_sqlite_storage import assert_index_consistent

KALEB = Owner("home", "kaleb")
MAYA = Owner("home", "maya")
TESTS = Path(__file__).resolve().parent
NEWER = importlib.util.find_spec("pysqlite3") is not None
WORDS = ["printer", "router", "garden", "kitchen", "invoice", "meeting", "holiday", "passport", "doctor", "bicycle"]


def fts_state(db: Path, tenant: str = "home") -> tuple[int, int, str | None]:
    """(merges, secure, the words table's secure-delete setting) of a tenant's full-text tables."""
    with sqlite3.connect(db) as conn:
        merges, secure, words = conn.execute("SELECT merges, secure, words FROM fts_tenants WHERE tenant = ?",
                                             (tenant,)).fetchone()
        setting = conn.execute(f"SELECT v FROM {words}_config WHERE k = 'secure-delete'").fetchone()
    return merges, secure, None if setting is None else str(setting[0])


def filled(db: Path, rows: int = 400) -> Shelf:
    shelf = Shelf.open(db, embedder=None)
    shelf.remember_many(MAYA, [{"topic": "filler", "content": f"Filler statement number {i} about the weather."}
                               for i in range(rows)])
    return shelf


def test_one_erasure_takes_its_words_out_in_place_where_sqlite_can(tmp_path):
    db = tmp_path / "memory.db"
    shelf = filled(db)
    secret = shelf.remember(KALEB, "secrets", "The safe word is xylophagous.")
    assert fts_state(db) == ((0, 1, "1") if SECURE_DELETE else (0, 0, None))
    shelf.forget(KALEB, secret.id)
    # in place: no merge of the tenant's whole index; without it: one full merge, as before
    assert fts_state(db) == ((0, 1, "1") if SECURE_DELETE else (1, 0, None))
    assert shelf.search(MAYA, "weather", limit=3)
    shelf.close()
    assert b"xylophag" not in file_bytes(db)
    assert b"Filler statement number 7 " in file_bytes(db)  # the file is readable text: the check can fail
    assert_index_consistent(db)


def test_a_large_erasure_merges_once_and_later_ones_are_in_place_again(tmp_path):
    db = tmp_path / "memory.db"
    shelf = filled(db)
    shelf.remember_many(KALEB, [{"topic": "diary", "content": f"Entry {i}: the quokkaberry harvest."}
                                for i in range(100)])  # more than the in-place bound for 500 rows
    shelf.forget_user(KALEB)
    assert fts_state(db) == ((1, 1, "1") if SECURE_DELETE else (1, 0, None))
    assert not shelf.search(KALEB, "quokkaberry")
    last = shelf.remember(KALEB, "secrets", "The safe word is xylophagous.")
    shelf.forget(KALEB, last.id)
    assert fts_state(db)[0] == (1 if SECURE_DELETE else 2)
    shelf.close()
    assert b"quokkaberr" not in file_bytes(db)
    assert b"xylophag" not in file_bytes(db)
    assert_index_consistent(db)


def test_an_erasure_within_the_tenants_bound_is_in_place_and_one_beyond_it_merges(tmp_path, monkeypatch):
    monkeypatch.setattr(_sqlite_fts, "IN_PLACE_SHARE", 20)  # a tenant of 420 rows: up to 21 in place
    monkeypatch.setattr(_sqlite_fts, "IN_PLACE_MIN", 1)
    db = tmp_path / "memory.db"
    shelf = filled(db)
    diary = [{"topic": "diary", "content": f"Entry {i} of the quokkaberry log."} for i in range(22)]
    shelf.remember_many(KALEB, diary)  # 422 rows: 22 is beyond the bound of 21
    shelf.forget_user(KALEB)
    assert fts_state(db)[0] == 1
    shelf.remember_many(KALEB, diary[:20])  # 420 rows: 20 is within it
    shelf.forget_user(KALEB)
    assert fts_state(db)[0] == (1 if SECURE_DELETE else 2)
    shelf.close()
    assert b"quokkaberr" not in file_bytes(db)
    assert_index_consistent(db)


def test_the_session_runs_the_sqlite_it_was_asked_for():
    if os.environ.get("MEMSHELF_TEST_SQLITE") == "pysqlite3":
        assert sqlite3.__name__ == _sqlite_lib.sqlite3.__name__ == "pysqlite3.dbapi2" and SECURE_DELETE
    else:
        assert sqlite3.__name__ == _sqlite_lib.sqlite3.__name__ == "sqlite3"
        assert SECURE_DELETE == (sqlite3.sqlite_version_info >= (3, 45, 0))


def test_a_bad_memshelf_sqlite_is_a_one_line_error_naming_the_choices(tmp_path):
    run = subprocess.run([sys.executable, "-m", "memshelf.cli", "--db", str(tmp_path / "m.db"), "stats"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MEMSHELF_SQLITE": "newest", "MEMSHELF_EMBEDDER": "none"})
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "MEMSHELF_SQLITE must be one of auto, python, pysqlite3, got 'newest'" in run.stderr


def test_memshelf_sqlite_chooses_the_module(monkeypatch):
    import sqlite3 as python

    assert _sqlite_lib.choose("python") is python
    with pytest.raises(ConfigError, match="MEMSHELF_SQLITE must be one of auto, python, pysqlite3, got 'newest'"):
        _sqlite_lib.choose("newest")
    if NEWER:
        from pysqlite3 import dbapi2

        assert _sqlite_lib.choose("pysqlite3") is dbapi2
        assert _sqlite_lib.choose(None) is _sqlite_lib.choose(" Auto ") is (
            dbapi2 if dbapi2.sqlite_version_info > python.sqlite_version_info else python)
    monkeypatch.setattr(_sqlite_lib, "_wheel", lambda: None)  # as where the wheel is not installed
    assert _sqlite_lib.choose("auto") is python
    with pytest.raises(ConfigError, match=r"pip install 'memshelf\[sqlite\]'"):
        _sqlite_lib.choose("pysqlite3")


def test_an_index_made_without_in_place_deletion_gets_it_at_its_first_merge(tmp_path):
    """A file from an older SQLite or an older memshelf: its tables delete with markers until a merge."""
    db = tmp_path / "memory.db"
    shelf = filled(db)
    secret = shelf.remember(KALEB, "secrets", "The safe word is xylophagous.")
    store = shelf.store
    with store.atomic():  # type: ignore[attr-defined]
        if SECURE_DELETE:  # an older SQLite knows no such setting
            words, context = store._fts.names("home")  # type: ignore[attr-defined]
            store._fts._in_place(words, context, False)  # type: ignore[attr-defined]
        store._q("UPDATE fts_tenants SET secure = 0")  # type: ignore[attr-defined]
    shelf.forget(KALEB, secret.id)
    assert fts_state(db) == ((1, 1, "1") if SECURE_DELETE else (1, 0, None))
    shelf.close()
    assert b"xylophag" not in file_bytes(db)
    assert_index_consistent(db)


def test_erased_words_leave_no_trace_in_a_many_page_index(tmp_path):
    """Rare words in 40 of 5,000 memories, spread over the index's pages (stored prefix-compressed, so the check
    looks for each word's last eight letters): after forgetting those memories one by one, none is in any file."""
    rng = random.Random(3)
    db = tmp_path / "memory.db"
    shelf = Shelf.open(db, embedder=None)
    items = [{"topic": f"topic {i % 37}",
              "content": f"Note {i} on the {rng.choice(WORDS)} and the {rng.choice(WORDS)}."} for i in range(5_000)]
    rare = {}
    for at in rng.sample(range(len(items)), 40):
        rare[at] = "zq" + "".join(rng.choice("bcdfghjklmnpqrtvwxz") for _ in range(12))  # no s: stemmed away
        items[at]["content"] += f" {rare[at]}"
    memories = shelf.remember_many(KALEB, items)
    store = shelf.store
    words = store._fts.names("home")[0]  # type: ignore[attr-defined]
    blocks = b"".join(row[0] for row in store._q(f"SELECT block FROM {words}_data").fetchall())  # type: ignore[attr-defined]
    assert all(word[-8:].encode() in blocks for word in rare.values())  # the index holds them: the check can fail
    for at in rare:
        shelf.forget(KALEB, memories[at].id)
    shelf.close()
    leftover = file_bytes(db)
    assert [word for word in rare.values() if word[-8:].encode() in leftover] == []
    assert_index_consistent(db)


WRITE_WITH_NEWER_SQLITE = """
import sys
from memshelf import Owner, Shelf
kaleb, maya = Owner("home", "kaleb"), Owner("home", "maya")
with Shelf.open(sys.argv[1], embedder=None) as shelf:
    shelf.remember_many(maya, [{"topic": "filler", "content": f"Filler statement number {i} about the weather."}
                               for i in range(400)])
    secret = shelf.remember(kaleb, "secrets", "The safe word is xylophagous.")
    shelf.remember(kaleb, "network", "The office printer is on 192.168.1.40.")
    if sys.argv[2:] == ["forget"]:
        shelf.forget(kaleb, secret.id)
"""


@pytest.mark.skipif(READS_SECURE or not NEWER, reason="needs an SQLite older than 3.42 and the pysqlite3 wheel")
def test_an_older_sqlite_rebuilds_what_a_newer_one_deleted_in_place(tmp_path):
    db = tmp_path / "memory.db"
    subprocess.run([sys.executable, "-c", WRITE_WITH_NEWER_SQLITE, str(db), "forget"], check=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MEMSHELF_SQLITE": "pysqlite3"})
    with sqlite3.connect(db) as conn:
        words = conn.execute("SELECT words FROM fts_tenants").fetchone()[0]
        assert conn.execute(f"SELECT v FROM {words}_config WHERE k = 'version'").fetchone()[0] > 4
        with pytest.raises(sqlite3.OperationalError, match="invalid fts5 file format"):
            conn.execute(f"SELECT rowid FROM {words} WHERE {words} MATCH 'printer'").fetchall()
    with Shelf.open(db, embedder=None) as shelf:
        assert [h.memory.content for h in shelf.search(KALEB, "printer")] == ["The office printer is on 192.168.1.40."]
        assert len(shelf.search(MAYA, "weather", limit=500)) == 400
        shelf.forget_user(KALEB)
        assert not shelf.search(KALEB, "printer")
    assert fts_state(db) == (1, 0, None)
    assert b"xylophag" not in file_bytes(db)
    assert_index_consistent(db)


@pytest.mark.skipif(READS_SECURE or not NEWER, reason="needs an SQLite older than 3.42 and the pysqlite3 wheel")
def test_an_older_sqlite_reads_as_they_are_the_indexes_a_newer_one_never_deleted_from_in_place(tmp_path):
    db = tmp_path / "memory.db"
    subprocess.run([sys.executable, "-c", WRITE_WITH_NEWER_SQLITE, str(db)], check=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MEMSHELF_SQLITE": "pysqlite3"})

    def index(conn: sqlite3.Connection) -> list[tuple]:
        words, context = conn.execute("SELECT words, context FROM fts_tenants").fetchone()
        return [row for name in (words, context) for row in conn.execute(f"SELECT * FROM {name}_data ORDER BY id")]

    with sqlite3.connect(db) as conn:
        before = index(conn)
    assert fts_state(db) == (0, 1, "1")
    with Shelf.open(db, embedder=None) as shelf:
        assert [h.memory.content for h in shelf.search(KALEB, "printer")] == ["The office printer is on 192.168.1.40."]
    with sqlite3.connect(db) as conn:
        assert index(conn) == before  # not rebuilt: read as it was
    assert fts_state(db) == (0, 0, None)
    assert_index_consistent(db)


FORGET_WITH_NEWER_SQLITE = """
import sys
from memshelf import Owner, Shelf
with Shelf.open(sys.argv[1], embedder=None) as shelf:
    for memory_id in sys.argv[2:]:
        shelf.forget(Owner("home", "kaleb"), memory_id)
"""


@pytest.mark.skipif(READS_SECURE or not NEWER, reason="needs an SQLite older than 3.42 and the pysqlite3 wheel")
def test_a_store_open_while_a_newer_sqlite_deletes_in_place_says_to_reopen(tmp_path):
    db = tmp_path / "memory.db"
    shelf = filled(db)
    first = shelf.remember(KALEB, "secrets", "The door code is 1234.")  # its erasure merges, then in place
    secret = shelf.remember(KALEB, "secrets", "The safe word is xylophagous.")  # erased in place
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    subprocess.run([sys.executable, "-c", FORGET_WITH_NEWER_SQLITE, str(db), first.id, secret.id], check=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MEMSHELF_SQLITE": "pysqlite3"})
    with pytest.raises(StoreError, match="close and reopen the store, which rebuilds that index"):
        shelf.search(KALEB, "printer")
    shelf.close()
    with Shelf.open(db, embedder=None) as again:
        assert [h.memory.content for h in again.search(KALEB, "printer")] == ["The office printer is on 192.168.1.40."]
    assert b"xylophag" not in file_bytes(db)
    assert_index_consistent(db)


@pytest.mark.slow
@pytest.mark.skipif(not NEWER, reason="needs the pysqlite3-binary wheel (Linux x86-64), which `make test` installs")
@pytest.mark.skipif(os.environ.get("MEMSHELF_TEST_SQLITE") == "pysqlite3", reason="already running under it")
def test_the_sqlite_suites_pass_on_a_newer_sqlite():
    """The SQLite suites, this file, and the SQLite half of the contract, isolation and LangGraph suites (whose
    updates erase) under the wheel's newer SQLite, which deletes in place."""
    probe = subprocess.run([sys.executable, "-c", "import pysqlite3.dbapi2 as s; print(s.sqlite_version)"],
                           capture_output=True, text=True, check=True)
    assert tuple(int(part) for part in probe.stdout.split(".")) >= (3, 45, 0)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-k", "not postgres",
         *(str(TESTS / f"test_{name}.py") for name in ("sqlite", "sqlite_storage", "sqlite_versions", "contract",
                                                       "isolation", "langgraph"))],
        capture_output=True, text=True, cwd=TESTS.parent,
        env={**os.environ, "MEMSHELF_TEST_SQLITE": "pysqlite3", "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


def test_the_store_names_the_sqlite_module_it_runs_on(tmp_path):
    """README, "Erasure": code that reads a store's file in the store's process must use the store's module, since
    two SQLite libraries in one process reset each other's WAL index. It is public as memshelf.stores.sqlite.sqlite3,
    and a connection from it reads what the open Shelf wrote, while the Shelf goes on writing."""
    from memshelf.stores.sqlite import sqlite3 as store_sqlite3

    assert store_sqlite3 is _sqlite_lib.sqlite3
    with Shelf.open(tmp_path / "memory.db", embedder=None) as shelf:
        shelf.remember_many(KALEB, [{"topic": "t", "content": f"note {n} about the printer"} for n in range(2000)])
        with store_sqlite3.connect(tmp_path / "memory.db") as conn:
            assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 2000
        conn.close()
        shelf.remember_many(KALEB, [{"topic": "t", "content": f"later note {n}"} for n in range(2000)])
        assert len(shelf.search(KALEB, "printer", mode="keyword", limit=500)) == 500
