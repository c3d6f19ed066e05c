"""Relevance before provenance in the default (hybrid) search: a weak match never outranks a strong one whatever
its source, and among lines as relevant as the best, what the user stated comes before what a rule mined, before
what a model guessed. Real model, both backends; the ordering rule itself also on synthetic candidates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memshelf import Owner
from memshelf._retrieval import AS_RELEVANT, Candidate, order
from memshelf.model import Memory

pytestmark = pytest.mark.slow

KALEB = Owner("home", "kaleb")
ORDINARY = [  # eight ordinary things the user said, none about the printer
    "I use a standing desk at work.", "My favourite tea is genmaicha.", "I run every Tuesday morning.",
    "The car needs new tyres before winter.", "My sister lives in Leeds.", "I keep my passport in the blue folder.",
    "Our router password is on the fridge.", "I prefer aisle seats on flights.",
]


@pytest.fixture
def hybrid(open_shelf, local_embedder):
    shelf = open_shelf(embedder=local_embedder)
    shelf.remember_many(KALEB, [{"topic": "misc", "content": text} for text in ORDINARY])
    return shelf


def contents(hits) -> list[str]:
    return [hit.memory.content for hit in hits]


def test_a_strong_guess_beats_weak_statements(hybrid):
    """The issue's case: the toner line is the only one about toner; it is a guess, the rest are statements."""
    hybrid.remember(KALEB, "office", "The printer toner is in the supply closet.", source="inferred")
    assert contents(hybrid.search(KALEB, "Where is the printer toner?", limit=1)) == [
        "The printer toner is in the supply closet."]
    assert "[0.4] The printer toner is in the supply closet." in hybrid.context(KALEB, "Where is the printer toner?",
                                                                                limit=1)


def test_equally_relevant_lines_come_in_provenance_order(hybrid):
    """Spec 000's story, hybrid: three printer lines as relevant as each other: stated, mined, then the guess,
    although the guess has the best fused score."""
    hybrid.remember(KALEB, "office", "The printer toner is in the supply closet.", source="inferred")
    hybrid.remember(KALEB, "office", "The office printer is on 192.168.1.40.")
    hybrid.remember(KALEB, "office", "The printer jams on thick paper.", source="mined")
    hits = hybrid.search(KALEB, "What did I say the printer's address was?", limit=3)
    assert [(h.memory.source, h.memory.content) for h in hits] == [
        ("stated", "The office printer is on 192.168.1.40."), ("mined", "The printer jams on thick paper."),
        ("inferred", "The printer toner is in the supply closet.")]


def test_the_same_fact_said_and_guessed_puts_the_statement_first(hybrid):
    hybrid.remember(KALEB, "home", "The spare key is under the doormat.", source="inferred")
    hybrid.remember(KALEB, "home", "The spare key is under the mat by the door.")
    hits = hybrid.search(KALEB, "Where is the spare key?", limit=2)
    assert [h.memory.source for h in hits] == ["stated", "inferred"]


def test_a_weaker_statement_does_not_beat_a_strong_mined_line(hybrid):
    hybrid.remember(KALEB, "pets", "I walk the dog every evening.")
    hybrid.remember(KALEB, "pets", "The dog's vet is Dr. Okafor on Mill Street.", source="mined")
    hits = hybrid.search(KALEB, "Who is the dog's vet?", limit=2)
    assert hits[0].memory.content == "The dog's vet is Dr. Okafor on Mill Street."
    assert hits[0].memory.source == "mined" and hits[1].memory.source == "stated"


# ------------------------------------------------------------------------------------- the rule on its own

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def candidate(ident: int, confidence: float, score: float, keyword: float | None, semantic: float | None,
              ) -> Candidate:
    memory = Memory(f"m{ident}", "t", f"line {ident}", "x", confidence, T0 + timedelta(seconds=ident), None,
                    T0, 1)
    details = {name: value for name, value in (("keyword_score", keyword), ("semantic_score", semantic))
               if value is not None}
    return Candidate(memory, score, "hybrid", details)


def test_the_lead_is_only_the_run_as_relevant_as_the_best():
    guess = candidate(1, 0.4, 0.14, 5.0, 0.9)  # the best of both retrievers
    near = candidate(2, 1.0, 0.13, 4.5, 0.8)  # within AS_RELEVANT of the best: provenance puts it first
    weak = candidate(3, 1.0, 0.05, None, 0.3)  # meaning only, a third of the best cosine
    after = candidate(4, 1.0, 0.04, 4.9, None)  # as strong as the best by words, but after a weak one: stays there
    assert [c.memory.id for c in order([weak, after, guess, near])] == ["m2", "m1", "m3", "m4"]


sources = st.sampled_from([1.0, 0.6, 0.4])
rows = st.lists(st.tuples(st.floats(0.001, 1.0), st.one_of(st.none(), st.floats(0.1, 10.0)),
                          st.one_of(st.none(), st.floats(0.2, 1.0))), min_size=1, max_size=12)


@given(rows)
def test_one_source_means_the_fused_order(raw):
    """With every line from one source (LoCoMo and LongMemEval store everything as stated) nothing moves."""
    candidates = [candidate(i, 1.0, score, kw, sem) for i, (score, kw, sem) in enumerate(raw)]
    expected = sorted(candidates, key=lambda c: (-c.score, -c.memory.created_at.timestamp()))
    assert [c.memory.id for c in order(candidates)] == [c.memory.id for c in expected]


@given(rows, st.lists(sources, min_size=12, max_size=12))
def test_no_weak_line_is_moved_above_a_stronger_one(raw, confidences):
    """Only the leading run of lines as relevant as the best is reordered; everything else keeps its rank."""
    candidates = [candidate(i, confidences[i], score, kw, sem) for i, (score, kw, sem) in enumerate(raw)]
    ranked = order(candidates)
    fused = sorted(candidates, key=lambda c: (-c.score, -c.memory.confidence, -c.memory.created_at.timestamp()))
    lead = next((i for i, c in enumerate(fused) if not _strong(c, candidates)), len(fused))
    assert {c.memory.id for c in ranked[:lead]} == {c.memory.id for c in fused[:lead]}
    assert ranked[lead:] == fused[lead:]
    assert [c.memory.confidence for c in ranked[:lead]] == sorted((c.memory.confidence for c in ranked[:lead]),
                                                                   reverse=True)


def _strong(c: Candidate, everyone: list[Candidate]) -> bool:
    shares = []
    for name in ("keyword_score", "semantic_score"):
        best = max((o.details.get(name, 0.0) for o in everyone), default=0.0)
        if best > 0 and name in c.details:
            shares.append(c.details[name] / best)
    return max(shares, default=0.0) >= AS_RELEVANT
