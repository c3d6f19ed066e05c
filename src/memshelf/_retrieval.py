"""Fusing the keyword and the meaning retrievers into one ranking."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence

from .model import Memory
from .stores.base import Scored

RRF_K = 10
KEYWORD_WEIGHT = 1.0
SEMANTIC_WEIGHT = 0.5
AS_RELEVANT = 0.8
"""A candidate is as relevant as the best when one retriever scores it at least this share of that retriever's best
raw score (bm25 or ts_rank for keywords, cosine for meaning). Provenance orders only among those."""


@dataclass
class Candidate:
    memory: Memory
    score: float = 0.0
    retriever: str = ""
    details: dict[str, float] = field(default_factory=dict)


def fuse(by_words: Sequence[Scored], by_meaning: Sequence[Scored], *, k: int = RRF_K,
         keyword_weight: float = KEYWORD_WEIGHT, semantic_weight: float = SEMANTIC_WEIGHT) -> list[Candidate]:
    """Weighted reciprocal rank fusion: each retriever adds weight / (k + rank) for every row it ranks.

    A row found by both retrievers is marked "hybrid"; details keep each retriever's rank and raw score.
    Returned best first.
    """
    merged: dict[str, Candidate] = {}
    for name, weight, ranked in (("keyword", keyword_weight, by_words), ("semantic", semantic_weight, by_meaning)):
        for rank, scored in enumerate(ranked, 1):
            cand = merged.setdefault(scored.memory.id, Candidate(scored.memory))
            cand.score += weight / (k + rank)
            cand.retriever = "hybrid" if cand.retriever and cand.retriever != name else name
            cand.details[f"{name}_rank"] = rank
            cand.details[f"{name}_score"] = round(scored.score, 6)
    return sorted(merged.values(), key=lambda c: -c.score)


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
