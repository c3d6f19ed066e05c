"""A hybrid search's two retrievers: their candidates gathered (both_sides) and fused into one ranking."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from collections.abc import Callable, Sequence

import numpy as np

from .model import Memory, Owner
from .stores.base import CURRENT, Scored, Store, View

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
SIDES_AT_ONCE = True
"""A hybrid search runs its meaning side on a side thread while its keyword side runs on the caller's, when the
store says it pays (Store.reads_aside: PostgreSQL outside a transaction, where both sides wait on the server), so
the search takes about as long as the slower side instead of both (BENCHMARKS.md)."""
SIDE_THREADS = 4
"""Meaning sides running at once in a process; when all are busy a search runs its own, one side after the other."""


_sides: ThreadPoolExecutor | None = None
_side_slots = threading.BoundedSemaphore(SIDE_THREADS)
_sides_lock = threading.Lock()


def _beside(read: Callable[..., Any], *args: Any) -> Future[Any] | None:
    """`read(*args)` started on one of the process's side threads, or None when all SIDE_THREADS are busy (a loaded
    server): the caller then runs it itself, so a search never queues behind other searches' sides. The pool is made
    on first use, and again in a forked child, which inherits the pool but not its threads."""
    global _sides
    if not _side_slots.acquire(blocking=False):
        return None
    try:
        with _sides_lock:
            if _sides is None:
                _sides = ThreadPoolExecutor(SIDE_THREADS, thread_name_prefix="memshelf-side")
            started = _sides.submit(read, *args)
    except RuntimeError:  # the interpreter is shutting down: no new threads
        _side_slots.release()
        return None
    except BaseException:
        _side_slots.release()
        raise
    started.add_done_callback(lambda _: _side_slots.release())
    return started


def both_sides(store: Store, owner: Owner, model: str, terms: list[str], query: np.ndarray, width: int,
               floor: float, now: datetime, view: View = CURRENT,
               at_once: bool | None = None) -> tuple[list[Scored], list[Scored]]:
    """A hybrid search's candidates, `width` a side: (by words with their conversation context, by meaning). The
    meaning side runs on a side thread while the words side runs on the caller's when `at_once` (default
    SIDES_AT_ONCE), the store allows it (Store.reads_aside) and a side thread is free; else one after the other."""
    at_once = SIDES_AT_ONCE if at_once is None else at_once
    meaning = _beside(store.vector_search, owner, model, query, width, floor, now, view) \
        if at_once and store.reads_aside() else None
    try:
        by_words = store.keyword_search(owner, terms, width, now, by_confidence=False, view=view)
    finally:
        if meaning is not None:
            wait([meaning])  # never leave a read running behind a failed search
    by_meaning = meaning.result() if meaning is not None else \
        store.vector_search(owner, model, query, width, floor, now, view)
    return by_words, by_meaning


def _forget_side_pool() -> None:
    global _sides, _side_slots
    _sides, _side_slots = None, threading.BoundedSemaphore(SIDE_THREADS)


os.register_at_fork(after_in_child=_forget_side_pool)


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
