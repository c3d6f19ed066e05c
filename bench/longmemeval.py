"""Retrieval quality on LongMemEval_S's development split, through memshelf's public API (retrieval issue; protocol
in ../shared/data/README.md).

For each question: one Owner, every non-empty user turn of its haystack stored in haystack order with one
remember_many call (topic the session id, content the turn's text, a turn over 16,000 characters in consecutive
16,000-character pieces, source "stated"); then the question asked with shelf.search(owner, question, mode=...,
limit=50). The ranked memories collapse to their sessions in rank order, and the top 5 and 10 sessions are scored
against the evidence sessions: any@k (at least one evidence session) and all@k (every one), over all questions and
per question type.

The 105 questions are a development split: the project is scored on held-out questions, so use this to measure
retrieval in general, never to tune for these questions. The data is read from outside the repository.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/longmemeval.py                         # default data path, all modes
    HF_HUB_OFFLINE=1 .venv/bin/python bench/longmemeval.py --questions 5           # a quick run
    HF_HUB_OFFLINE=1 .venv/bin/python bench/longmemeval.py --json out.json         # also write the numbers

The JSON keeps, per question and mode, the ranked sessions and every hit on an evidence session within the 50
(rank, score, retriever, details), so a miss can be read without rerunning.

Tuning knobs (--rrf-k, --semantic-k, --semantic-weight, --candidates, --set module.NAME=value, ...) override
module constants at run time, as in bench/locomo.py; the defaults measure the library exactly as shipped. --dump
writes each question's candidates for bench/fusion_lab.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    add_retrieval_flags, average, retrieval_setup, run_and_report, shared_data, shelf_target)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = shared_data("longmemeval_s_dev.json")
MODES = ("keyword", "semantic", "auto")
KS = (5, 10)
METRICS = ("any@5", "all@5", "any@10", "all@10")
LIMIT = 50
PIECE = 16_000  # memshelf.model.MAX_CONTENT_CHARS


# ---------------------------------------------------------------------------------------------------- data
@dataclass
class Question:
    question_id: str
    question_type: str
    text: str
    evidence: frozenset[str]
    turns: list[tuple[str, str]] = field(default_factory=list)  # (session id, content), in haystack order


def pieces(text: str) -> list[str]:
    """A turn as stored: whole, or in consecutive PIECE-character pieces when longer."""
    return [text[i:i + PIECE] for i in range(0, len(text), PIECE)]


def load(path: Path, bury: int = 0) -> list[Question]:
    """The questions with their haystacks; with `bury`, each user turn marked has_answer is stored after the first
    `bury` characters of the longest other user turn of its haystack, in one memory (a long memory whose relevant
    part is at its end: what embedding in pieces is for)."""
    out: list[Question] = []
    for item in json.loads(path.read_text(encoding="utf-8")):
        q = Question(str(item["question_id"]), str(item["question_type"]), str(item["question"]),
                     frozenset(item["answer_session_ids"]))
        users = [t for s in item["haystack_sessions"] for t in s if t.get("role") == "user"]
        filler = max((t["content"] for t in users if not t.get("has_answer")), key=len, default="")[:bury]
        for session_id, session in zip(item["haystack_session_ids"], item["haystack_sessions"]):
            for turn in session:
                if turn.get("role") == "user" and turn.get("content", "").strip():
                    text = f"{filler}\n\n{turn['content']}" if bury and turn.get("has_answer") else turn["content"]
                    q.turns.extend((session_id, piece) for piece in pieces(text))
        out.append(q)
    return out


# ---------------------------------------------------------------------------------------------------- scoring
def sessions_in_order(hit_sessions: Sequence[str]) -> list[str]:
    """The hits' sessions, each once, in the rank of its best hit."""
    return list(dict.fromkeys(hit_sessions))


def score(ranked: Sequence[str], evidence: frozenset[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in KS:
        found = set(ranked[:k]) & evidence
        out[f"any@{k}"] = float(bool(found))
        out[f"all@{k}"] = float(found == evidence)
    return out


# ---------------------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> dict[str, Any]:
    from memshelf import Owner, Shelf

    data = Path(args.data)
    if not data.is_file():
        print(f"LongMemEval data not found at {data}: pass the path of longmemeval_s_dev.json as the first argument "
              "(see ../shared/data/README.md; keep it outside the repository)", file=sys.stderr)
        raise SystemExit(2)
    questions = load(data, args.bury)
    if args.questions:
        questions = questions[: args.questions]
    modes, embedder, dump, overrides = retrieval_setup(args)
    rows: dict[str, list[tuple[str, dict[str, float]]]] = {m: [] for m in modes}
    per_question: list[dict[str, Any]] = []
    search_seconds: dict[str, list[float]] = defaultdict(list)
    started = time.perf_counter()
    remember_seconds = 0.0
    with tempfile.TemporaryDirectory(prefix="memshelf-lme-") as tmp, ExitStack() as stack:
        target = shelf_target(args, tmp, stack, "longmemeval.db")
        shelf = Shelf.open(target, embedder=embedder, floor=args.floor)
        try:
            owners = [Owner("lme", f"q{i}") for i in range(len(questions))]
            session_of: dict[str, str] = {}  # memory id -> session id
            # Every haystack is stored before any question is asked, so the index statistics (bm25's idf is global
            # to the file) do not depend on the order the questions are evaluated in.
            for q, owner in zip(questions, owners):
                if embedder is not None:
                    embedder.prime([content for _, content in q.turns])
                t0 = time.perf_counter()
                stored = shelf.remember_many(owner, [{"topic": s, "content": c, "source": "stated"}
                                                     for s, c in q.turns])
                remember_seconds += time.perf_counter() - t0
                session_of.update((m.id, s) for m, (s, _) in zip(stored, q.turns))
                if dump is not None:
                    dump.owner(owner, stored, [[s] for s, _ in q.turns])
            if embedder is not None:
                embedder.prime([q.text for q in questions])
            for q, owner in zip(questions, owners):
                record: dict[str, Any] = {"question_id": q.question_id, "question_type": q.question_type,
                                          "question": q.text, "evidence": sorted(q.evidence), "modes": {}}
                for mode in modes:
                    t0 = time.perf_counter()
                    hits = shelf.search(owner, q.text, mode=mode, limit=LIMIT)
                    search_seconds[mode].append(time.perf_counter() - t0)
                    hit_sessions = [session_of.get(h.memory.id, h.memory.topic) for h in hits]
                    ranked = sessions_in_order(hit_sessions)
                    result = score(ranked, q.evidence)
                    rows[mode].append((q.question_type, result))
                    record["modes"][mode] = {
                        **result, "sessions": ranked[:max(KS)],
                        "evidence_hits": [{"rank": i + 1, "session": s, "score": round(h.score, 6),
                                           "retriever": h.retriever, "details": dict(h.details),
                                           "content": h.memory.content[:160]}
                                          for i, (h, s) in enumerate(zip(hits, hit_sessions)) if s in q.evidence]}
                per_question.append(record)
                if dump is not None:
                    dump.question(shelf, owner, q.text, q.evidence, q.question_type)
        finally:
            shelf.close()
            if embedder is not None:
                embedder.save()
    if dump is not None:
        dump.save()
    types = sorted({q.question_type for q in questions}, key=lambda t: (-sum(q.question_type == t
                                                                             for q in questions), t))
    results: dict[str, Any] = {}
    for mode, scored in rows.items():
        results[mode] = {"all": average([r for _, r in scored], METRICS),
                         "by_type": {t: average([r for qt, r in scored if qt == t], METRICS) for t in types},
                         "search_ms_mean": 1000 * statistics.fmean(search_seconds[mode] or [0.0]),
                         "search_ms_p50": 1000 * statistics.median(search_seconds[mode] or [0.0])}
    return {
        "data": str(data), "questions": len(questions),
        "by_type": {t: sum(q.question_type == t for q in questions) for t in types},
        "memories": sum(len(q.turns) for q in questions),
        "backend": "postgresql" if args.postgres or "://" in (args.db or "") else "sqlite",
        "embedder": embedder.model if embedder is not None else None, "floor": args.floor, "limit": LIMIT,
        "overrides": dict(overrides), "bury": args.bury, "results": results,
        "seconds": {"total": time.perf_counter() - started, "embedding": embedder.seconds if embedder else 0.0,
                    "remember_many": remember_seconds},
        "per_question": per_question,
    }


def show(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"LongMemEval_S dev retrieval, {report['questions']} questions, {report['memories']} "
                        f"memories; sessions from the top {report['limit']} hits; embedder {report['embedder']}")
    table.add_column("mode")
    table.add_column("questions")
    for metric in METRICS:
        table.add_column(metric, justify="right")
    table.add_column("ms/search mean / p50", justify="right")
    for mode, r in report["results"].items():
        table.add_row(mode, f"all ({report['questions']})", *(f"{r['all'][m]:.3f}" for m in METRICS),
                      f"{r['search_ms_mean']:.1f} / {r['search_ms_p50']:.1f}")
        for t, values in r["by_type"].items():
            table.add_row("", f"{t} ({report['by_type'][t]})", *(f"{values[m]:.3f}" for m in METRICS), "")
    console = Console(width=160)
    console.print(table)
    if report["overrides"]:
        console.print(f"overrides: {report['overrides']}")
    s = report["seconds"]
    console.print(f"{s['total']:.0f} s in all, {s['embedding']:.0f} s embedding, {s['remember_many']:.0f} s "
                  f"remember_many, floor {report['floor']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="?", default=str(DEFAULT_DATA),
                        help=f"longmemeval_s_dev.json (default {DEFAULT_DATA})")
    parser.add_argument("--json", metavar="PATH", help="also write the report, with per-question hits, as JSON")
    add_retrieval_flags(parser, MODES, "comma-separated search modes: keyword, semantic, hybrid, auto (default "
                                f"{','.join(MODES)}; auto is the default search, hybrid with an embedder)")
    parser.add_argument("--questions", type=int, default=0, help="only the first N questions (quick runs)")
    parser.add_argument("--bury", type=int, default=0, metavar="CHARS",
                        help="a stress test, not the protocol: store each evidence turn (has_answer) after CHARS "
                             "characters of the haystack's longest other user turn, in one memory")
    return run_and_report(parser.parse_args(argv), run, show)


if __name__ == "__main__":
    raise SystemExit(main())
