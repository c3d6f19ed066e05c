"""Keyword search in a tenant of many users (one SQLite file): the shape of a service with one tenant and a small
memory per end user, where each search should cost what the asking user's memories cost, not the tenant's.

--users users of one tenant, --per-user memories each (the keyword benchmark's text generator), loaded in batches
of one user per remember_many, then --questions keyword searches (shelf.search(..., mode="keyword", limit=5)), each
for a random user with two words drawn from the generator's vocabulary at its middle ranks. One fresh process per
source tree (--src, repeatable, alternating round by round), so another commit is measured in the same run.

    .venv/bin/python bench/bench_many_users.py                                   # 10,000 users x 10 memories
    .venv/bin/python bench/bench_many_users.py --users 100000 --per-user 1 --src ../before/src --src src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, add_source_flags, machine, percentile, print_table, run_worker, save_json  # noqa: E402


def run(users: int, per_user: int, questions: int) -> dict[str, float]:
    """One load and its searches (in a worker process); milliseconds."""
    import random

    from _common import TextGenerator
    from memshelf import Owner, Shelf

    gen = TextGenerator(seed=5)
    texts = gen.sentences(users * per_user)
    rng = random.Random(9)
    middle = gen.vocabulary[200:1200]
    with tempfile.TemporaryDirectory() as folder:
        shelf = Shelf.open(Path(folder) / "memory.db", embedder=None)
        start = time.perf_counter()
        for u in range(users):
            shelf.remember_many(Owner("acme", f"user-{u}"), [
                {"topic": topic, "content": content, "source": source}
                for topic, content, source in texts[u * per_user:(u + 1) * per_user]])
        load = time.perf_counter() - start
        asked = [(Owner("acme", f"user-{rng.randrange(users)}"), f"{rng.choice(middle)} {rng.choice(middle)}")
                 for _ in range(questions)]
        for owner, question in asked[:20]:  # warm the page cache
            shelf.search(owner, question, mode="keyword", limit=5)
        times = []
        for owner, question in asked:
            start = time.perf_counter()
            shelf.search(owner, question, mode="keyword", limit=5)
            times.append((time.perf_counter() - start) * 1e3)
        shelf.close()
    return {"load_s": load, "p50_ms": statistics.median(times), "p95_ms": percentile(times, 95)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--per-user", type=int, default=10)
    parser.add_argument("--questions", type=int, default=500)
    add_source_flags(parser, rounds=2)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run(args.users, args.per_user, args.questions)))
        return
    sources = [src.resolve() for src in (args.src or [ROOT / "src"])]
    samples: dict[str, list[dict[str, float]]] = {str(src): [] for src in sources}
    worker = ["--users", str(args.users), "--per-user", str(args.per_user), "--questions", str(args.questions)]
    for _ in range(args.rounds):
        for src in sources:
            samples[str(src)].append(run_worker(__file__, src, worker))
    first = statistics.median(r["p50_ms"] for r in samples[str(sources[0])])
    rows: list[list[Any]] = []
    for src in sources:
        runs = samples[str(src)]
        p50 = statistics.median(r["p50_ms"] for r in runs)
        rows.append([os.path.relpath(src), f"{p50:.2f}", " / ".join(f"{r['p50_ms']:.2f}" for r in runs),
                     f"{statistics.median(r['p95_ms'] for r in runs):.2f}", f"{first / p50:.2f}x"])
    print_table(f"Keyword search in one tenant of {args.users:,} users x {args.per_user} memories "
                f"({args.questions} questions, median of {args.rounds} rounds)",
                ["source", "p50 ms", "rounds", "p95 ms", "speed vs first"], rows)
    save_json(args.json, {"machine": machine(), "users": args.users, "per_user": args.per_user,
                          "questions": args.questions, "sources": samples})


if __name__ == "__main__":
    main()
