"""Fusing the keyword and the meaning retrievers into one ranking."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence

from .model import Memory
from .stores.base import Scored

RRF_K = 10
SEMANTIC_K = 1
KEYWORD_WEIGHT = 1.0
SEMANTIC_WEIGHT = 0.15
"""Reciprocal rank fusion with a steep meaning side: the keyword list counts 1 / (10 + rank), the meaning list
0.15 / (1 + rank). Meaning's first (0.075) weighs between the keywords' third and fourth, its second as their
tenth, its fifth as their thirtieth: on conversational data most of the dense list is noise, but what it ranks
first is often the one line that shares no word with the question (BENCHMARKS.md, "Fusion")."""
AS_RELEVANT = 0.8
"""A candidate is as relevant as the best when one retriever scores it at least this share of that retriever's best
raw score (bm25 for keywords, on both backends; cosine for meaning). Provenance orders only among those."""


@dataclass
class Candidate:
    memory: Memory
    score: float = 0.0
    retriever: str = ""
    details: dict[str, float] = field(default_factory=dict)


def fuse(by_words: Sequence[Scored], by_meaning: Sequence[Scored], *, k: float = RRF_K,
         semantic_k: float = SEMANTIC_K, keyword_weight: float = KEYWORD_WEIGHT,
         semantic_weight: float = SEMANTIC_WEIGHT) -> list[Candidate]:
    """Weighted reciprocal rank fusion, each side with its own k: the keyword side adds keyword_weight / (k + rank),
    the meaning side semantic_weight / (semantic_k + rank), for every row it ranks.

    A row found by both retrievers is marked "hybrid"; details keep each retriever's rank and raw score. Returned
    best first; equal scores by the better rank on either side, then the keyword rank.
    """
    merged: dict[str, Candidate] = {}
    for name, weight, offset, ranked in (("keyword", keyword_weight, k, by_words),
                                         ("semantic", semantic_weight, semantic_k, by_meaning)):
        for rank, scored in enumerate(ranked, 1):
            cand = merged.setdefault(scored.memory.id, Candidate(scored.memory))
            cand.score += weight / (offset + rank)
            cand.retriever = "hybrid" if cand.retriever and cand.retriever != name else name
            cand.details[f"{name}_rank"] = rank
            cand.details[f"{name}_score"] = round(scored.score, 6)
    far = float("inf")
    return sorted(merged.values(), key=lambda c: (
        -c.score, min(c.details.get("keyword_rank", far), c.details.get("semantic_rank", far)),
        c.details.get("keyword_rank", far)))


def strength(candidate: Candidate, best: dict[str, float]) -> float:
    """How close the candidate comes to the best raw score of either retriever (1.0: it is the best of one)."""
    shares = [candidate.details[f"{name}_score"] / top for name, top in best.items()
              if top > 0 and f"{name}_score" in candidate.details]
    return max(shares, default=0.0)


def order(fused: Sequence[Candidate], *, as_relevant: float = AS_RELEVANT) -> list[Candidate]:
    """Relevance first, provenance among equals: the leading run of the fused ranking whose members are as relevant
    as the best (see AS_RELEVANT) is ordered by confidence, then fused score; everything after it keeps the fused
    order (ties by confidence, then newest). So a guess never outranks an equally relevant statement, and a weak
    match never outranks a strong one whatever its source. When every candidate has the same source, this is the
    fused order exactly."""
    ranked = sorted(fused, key=lambda c: (-c.score, -c.memory.confidence, -c.memory.created_at.timestamp()))
    best = {name: max((c.details.get(f"{name}_score", 0.0) for c in ranked), default=0.0)
            for name in ("keyword", "semantic")}
    run = 0
    while run < len(ranked) and strength(ranked[run], best) >= as_relevant:
        run += 1
    lead = sorted(ranked[:run], key=lambda c: (-c.memory.confidence, -c.score, -c.memory.created_at.timestamp()))
    return lead + ranked[run:]
