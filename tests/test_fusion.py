"""The hybrid search's fusion (memshelf._retrieval.fuse): reciprocal rank fusion with a steep meaning side.
Properties on synthetic candidates, and the case the previous fusion lost on LongMemEval (the one line found only
by meaning sank below plain keyword matches) with the real model on both backends."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from memshelf import Owner
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
