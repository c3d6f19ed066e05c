"""`memshelf migrate` refuses what it cannot copy before it creates or writes anything, and still resumes an
interrupted run: through the real command, SQLite to SQLite and SQLite to PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
import socket
from pathlib import Path

import psycopg
import pytest
from test_cli import ok, run

from memshelf import Owner, Shelf
from memshelf.migrate import MigrationConflict, migrate, owner_check
from memshelf.stores.base import open_store

KALEB, MAYA = Owner("home", "kaleb"), Owner("home", "maya")
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def destination(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "dest.db")
    return str(request.getfixturevalue("pg_fresh_url"))


def populate(path: Path) -> list[Owner]:
    """A source with two owners, each with memories, a fact with history, and messages."""
    clock = iter(T0 + timedelta(seconds=i) for i in range(1_000))
    with Shelf.open(str(path), embedder=None, clock=lambda: next(clock)) as shelf:
        for owner in (KALEB, MAYA):
            for i in range(6):
                shelf.remember(owner, "notes", f"{owner.user} note {i} about the printer")
            shelf.set_fact(owner, "user_name", owner.user.title()[:3])
            shelf.set_fact(owner, "user_name", owner.user.title())
            shelf.log_message(owner, "thread", "user", f"hello from {owner.user}", ttl=None)
    return [KALEB, MAYA]


def exports(target: str, owners: list[Owner]) -> list[list[dict]]:
    with Shelf.open(target, embedder=None) as shelf:
        return [list(shelf.export(owner)) for owner in owners]


def test_a_source_that_does_not_exist_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    proc = run(tmp_path, "migrate", str(tmp_path / "nope.db"), str(tmp_path / "other.db"))
    assert proc.returncode == 1
    assert "nope.db' does not exist" in proc.stderr and "Check the path" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_folder_as_the_source_is_named_a_folder_and_nothing_is_created(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    proc = run(tmp_path, "migrate", str(tmp_path / "data"), str(tmp_path / "other.db"))
    assert proc.returncode == 1
    assert "data' is a folder, not a SQLite file" in proc.stderr and "database file inside it" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"] and list((tmp_path / "data").iterdir()) == []


def test_a_file_that_is_not_a_memshelf_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a database")
    proc = run(tmp_path, "migrate", str(tmp_path / "notes.txt"), str(tmp_path / "other.db"))
    assert proc.returncode == 1 and "cannot read the source" in proc.stderr
    assert (tmp_path / "notes.txt").read_text() == "not a database" and not (tmp_path / "other.db").exists()


def test_a_postgres_source_out_of_reach_is_refused_in_one_line(tmp_path: Path) -> None:
    """libpq's message runs over two lines (what failed, then "Is the server running ...?"): the error keeps the
    first and gives memshelf's advice, on one line, and nothing is created."""
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = run(tmp_path, "migrate", f"postgresql://nobody:secret@127.0.0.1:{port}/none", str(tmp_path / "other.db"))
    [error] = [line for line in proc.stderr.splitlines() if line.strip()][-1:]
    assert proc.returncode == 1 and error.startswith("error: cannot read the source"), proc.stderr
    assert "Connection refused" in error and error.endswith("that the server is running")
    assert "secret" not in proc.stderr and not (tmp_path / "other.db").exists()
    assert "copying" not in proc.stderr  # no progress bar drawn for a copy that never started


def test_a_postgres_source_without_memshelf_tables_is_refused_and_left_alone(pg_server, tmp_path: Path) -> None:
    url = pg_server.empty_database()
    proc = run(tmp_path, "migrate", url, str(tmp_path / "other.db"))
    assert proc.returncode == 1 and "has no memshelf tables" in proc.stderr
    with psycopg.connect(url) as conn:
        created = conn.execute("SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace").fetchone()
    assert created == (0,)
    assert not (tmp_path / "other.db").exists()


def test_an_owner_the_destination_already_has_is_refused_before_writing(tmp_path: Path, destination: str) -> None:
    source = tmp_path / "memory.db"
    owners = populate(source)
    with Shelf.open(destination, embedder=None) as dest:
        dest.remember(KALEB, "network", "The printer is broken.")  # someone else's kaleb, already there
    before = exports(destination, owners)

    proc = run(tmp_path, "migrate", str(source), destination)
    assert proc.returncode == 1
    assert "records of 1 source owner(s) that this migration did not write: home/kaleb." in proc.stderr
    assert "home/maya" not in proc.stderr and "forget-user" in proc.stderr
    assert exports(destination, owners) == before  # maya, who did not collide, was not copied either

    ok(tmp_path, "--db", destination, "forget-user", "--yes")  # the way out the message gives
    report = json.loads(ok(tmp_path, "--json", "migrate", str(source), destination).stdout)
    assert report["owners"] == 2
    assert exports(destination, owners) == exports(str(source), owners)


def test_an_interrupted_migration_is_resumed_not_refused(tmp_path: Path, destination: str) -> None:
    source = tmp_path / "memory.db"
    owners = populate(source)

    def interrupt(done: int, total: int) -> None:
        if done >= 9:  # kaleb is copied, maya has 3 of her 6 memories and nothing else
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        migrate(str(source), destination, batch=3, progress=interrupt)
    complete = exports(str(source), owners)
    partial = exports(destination, owners)
    assert partial[0] == complete[0] and [r["kind"] for r in partial[1]] == ["memshelf-export"] + ["memory"] * 3

    report = json.loads(ok(tmp_path, "--json", "migrate", str(source), destination).stdout)
    assert report["copied"] == {"memories": 3, "facts": 1, "fact_changes": 2, "messages": 1}
    assert exports(destination, owners) == complete
    again = json.loads(ok(tmp_path, "--json", "migrate", str(source), destination).stdout)
    assert sum(again["copied"].values()) == 0


DIVERGENCES: dict[str, Callable[[Shelf, list[dict]], None]] = {
    "another memory": lambda shelf, _: shelf.remember(KALEB, "notes", "only in the destination"),
    "same id, other text": lambda shelf, records: shelf.import_(KALEB, [
        {**next(r for r in records if r["kind"] == "memory"), "content": "kaleb note 0, edited"}]),
    "same id, more observations": lambda shelf, records: shelf.import_(KALEB, [
        {**next(r for r in records if r["kind"] == "memory"), "observations": 7}]),
    "another fact value": lambda shelf, _: shelf.set_fact(KALEB, "user_name", "K."),
    "another message": lambda shelf, _: shelf.log_message(KALEB, "thread", "user", "hello", ttl=None),
}


@pytest.mark.parametrize("divergence", sorted(DIVERGENCES))
def test_a_destination_record_that_is_not_the_sources_is_a_conflict(tmp_path: Path, divergence: str) -> None:
    populate(tmp_path / "memory.db")
    records = exports(str(tmp_path / "memory.db"), [KALEB])[0]
    with Shelf.open(str(tmp_path / "dest.db"), embedder=None) as shelf:
        DIVERGENCES[divergence](shelf, records)
    before = exports(str(tmp_path / "dest.db"), [KALEB, MAYA])
    with pytest.raises(MigrationConflict, match="home/kaleb"):
        migrate(str(tmp_path / "memory.db"), str(tmp_path / "dest.db"))
    assert exports(str(tmp_path / "dest.db"), [KALEB, MAYA]) == before


def test_a_key_revoked_since_the_last_run_is_revoked_by_the_next(tmp_path: Path) -> None:
    """A rerun skipped every key the destination had, so a key revoked in the source stayed live in the copy."""
    with Shelf.open(tmp_path / "memory.db", embedder=None) as shelf:
        key, secret = shelf.create_key("home")
    migrate(str(tmp_path / "memory.db"), str(tmp_path / "dest.db"))
    with Shelf.open(tmp_path / "memory.db", embedder=None) as shelf:
        shelf.revoke_key(key.id)
    migrate(str(tmp_path / "memory.db"), str(tmp_path / "dest.db"))
    with Shelf.open(tmp_path / "dest.db", embedder=None) as copy:
        assert copy.authenticate(secret) is None
        assert [k.revoked_at is not None for k in copy.list_keys()] == [True]


def test_the_report_names_each_owner_apart(tmp_path: Path) -> None:
    """Owners ("a/b", "c") and ("a", "b/c") were one key, "a/b/c", of the report's verified map."""
    with Shelf.open(tmp_path / "memory.db", embedder=None) as shelf:
        shelf.remember(Owner("a/b", "c"), "t", "One.")
        shelf.remember(Owner("a", "b/c"), "t", "Two.")
    verified = migrate(str(tmp_path / "memory.db"), str(tmp_path / "dest.db")).as_dict()["verified"]
    assert sorted((v["tenant"], v["user"]) for v in verified) == [("a", "b/c"), ("a/b", "c")]


def test_a_complete_copy_is_not_a_conflict(tmp_path: Path) -> None:
    populate(tmp_path / "memory.db")
    migrate(str(tmp_path / "memory.db"), str(tmp_path / "dest.db"))
    again = migrate(str(tmp_path / "memory.db"), str(tmp_path / "dest.db"))
    assert sum(again.copied.values()) == 0
    source, dest = open_store(str(tmp_path / "memory.db")), open_store(str(tmp_path / "dest.db"))
    try:
        assert owner_check(source, KALEB) == owner_check(dest, KALEB)
    finally:
        source.close()
        dest.close()
