"""The hybrid search's fusion (memshelf._retrieval.fuse): reciprocal rank fusion with a steep meaning side.
Properties on synthetic candidates, the case the previous fusion lost on LongMemEval (the one line found only
by meaning sank below plain keyword matches) with the real model on both backends, and how the two sides are
gathered (both_sides)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from fakes import HashEmbedder

import memshelf._retrieval as retrieval
from memshelf import DimensionMismatch, Owner, Shelf, StoreError
from memshelf._retrieval import RRF_K, SEMANTIC_K, SEMANTIC_WEIGHT, fuse
from memshelf.model import Memory
from memshelf.stores.base import Scored

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def memory(ident: int) -> Memory:
    return Memory(f"m{ident}", "t", f"line {ident}", "stated", 1.0, T0, None, T0, 1)


def side(scores: dict[int, float]) -> list[Scored]:
    """One retriever's candidates, best first, as a store returns them."""
    return [Scored(memory(i), s) for i, s in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))]


def fused_ids(words: dict[int, float], meaning: dict[int, float], **options: float) -> list[str]:
    return [c.memory.id for c in fuse(side(words), side(meaning), **options)]


ids = st.integers(0, 15)
keyword_scores = st.dictionaries(ids, st.floats(0.01, 30.0), max_size=12)  # bm25 / ts_rank: any positive scale
cosines = st.dictionaries(ids, st.floats(0.2, 1.0), max_size=12)


@given(keyword_scores, cosines, ids)
def test_first_on_both_sides_is_first(words, meaning, top):
    words[top] = max(words.values(), default=0.0) + 1.0
    meaning[top] = min(1.0, max(meaning.values(), default=0.2) + 0.01)
    assume(all(s < meaning[top] for i, s in meaning.items() if i != top))
    assert fused_ids(words, meaning)[0] == f"m{top}"


@given(keyword_scores, cosines, ids, st.floats(0.01, 5.0), st.booleans())
def test_a_better_score_on_one_side_never_moves_a_candidate_down(words, meaning, target, gain, on_words):
    scores = words if on_words else meaning
    assume(target in words or target in meaning)
    before = fused_ids(words, meaning).index(f"m{target}")
    raised = {**scores, target: scores.get(target, 0.0) + gain}
    after = fused_ids(*((raised, meaning) if on_words else (words, raised))).index(f"m{target}")
    assert after <= before


@given(keyword_scores, cosines, st.floats(0.01, 100.0))
def test_a_side_s_unit_does_not_matter(words, meaning, scale):
    """bm25 on SQLite and ts_rank on PostgreSQL differ in scale by orders of magnitude: only the shape counts."""
    rescaled = {i: s * scale for i, s in words.items()}
    assert fused_ids(rescaled, meaning) == fused_ids(words, meaning)


@given(keyword_scores)
def test_one_retriever_alone_keeps_its_order(words):
    assert fused_ids(words, {}) == [c.memory.id for c in side(words)]
    assert fused_ids({}, words) == [c.memory.id for c in side(words)]


def test_meaning_s_first_weighs_as_the_keywords_third_or_fourth_and_its_tail_fades():
    first, second, tenth = (SEMANTIC_WEIGHT / (SEMANTIC_K + rank) for rank in (1, 2, 10))
    assert 1 / (RRF_K + 4) < first < 1 / (RRF_K + 3)
    assert 1 / (RRF_K + 11) < second <= 1 / (RRF_K + 10)
    assert tenth < 1 / (RRF_K + 40)


def test_ties_are_broken_by_the_better_rank_then_the_keyword_rank():
    # with sides weighted alike, m1 and m2 score the same (first of one side only), as do m3 and m4
    ranked = fuse(side({1: 2.0, 3: 1.0}), side({2: 0.9, 4: 0.5}), semantic_k=RRF_K, semantic_weight=1.0)
    assert [c.memory.id for c in ranked] == ["m1", "m2", "m3", "m4"]
    assert ranked[0].score == ranked[1].score and ranked[2].score == ranked[3].score


def test_details_keep_each_retriever_s_rank_and_raw_score():
    both, words_only = fuse(side({1: 4.0, 2: 1.0}), side({1: 0.8}))[:2]
    assert both.retriever == "hybrid" and words_only.retriever == "keyword"
    assert both.details == {"keyword_rank": 1, "keyword_score": 4.0, "semantic_rank": 1, "semantic_score": 0.8}


# ------------------------------------------------------------------------------------- with the real model

ROSA = Owner("home", "rosa")
# Lines that share a word of the question ("current", "setup") but not its point, and one line that answers it
# without any of its words.
SHARED_WORDS = [
    "The kitchen setup took us the whole weekend.", "My current lease ends in March.",
    "Our home office setup needs a better chair.", "My current job has a long commute.",
    "The current in the river was too strong to swim.", "My gaming setup is too loud at night.",
    "My current phone plan is too expensive.", "The aquarium setup needs a new filter.",
    "The current mayor was elected in May.", "Our wedding setup used forty chairs.",
    "The current rent includes water and heating.", "The network setup at the office took a day.",
]
ANSWER = "As a Sony camera user, I've been thinking about upgrading my camera bag."


@pytest.mark.slow
def test_meaning_s_first_line_is_not_buried_by_word_matches(open_shelf, local_embedder):
    """LongMemEval's loss with the previous fusion (semantic weight 0.5, k=10): the one line about the user's
    camera, first by meaning and found by no keyword, came after the first eleven keyword-only matches."""
    shelf = open_shelf(embedder=local_embedder)
    shelf.remember_many(ROSA, [{"topic": "chat", "content": text} for text in [*SHARED_WORDS, ANSWER]])
    question = "Can you suggest some accessories that would complement my current photography setup?"
    assert ANSWER not in [h.memory.content for h in shelf.search(ROSA, question, mode="keyword", limit=20)]
    hits = shelf.search(ROSA, question, limit=5)
    assert [(h.retriever, h.details.get("semantic_rank")) for h in hits if h.memory.content == ANSWER] == [
        ("semantic", 1)]


# ---------------------------------------------------------------- the two sides at once
NOTES = [f"Note {i}: the {word} is in the {place}." for i, (word, place) in enumerate(
    (w, p) for w in ("toner", "stapler", "ladder", "kettle", "router") for p in ("closet", "garage", "office"))]
QUESTIONS = ["Where is the toner?", "kettle in the garage", "Which router is in the office?", "ladder", "nothing"]


def _threads_of(shelf, monkeypatch) -> list[str]:
    """The names of the threads the store's vector_search runs on, from now on."""
    names: list[str] = []
    search = shelf.store.vector_search

    def recorded(*args, **kwargs):
        names.append(threading.current_thread().name)
        return search(*args, **kwargs)

    monkeypatch.setattr(shelf.store, "vector_search", recorded)
    return names


def _answers(shelf) -> list[list[tuple[str, float, str]]]:
    return [[(h.memory.content, h.score, h.retriever) for h in shelf.search(ROSA, q, mode="hybrid", limit=8)]
            for q in QUESTIONS]


def _filled(shelf):
    shelf.remember_many(ROSA, [{"topic": "office", "content": text} for text in NOTES])
    return shelf


def test_on_postgresql_the_meaning_side_runs_beside_the_keyword_side_with_the_same_answers(pg_fresh_url,
                                                                                          monkeypatch):
    """The meaning side runs on a side thread while the keyword side runs on the caller's, and every answer is
    what running them one after the other gives; when every side thread is busy, or inside a transaction (where
    another connection would not see this one's writes), both run on the caller's thread."""
    with Shelf.open(pg_fresh_url, embedder=HashEmbedder()) as shelf:
        _filled(shelf)
        threads = _threads_of(shelf, monkeypatch)
        at_once = _answers(shelf)
        assert threads and all(name.startswith("memshelf-side") for name in threads)
        assert any(hits for hits in at_once)
        monkeypatch.setattr(retrieval, "SIDES_AT_ONCE", False)
        threads.clear()
        assert _answers(shelf) == at_once
        assert set(threads) == {threading.current_thread().name}
        monkeypatch.setattr(retrieval, "SIDES_AT_ONCE", True)
        slots = retrieval._side_slots
        # a busy server (a side's slot comes back just after its search returns, so wait a moment for each)
        taken = [slots.acquire(timeout=5) for _ in range(retrieval.SIDE_THREADS)]
        try:
            threads.clear()
            assert all(taken) and _answers(shelf) == at_once
            assert set(threads) == {threading.current_thread().name}
        finally:
            for _ in taken:
                slots.release()
        threads.clear()
        with shelf.store.atomic():
            shelf.remember(ROSA, "office", "The spare toner went to the basement.")
            hits = shelf.search(ROSA, "spare toner basement", mode="hybrid", limit=3)
        assert "The spare toner went to the basement." in [h.memory.content for h in hits]
        assert set(threads) == {threading.current_thread().name}


def test_on_sqlite_the_two_sides_run_one_after_the_other(tmp_path, monkeypatch):
    """In process both sides are short: a thread hop cost more than it saved on LoCoMo (BENCHMARKS.md)."""
    with Shelf.open(str(tmp_path / "m.db"), embedder=HashEmbedder()) as shelf:
        threads = _threads_of(_filled(shelf), monkeypatch)
        assert any(_answers(shelf)) and set(threads) == {threading.current_thread().name}


def test_a_failed_side_fails_the_search_and_leaves_nothing_running(pg_fresh_url, monkeypatch):
    """The keyword side's error reaches the caller only after the meaning side has finished; the meaning side's
    error reaches the caller as it did when the sides ran one after the other."""
    with Shelf.open(pg_fresh_url, embedder=HashEmbedder()) as shelf:
        _filled(shelf)
        finished: list[bool] = []
        search = shelf.store.vector_search

        def slow(*args, **kwargs):
            time.sleep(0.2)
            found = search(*args, **kwargs)
            finished.append(True)
            return found

        def broken(*args, **kwargs):
            raise StoreError("the keyword side broke")

        monkeypatch.setattr(shelf.store, "vector_search", slow)
        monkeypatch.setattr(shelf.store, "keyword_search", broken)
        with pytest.raises(StoreError, match="keyword side broke"):
            shelf.search(ROSA, "Where is the toner?", mode="hybrid")
        assert len(finished) == 1  # it sleeps 0.2 s first: had the search not waited, nothing would be here yet
        monkeypatch.undo()

        def mismatched(*args, **kwargs):
            raise DimensionMismatch("the stored vectors have 3 dimensions", "run backfill")

        monkeypatch.setattr(shelf.store, "vector_search", mismatched)
        with pytest.raises(DimensionMismatch, match="3 dimensions"):
            shelf.search(ROSA, "Where is the toner?", mode="hybrid")


def test_many_threads_searching_through_a_small_pool_all_get_their_answers(pg_fresh_url, monkeypatch):
    """Twelve threads searching at once through a pool of two connections, each hybrid search wanting a second
    one for its meaning side: none waits forever (a keyword side gives its connection back before its search waits
    for the meaning side), and every answer is the one a search alone gets."""
    monkeypatch.setenv("MEMSHELF_PG_POOL_SIZE", "2")
    with Shelf.open(pg_fresh_url, embedder=HashEmbedder()) as shelf:
        expected = _answers(_filled(shelf))
        ran_on = _threads_of(shelf, monkeypatch)
        results: list[object] = []

        def searcher() -> None:
            try:
                results.extend(_answers(shelf) == expected for _ in range(3))
            except Exception as exc:  # noqa: BLE001 - the test reports it
                results.append(exc)

        threads = [threading.Thread(target=searcher) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        assert results == [True] * 36
        assert any(name.startswith("memshelf-side") for name in ran_on)
