"""SIGKILL durability on SQLite: a child process writes in a loop (memories, facts, and forgets), acknowledging each
committed write on stdout; it is killed with SIGKILL at random points, again and again. After the last kill the file
is reopened: every acknowledged write is there, every acknowledged forget is gone, `PRAGMA integrity_check` and
the tenant's full-text indexes' own integrity checks pass, and search and writes still work.

The child is this file run as a script (`python test_durability.py DB FIRST SEED`).
"""

from __future__ import annotations

import os
import random
import signal
from memshelf.stores.sqlite import sqlite3  # the store's own SQLite: another in this process must not open its files
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TENANT, USER = "durable", "kaleb"
KILLS = 10
WORD = "printer"


def child(db: str, first: int, seed: int) -> None:
    """Write forever: a memory, a memory, a memory, a fact, a forget; one line on stdout after each commit (and
    one before each forget, which may land without its acknowledgement)."""
    from memshelf import Owner, Shelf

    owner = Owner(TENANT, USER)
    chance = random.Random(seed)
    mine: list[str] = []
    with Shelf.open(db, embedder=None) as shelf:
        for n in range(first, first + 10**9):
            if n % 5 == 4 and mine:
                memory_id = mine.pop(chance.randrange(len(mine)))
                say(f"forgetting {memory_id}")
                shelf.forget(owner, memory_id)
                say(f"forgot {memory_id}")
            elif n % 5 == 3:
                shelf.set_fact(owner, f"key{n}", f"value {n}")
                say(f"fact key{n} value {n}")
            else:
                memory = shelf.remember(owner, "notes", f"{WORD} note number {n}")
                mine.append(memory.id)
                say(f"memory {memory.id} {n}")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@dataclass
class Acknowledged:
    """What the killed children said they had committed."""

    memories: dict[str, str] = field(default_factory=dict)  # id -> content
    facts: dict[str, str] = field(default_factory=dict)
    forgetting: set[str] = field(default_factory=set)  # forget started: the memory may or may not be gone
    forgot: set[str] = field(default_factory=set)
    writes: int = 0

    def read(self, line: str) -> None:
        verb, rest = line.split(" ", 1)
        if verb == "memory":
            memory_id, n = rest.split(" ")
            self.memories[memory_id] = f"{WORD} note number {n}"
        elif verb == "fact":
            key, value = rest.split(" ", 1)
            self.facts[key] = value
        elif verb == "forgetting":
            self.forgetting.add(rest)
        elif verb == "forgot":
            self.forgot.add(rest)
        else:
            raise AssertionError(f"the child said {line!r}")
        self.writes += verb != "forgetting"


def run_and_kill(db: Path, first: int, chance: random.Random, seen: Acknowledged) -> None:
    """Start a writer, let it acknowledge a random number of writes, and SIGKILL it a random moment later."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen([sys.executable, __file__, str(db), str(first), str(chance.randrange(10**9))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert writer.stdout is not None
    try:
        for _ in range(chance.randrange(5, 80)):
            line = writer.stdout.readline()
            if not line:
                raise AssertionError(f"the writer stopped: {writer.wait(30)} {writer.stderr.read()}")  # type: ignore[union-attr]
            seen.read(line.rstrip("\n"))
        time.sleep(chance.random() * 0.02)  # land the kill anywhere in a write, not just after one
    finally:
        writer.send_signal(signal.SIGKILL)
        # What it acknowledged before the kill landed, through the same buffered reader: readline() may already
        # hold those lines (communicate() would read past them, from the raw pipe).
        rest = writer.stdout.read()
        writer.wait(timeout=30)
        writer.stdout.close()
        writer.stderr.close()  # type: ignore[union-attr]
    for line in rest.splitlines():
        seen.read(line)
    assert writer.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Acknowledged]:
    """A SQLite file after KILLS writers were SIGKILLed in the middle of their work, and what they acknowledged."""
    db = tmp_path_factory.mktemp("durability") / "memory.db"
    seed = random.randrange(10**9)
    print(f"durability seed {seed}")  # shown when a test fails, to replay the same kills
    chance, seen = random.Random(seed), Acknowledged()
    for kill in range(KILLS):  # each writer numbers its writes from its own range
        run_and_kill(db, kill * 1_000_000, chance, seen)
    assert seen.writes >= KILLS * 5
    return db, seen


def live_memories(db: Path) -> dict[str, str]:
    from memshelf import Owner, Shelf

    with Shelf.open(db, embedder=None) as shelf:
        memories, cursor = shelf.list_memories(Owner(TENANT, USER), limit=1000)
        assert cursor is None
        return {m.id: m.content for m in memories}


def raw_connection(db: Path) -> closing[sqlite3.Connection]:
    """A plain sqlite3 connection in autocommit mode (no transaction left open), closed after use."""
    return closing(sqlite3.connect(db, isolation_level=None))


def full_text_tables() -> tuple[str, ...]:
    from memshelf.stores._sqlite_fts import table_names

    return table_names(TENANT)


@pytest.mark.slow
def test_every_acknowledged_write_survives_sigkill(killed: tuple[Path, Acknowledged]) -> None:
    from memshelf import Owner, Shelf

    db, seen = killed
    live = live_memories(db)
    kept = {k: v for k, v in seen.memories.items() if k not in seen.forgetting}
    assert {k: live.get(k) for k in kept} == kept
    assert not seen.forgot & live.keys()
    with Shelf.open(db, embedder=None) as shelf:
        facts = {f.key: f.value for f in shelf.facts(Owner(TENANT, USER))}
    assert {k: facts.get(k) for k in seen.facts} == seen.facts


@pytest.mark.slow
def test_file_and_index_are_intact_and_usable_after_sigkill(killed: tuple[Path, Acknowledged]) -> None:
    from memshelf import Owner, Shelf

    db, _ = killed
    with raw_connection(db) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        for table in full_text_tables():  # rank 0: the index's own structure
            raw.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 0)")
    owner = Owner(TENANT, USER)
    with Shelf.open(db, embedder=None) as shelf:
        live = live_memories(db)
        found = shelf.search(owner, WORD, mode="keyword", limit=1000)
        assert {h.memory.id for h in found} == live.keys()
        memory = shelf.remember(owner, "notes", "after the kills, the printer still answers")
        assert memory.id in {h.memory.id for h in shelf.search(owner, "answers", mode="keyword")}
        shelf.forget(owner, memory.id)
        assert list(shelf.search(owner, "answers", mode="keyword")) == []


@pytest.mark.slow
def test_full_text_index_matches_its_rows_after_sigkill(killed: tuple[Path, Acknowledged]) -> None:
    """rank 1: every row of the content table is in the index once, and nothing else is. The content table holds
    every tenant's rows, so this check is exact only in a file with one tenant, as here."""
    db, _ = killed
    with raw_connection(db) as raw:
        for table in full_text_tables():
            raw.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 1)")


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
