"""Fusing the keyword and the meaning retrievers into one ranking."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence

from .model import Memory
from .stores.base import Scored

RRF_K = 10
KEYWORD_WEIGHT = 1.0
SEMANTIC_WEIGHT = 0.5


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
