"""Erasure on SQLite: what one forget() costs as the tenant grows, and an erasure of a whole user, on each SQLite
memshelf can run on. (bench/bench_erase.py compares source trees on one SQLite, one big owner with vectors; this
one compares SQLite versions and in-place deletion, over a tenant of many users.)

Each variant runs in a fresh Python process, on a new file: --rows statements from the keyword benchmark's text
generator spread over --users users of one tenant (keywords only: no vectors, no model). Then it times --forgets
single forget() calls of one user's memories, one at a time (each call includes the scrub: the full-text clean-up
and the WAL checkpoint), a remember followed by the forget of the memory it replaces (what the LangGraph store's
updating put does), and forget_user() of another user. Variants:

- "python": the sqlite3 module Python brings (its SQLite version is printed; MEMSHELF_SQLITE=python);
- "newer-merge": the SQLite bundled by the pysqlite3-binary wheel (MEMSHELF_SQLITE=pysqlite3), with in-place
  deletion turned off (memshelf.stores._sqlite_fts.SECURE_DELETE = False): every erasure merges the tenant's whole
  index, as on an SQLite older than 3.45; the baseline for the next one on the same SQLite;
- "newer-in-place": the same SQLite as shipped, deleting the entries in place.

    .venv/bin/python bench/bench_forget.py                         # 100,000 rows, 10 users
    .venv/bin/python bench/bench_forget.py --rows 20000 --json out.json
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
from _common import ROOT, machine, print_table, run_worker, save_json  # noqa: E402

VARIANTS = ("python", "newer-merge", "newer-in-place")


def run(variant: str, rows: int, users: int, forgets: int) -> dict[str, Any]:
    """One variant's timings, in ms (run in a worker process)."""
    os.environ["MEMSHELF_SQLITE"] = "python" if variant == "python" else "pysqlite3"
    from _common import TextGenerator
    from memshelf import Owner, Shelf
    from memshelf.stores import _sqlite_fts
    from memshelf.stores._sqlite_lib import sqlite3

    if variant == "newer-merge":
        _sqlite_fts.SECURE_DELETE = False
    texts = TextGenerator(seed=5).sentences(rows)
    per = rows // users
    owners = [Owner("bench", f"user-{u}") for u in range(users)]
    with tempfile.TemporaryDirectory() as folder:
        shelf = Shelf.open(Path(folder) / "memory.db", embedder=None)
        first: list[Any] = []
        for u, owner in enumerate(owners):
            for at in range(u * per, (u + 1) * per, 5_000):
                stored = shelf.remember_many(owner, [{"topic": t, "content": c, "source": s}
                                                     for t, c, s in texts[at:min(at + 5_000, (u + 1) * per)]])
                if u == 0:
                    first.extend(stored)
        single = []
        for memory in first[:forgets]:
            start = time.perf_counter()
            shelf.forget(owners[0], memory.id)
            single.append((time.perf_counter() - start) * 1e3)
        replaced = []
        old = first[forgets]
        for i in range(forgets):
            start = time.perf_counter()
            new = shelf.remember(owners[0], "notes", f"Replacement note number {i}.")
            shelf.forget(owners[0], old.id)
            replaced.append((time.perf_counter() - start) * 1e3)
            old = new
        start = time.perf_counter()
        shelf.forget_user(owners[1])
        whole_user = (time.perf_counter() - start) * 1e3
        shelf.close()
    return {"sqlite": sqlite3.sqlite_version, "forget_ms": single, "replace_ms": replaced, "forget_user_ms": whole_user}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="memories in the tenant")
    parser.add_argument("--users", type=int, default=10, help="users of the tenant, each with rows / users")
    parser.add_argument("--forgets", type=int, default=20, help="single erasures timed")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run(args.worker, args.rows, args.users, args.forgets)))
        return
    variants = [v.strip() for v in args.variants.split(",")]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}: use {', '.join(VARIANTS)}")
    results: dict[str, Any] = {}
    for variant in variants:
        if variant != "python":
            try:
                import pysqlite3  # type: ignore[import-not-found]  # noqa: F401
            except ImportError:
                print(f"skipping {variant!r}: pip install pysqlite3-binary (Linux x86-64) for a newer SQLite")
                continue
        results[variant] = run_worker(__file__, ROOT / "src", [variant, "--rows", str(args.rows), "--users",
                                                                str(args.users), "--forgets", str(args.forgets)])
    rows = []
    for variant, r in results.items():
        rows.append([variant, r["sqlite"], f"{statistics.median(r['forget_ms']):.1f}",
                     f"{max(r['forget_ms']):.1f}", f"{statistics.median(r['replace_ms']):.1f}",
                     f"{r['forget_user_ms']:,.0f}"])
    print_table(f"Erasure on SQLite: {args.rows:,} memories in one tenant, {args.users} users; "
                f"{args.forgets} single forgets", ["variant", "SQLite", "forget p50 ms", "forget max ms",
                                                     "remember + forget p50 ms",
                                                     f"forget_user ({args.rows // args.users:,} rows) ms"], rows)
    save_json(args.json, {"machine": machine(), "rows": args.rows, "users": args.users, "results": results})


if __name__ == "__main__":
    main()
