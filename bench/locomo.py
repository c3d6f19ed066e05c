"""Retrieval quality on LoCoMo, through memshelf's public API (issue 3; protocol in ../shared/data/README.md).

For each of the ten conversations: one Owner, every turn stored in conversation order with one remember_many call
(topic `session_N`, content "Speaker: text", source "stated"), then every question asked with
shelf.search(owner, question, mode=..., limit=10). Hits map back to turns by (topic, content) within the owner, and
are scored against the evidence turns: any@k, frac@k (LoCoMo's "recall accuracy"), all@k, for k = 5 and 10.

The data set is CC BY-NC 4.0, for evaluation only: it is read from outside the repository and never copied in.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/locomo.py                    # default data path, all modes
    HF_HUB_OFFLINE=1 .venv/bin/python bench/locomo.py --json out.json    # also write the numbers
    HF_HUB_OFFLINE=1 .venv/bin/python bench/locomo.py --postgres         # on a throwaway embedded PostgreSQL
    HF_HUB_OFFLINE=1 .venv/bin/python bench/locomo.py --mine --modes keyword --embedder none   # with mined records

--mine: after the turns are stored, each conversation is learned from with `Shelf.learn(owner, turns,
extractor="rules")`, one call per session, before any question is asked. LoCoMo's two speakers both talk about
themselves in the first person, and neither is an assistant, so every turn is given as a "user" turn (its dia_id
as the message id, the session's date as when it was said). The owner stays one per conversation, as in the
protocol: what each speaker says of themselves lands on the same owner (a fact key like `home_city` is shared by
both speakers, the later one replacing the earlier, and a mined memory says "The user ..." for either). Mined
memories join the turns in search; a hit on one counts as retrieving the turns it was learned from (its
evidence). Mined facts are stored too, but search returns memories only, so they cannot change these numbers.

Tuning knobs (--rrf-k, --semantic-k, --semantic-weight, --candidates, --set module.NAME=value, ...) override
module constants at run time so experiments need no edit of the library; the defaults measure the library exactly
as shipped. --dump writes each question's candidates for bench/fusion_lab.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    add_retrieval_flags, average, retrieval_setup, run_and_report, shared_data, shelf_target)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = shared_data("locomo10.json")
MODES = ("keyword", "semantic", "hybrid", "auto")
KS = (5, 10)
METRICS = ("any@5", "frac@5", "all@5", "any@10", "frac@10")
DIA_ID = re.compile(r"^D(\d+):(\d+)$")


# ---------------------------------------------------------------------------------------------------- data
@dataclass
class Question:
    text: str
    category: int
    evidence: frozenset[str]


@dataclass
class Conversation:
    sample_id: str
    turns: list[tuple[str, str, str]] = field(default_factory=list)  # (dia_id, topic, content), in order
    said: list[tuple[str, str, str, datetime | None]] = field(default_factory=list)  # (dia_id, topic, text, when)
    questions: list[Question] = field(default_factory=list)


def load(path: Path) -> list[Conversation]:
    """Conversations in the README's protocol. Malformed evidence entries ("D8:6; D9:17") and entries naming
    turns that do not exist are skipped; questions left with no evidence are skipped."""
    samples = json.loads(path.read_text(encoding="utf-8"))
    out: list[Conversation] = []
    for sample in samples:
        conv = sample["conversation"]
        c = Conversation(str(sample["sample_id"]))
        sessions = sorted((int(m.group(1)), key) for key in conv
                          if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(conv[key], list))
        for number, key in sessions:
            when = session_time(conv.get(f"{key}_date_time"))
            for turn in conv[key]:
                c.turns.append((turn["dia_id"], f"session_{number}", f"{turn['speaker']}: {turn['text']}"))
                c.said.append((turn["dia_id"], f"session_{number}", turn["text"], when))
        known = {dia for dia, _, _ in c.turns}
        for qa in sample["qa"]:
            evidence = frozenset(e for e in qa.get("evidence", []) if isinstance(e, str)
                                 and DIA_ID.match(e.strip()) and e.strip() in known)
            if evidence:
                c.questions.append(Question(qa["question"], int(qa["category"]), evidence))
        out.append(c)
    return out


def session_time(value: object) -> datetime | None:
    """LoCoMo's "1:56 pm on 8 May, 2023" as a UTC datetime (LoCoMo gives no timezone); None when absent or odd."""
    try:
        return datetime.strptime(str(value), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------------- mining
@dataclass
class Mined:
    # per conversation: (topic, content) of each mined memory -> the dia_ids of its evidence
    memories: dict[str, dict[tuple[str, str], set[str]]] = field(default_factory=lambda: defaultdict(dict))
    facts: int = 0
    skipped: int = 0
    learn_calls: int = 0
    seconds: float = 0.0


def mine(shelf: Any, owner: Any, conv: Conversation, mined: Mined) -> None:
    """Learn from the conversation with the rules extractor, one call per session, every turn as a user turn."""
    sessions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for dia, topic, text, when in conv.said:
        sessions[topic].append({"role": "user", "content": text, "id": dia, "at": when})
    for turns in sessions.values():
        started = time.perf_counter()
        plan = shelf.learn(owner, turns, extractor="rules")
        mined.seconds += time.perf_counter() - started
        mined.learn_calls += 1
        mined.skipped += len(plan.skipped)
        for proposal in plan.applied:
            if proposal.op == "set_fact":
                mined.facts += 1
            else:
                learned = mined.memories[conv.sample_id]
                learned.setdefault((proposal.topic or "", proposal.content or ""), set()).update(proposal.evidence)


# ---------------------------------------------------------------------------------------------------- scoring
def score(retrieved: Sequence[set[str]], evidence: frozenset[str]) -> dict[str, float]:
    """retrieved: for each hit, best first, the dia_ids it stands for."""
    out: dict[str, float] = {}
    for k in KS:
        found = set().union(*retrieved[:k]) & evidence if retrieved else set()
        out[f"any@{k}"] = float(bool(found))
        out[f"frac@{k}"] = len(found) / len(evidence)
        out[f"all@{k}"] = float(found == evidence)
    return out


# ---------------------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> dict[str, Any]:
    from memshelf import Owner, Shelf

    data = Path(args.data)
    if not data.is_file():
        sys.exit(f"LoCoMo data not found at {data}: pass its path as the first argument (locomo10.json from "
                 "snap-research/LoCoMo, CC BY-NC 4.0, evaluation only; keep it outside the repository)")
    conversations = load(data)
    if args.conversations:
        conversations = conversations[: args.conversations]
    modes, embedder, dump, overrides = retrieval_setup(args)
    mined = Mined()
    mined_share: dict[str, list[float]] = defaultdict(list)
    per_mode: dict[str, list[tuple[int, dict[str, float]]]] = {m: [] for m in modes}
    search_seconds: dict[str, list[float]] = defaultdict(list)
    started = time.perf_counter()
    remember_seconds = 0.0
    with tempfile.TemporaryDirectory(prefix="memshelf-locomo-") as tmp, ExitStack() as stack:
        target = shelf_target(args, tmp, stack, "locomo.db")
        shelf = Shelf.open(target, embedder=embedder, floor=args.floor)
        try:
            owners = [Owner("locomo", re.sub(r"[^A-Za-z0-9_.-]", "_", c.sample_id)) for c in conversations]
            # Every conversation is stored before any question is asked, so the index statistics (bm25's idf is
            # global to the file) do not depend on the order the conversations are evaluated in.
            for conv, owner in zip(conversations, owners):
                t0 = time.perf_counter()
                stored = shelf.remember_many(owner, [{"topic": topic, "content": content, "source": "stated"}
                                                     for _, topic, content in conv.turns])
                remember_seconds += time.perf_counter() - t0
                if dump is not None:
                    dump.owner(owner, stored, [[dia] for dia, _, _ in conv.turns])
            if args.mine:
                for conv, owner in zip(conversations, owners):
                    mine(shelf, owner, conv, mined)
            for conv, owner in zip(conversations, owners):
                by_text: dict[tuple[str, str], set[str]] = defaultdict(set)
                for dia, topic, content in conv.turns:
                    by_text[(topic, content)].add(dia)
                learned = mined.memories.get(conv.sample_id, {})
                for key, dias in learned.items():
                    by_text[key] |= dias
                if embedder is not None:
                    embedder.prime([q.text for q in conv.questions])
                for question in conv.questions:
                    for mode in modes:
                        t0 = time.perf_counter()
                        hits = shelf.search(owner, question.text, mode=mode, limit=max(KS))
                        search_seconds[mode].append(time.perf_counter() - t0)
                        retrieved = [by_text.get((h.memory.topic, h.memory.content), set()) for h in hits]
                        top = [(h.memory.topic, h.memory.content) for h in hits[:5]]
                        mined_share[mode].append(sum(key in learned for key in top) / max(1, len(top)))
                        per_mode[mode].append((question.category, score(retrieved, question.evidence)))
                    if dump is not None:
                        dump.question(shelf, owner, question.text, question.evidence, str(question.category))
        finally:
            shelf.close()
            if embedder is not None:
                embedder.save()
    if dump is not None:
        dump.save()
    results: dict[str, Any] = {}
    for mode, rows in per_mode.items():
        results[mode] = {
            "all": average([r for _, r in rows], METRICS),
            "cat1-4": average([r for c, r in rows if c in (1, 2, 3, 4)], METRICS),
            "search_ms_mean": 1000 * statistics.fmean(search_seconds[mode] or [0.0]),
            "search_ms_p50": 1000 * statistics.median(search_seconds[mode] or [0.0]),
            "mined_share@5": sum(mined_share[mode]) / max(1, len(mined_share[mode])),
        }
    n_all = sum(len(c.questions) for c in conversations)
    n_14 = sum(1 for c in conversations for q in c.questions if q.category in (1, 2, 3, 4))
    return {
        "data": str(data), "conversations": len(conversations), "turns": sum(len(c.turns) for c in conversations),
        "questions": {"all": n_all, "cat1-4": n_14},
        "backend": "postgresql" if args.postgres or "://" in (args.db or "") else "sqlite",
        "embedder": embedder.model if embedder is not None else None, "floor": args.floor,
        "mined": {"on": args.mine, "memories": sum(map(len, mined.memories.values())), "facts": mined.facts,
                  "skipped": mined.skipped, "learn_calls": mined.learn_calls, "seconds": mined.seconds},
        "overrides": {k: v for k, v in overrides.items()}, "results": results,
        "seconds": {"total": time.perf_counter() - started, "embedding": embedder.seconds if embedder else 0.0,
                    "remember_many": remember_seconds},
    }


def show(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    q = report["questions"]
    table = Table(title=f"LoCoMo retrieval, {report['conversations']} conversations, {report['turns']} turns, "
                        f"{q['all']} questions ({q['cat1-4']} in categories 1-4); embedder {report['embedder']}")
    table.add_column("mode")
    table.add_column("questions")
    for metric in METRICS:
        table.add_column(metric, justify="right")
    table.add_column("ms/search mean / p50", justify="right")
    for mode, r in report["results"].items():
        for subset in ("all", "cat1-4"):
            table.add_row(mode if subset == "all" else "", subset, *(f"{r[subset][m]:.3f}" for m in METRICS),
                          f"{r['search_ms_mean']:.1f} / {r['search_ms_p50']:.1f}" if subset == "all" else "")
    console = Console()
    console.print(table)
    m = report["mined"]
    if m["on"]:
        shares = ", ".join(f"{mode} {r['mined_share@5']:.3f}" for mode, r in report["results"].items())
        console.print(f"mined: {m['memories']} memories and {m['facts']} facts from {m['learn_calls']} learn calls "
                      f"({m['skipped']} proposals skipped), {m['seconds']:.1f} s; share of top-5 hits that are "
                      f"mined memories: {shares}")
    if report["overrides"]:
        console.print(f"overrides: {report['overrides']}")
    s = report["seconds"]
    console.print(f"{s['total']:.0f} s in all, {s['embedding']:.0f} s embedding, floor {report['floor']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="?", default=str(DEFAULT_DATA), help=f"locomo10.json (default {DEFAULT_DATA})")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    add_retrieval_flags(parser, MODES, "comma-separated search modes (default all)")
    parser.add_argument("--mine", action="store_true",
                        help="also learn from each conversation with the rules extractor before the questions")
    parser.add_argument("--conversations", type=int, default=0, help="only the first N conversations (quick runs)")
    return run_and_report(parser.parse_args(argv), run, show)


if __name__ == "__main__":
    raise SystemExit(main())
