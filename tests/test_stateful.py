"""Model-based: whatever happens to an owner's memories, a long-lived Shelf on a SQLite file answers every search as a
Shelf opened afresh on the same file does, and keyword search keeps its promises on common words; on both backends
search by meaning is an exact scan of the stored vectors.

The long-lived Shelf keeps what makes search fast: the owner's vector matrix, caught up with each change or
rebuilt, with its int8 copy scanned first; vector files written and mapped; the bound on the matches a common word
ranks. Each is switched on from a handful of rows here (in use they start at thousands), so a few memories reach
them. Hypothesis draws sequences of writes, confirmations, expiry changes, supersessions,
erasures, purges, another user's leaving, reopenings and the clock moving on, and after every step checks:

- every search mode, at two limits, gives the same hits and scores on both Shelves;
- search by meaning gives what an exact float32 scan of the stored vectors gives, for the current memories, with
  superseded ones, and as of half an hour before;
- keyword search (in each of those views, on both backends) returns as many hits as ranking every match would,
  and the same confidences in the same order
  (what the user said is never pushed out by newer guesses): only which equally confident matches come first may
  differ, the documented price of the bound."""

from __future__ import annotations

import shutil
import tempfile
from datetime import datetime, timedelta, UTC
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from fakes import HashEmbedder
from memshelf import Memory, NotFound, Owner, Shelf, _vectors
from memshelf.shelf import DEFAULT_FLOOR
from memshelf.stores import _sqlite_vector_files as vector_files, postgres as pg_store, sqlite as sqlite_store

KALEB = Owner("home", "kaleb")
MAYA = Owner("home", "maya")
WORDS = ["garden", "printer", "router", "kitchen"]
QUESTIONS = ["garden", "printer router", "kitchen gate", "the garden printer"]
SOURCES = ["stated", "mined", "inferred"]


def answers(shelf: Shelf, question: str, mode: str, limit: int, **view: Any) -> list[tuple[str, float, float]]:
    return [(hit.memory.id, round(hit.score, 6), hit.memory.confidence)
            for hit in shelf.search(KALEB, question, mode=mode, limit=limit, **view)]


def sees(memory: Memory, as_of: datetime | None = None, include_superseded: bool = False) -> bool:
    """Whether a read with this view sees a memory that has not expired (View's rule)."""
    if as_of is not None and memory.created_at > as_of:
        return False
    closed = memory.superseded_at
    return include_superseded or closed is None or (as_of is not None and closed > as_of)


def as_vector(stored: Any) -> np.ndarray:
    """A stored vector as float32: SQLite keeps bytes, PostgreSQL's driver gives an array."""
    return np.frombuffer(stored, dtype=np.float32) if isinstance(stored, bytes) else np.asarray(stored, np.float32)


class ShelfSteps(RuleBasedStateMachine):
    """The steps (writes, confirmations, expiries, supersessions, erasures, purges, reopenings) and what must hold
    on every backend: search by meaning is the exact scan of the stored vectors, and keyword search's bound on a
    common word's matches keeps what ranking every match gives."""

    keyword_store: Any = sqlite_store
    """The module of the store's keyword bound (RANKED, NEWEST_RANKED)."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="memshelf-stateful-"))
        self.target = self.new_target()
        self.today = datetime(2026, 5, 1, tzinfo=UTC)
        self.shelf = self.open()
        self.written: list[str] = []  # Kaleb's memory ids, whatever became of them
        self.count = 0

    def new_target(self) -> str:
        return str(self.folder / "memory.db")

    def open(self) -> Shelf:
        return Shelf.open(self.target, embedder=HashEmbedder(), clock=lambda: self.today)

    def teardown(self) -> None:
        self.shelf.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    @rule(owner=st.sampled_from([KALEB, KALEB, MAYA]), size=st.integers(1, 12),
          words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3), source=st.sampled_from(SOURCES),
          ttl=st.none() | st.integers(1, 90))
    def remember(self, owner: Owner, size: int, words: list[str], source: str, ttl: int | None) -> None:
        items = []
        for n in range(size):
            self.count += 1
            text = " ".join(words[(n + i) % len(words)] for i in range(1 + n % 3))
            items.append({"topic": "home", "content": f"Note {self.count}: the {text} again.", "source": source,
                          "ttl": None if ttl is None else timedelta(minutes=ttl)})
        stored = self.shelf.remember_many(owner, items)
        if owner == KALEB:
            self.written += [memory.id for memory in stored]

    @precondition(lambda self: self.written)
    @rule(pick=st.integers(0, 10_000), action=st.sampled_from(["forget", "confirm", "expire", "keep"]))
    def change(self, pick: int, action: str) -> None:
        memory_id = self.written[pick % len(self.written)]
        try:
            if action == "forget":
                self.shelf.forget(KALEB, memory_id)
            elif action == "confirm":
                self.shelf.confirm(KALEB, memory_id)
            else:
                self.shelf.set_expiry(KALEB, memory_id, ttl=timedelta(minutes=5) if action == "expire" else None)
        except NotFound:  # erased or expired already
            pass
        except Exception as exc:  # confirming a superseded memory is refused, and says why
            assert type(exc).__name__ == "Conflict", exc

    @precondition(lambda self: len(self.written) >= 2)
    @rule(old=st.integers(0, 10_000), new=st.integers(0, 10_000))
    def supersede(self, old: int, new: int) -> None:
        old_id, new_id = self.written[old % len(self.written)], self.written[new % len(self.written)]
        if old_id != new_id:
            self.shelf.store.supersede_memory(KALEB, old_id, new_id, self.today)

    @rule(minutes=st.sampled_from([1, 10, 60]))
    def later(self, minutes: int) -> None:
        self.today += timedelta(minutes=minutes)

    @rule()
    def purge(self) -> None:
        self.shelf.purge_expired()

    @rule()
    def maya_leaves(self) -> None:  # Kaleb alone in the tenant again: its statistics and share change
        self.shelf.forget_user(MAYA)

    @rule()
    def reopen(self) -> None:
        self.shelf.close()
        self.shelf = self.open()

    def views(self) -> list[dict[str, Any]]:
        earlier = self.today - timedelta(minutes=30)
        return [{}, {"include_superseded": True}, {"as_of": earlier}, {"as_of": earlier, "include_superseded": True}]

    @invariant()
    def search_by_meaning_is_the_exact_scan(self) -> None:
        unexpired = [(memory, as_vector(stored))
                     for memory, stored in self.shelf.store.iter_memories(KALEB, self.today) if stored is not None]
        for view in self.views():
            seen = [(memory, vector) for memory, vector in unexpired if sees(memory, **view)]
            for question in QUESTIONS:
                q = _vectors.normalize(HashEmbedder().embed_batch([question]))[0]
                scored = [(float(np.dot(_vectors.normalize(vector[None, :])[0], q)), memory.confidence, n, memory.id)
                          for n, (memory, vector) in enumerate(seen)]
                ranked = sorted((s for s in scored if s[0] >= DEFAULT_FLOOR), key=lambda s: (-s[0], -s[1], -s[2]))
                found = self.shelf.search(KALEB, question, mode="semantic", limit=8, **view)
                assert [hit.score for hit in found] == pytest.approx([score for score, *_ in ranked[:8]], abs=1e-5)
                for hit, (score, _, _, memory_id) in zip(found, ranked):
                    # Equal cosines of different vectors may differ in the last float32 bits (PostgreSQL's sums
                    # run in another order): such a near tie may go either way, anything else must be as scanned.
                    tied = {s[3] for s in ranked if abs(s[0] - score) < 1e-6}
                    assert hit.memory.id == memory_id or hit.memory.id in tied, (question, view)

    @invariant()
    def the_bound_keeps_counts_and_confidences(self) -> None:
        """Keyword search ranks only a common word's newest matches (and every match of the rarer words), and
        returns as many hits, as confident, as ranking every match."""
        for view in self.views():
            for question in QUESTIONS:
                for limit in (3, 8):
                    bounded = answers(self.shelf, question, "keyword", limit, **view)
                    common, newest = self.keyword_store.RANKED, self.keyword_store.NEWEST_RANKED
                    self.keyword_store.RANKED = self.keyword_store.NEWEST_RANKED = 10 ** 9
                    try:
                        every = answers(self.shelf, question, "keyword", limit, **view)
                    finally:
                        self.keyword_store.RANKED, self.keyword_store.NEWEST_RANKED = common, newest
                    assert [c for _, _, c in bounded] == [c for _, _, c in every], (question, limit, view)


class ShelfMachine(ShelfSteps):
    """On a SQLite file, where the shelf keeps vectors and keyword counts in process: a long-lived shelf answers
    as a fresh one."""

    @invariant()
    def a_fresh_shelf_answers_the_same(self) -> None:
        fresh = self.open()
        try:
            for question in QUESTIONS:
                for mode in ("keyword", "semantic", "hybrid"):
                    for limit in (3, 8):
                        assert answers(self.shelf, question, mode, limit) == answers(fresh, question, mode, limit), \
                            (question, mode, limit)
        finally:
            fresh.close()


@pytest.mark.slow
def test_a_long_lived_shelf_answers_as_a_fresh_one_through_any_changes(monkeypatch):
    monkeypatch.setattr(sqlite_store, "RANKED", 6)  # a word in more than six memories is common
    monkeypatch.setattr(sqlite_store, "NEWEST_RANKED", 3)
    monkeypatch.setattr(sqlite_store, "SPLIT_WALK", 0)  # a rarer word's old matches ranked in statements of their own
    monkeypatch.setattr(sqlite_store, "PATCH_SHARE", 0.5)  # catch up with more changes before rebuilding
    monkeypatch.setattr(_vectors, "COMPACT_ROWS", 4)  # an int8 copy, scanned first, from four vectors
    monkeypatch.setattr(vector_files, "SAVED_ROWS", 4)  # a vector file, written and then mapped, from four
    run_state_machine_as_test(ShelfMachine, settings=settings(
        max_examples=30, stateful_step_count=25, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


class PostgresMachine(ShelfSteps):
    """The same steps on PostgreSQL, a fresh database for each example. It keeps no vectors in process, so what is
    checked is search by meaning against the exact scan and the keyword bound, in every view, through the same
    changes."""

    server: Any = None
    keyword_store = pg_store

    def new_target(self) -> str:
        return str(self.server.fresh_database())

    def teardown(self) -> None:
        super().teardown()
        self.server.drop(self.target)


@pytest.mark.slow
def test_postgresql_searches_by_meaning_and_keywords_as_promised_through_any_changes(pg_server, monkeypatch):
    monkeypatch.setattr(PostgresMachine, "server", pg_server)
    monkeypatch.setattr(pg_store, "RANKED", 6)  # as on SQLite
    monkeypatch.setattr(pg_store, "NEWEST_RANKED", 3)
    monkeypatch.setattr(pg_store, "WORDS_MIN_ROWS", 0)  # every owner's statement can read the words, and bound
    run_state_machine_as_test(PostgresMachine, settings=settings(
        max_examples=15, stateful_step_count=20, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
