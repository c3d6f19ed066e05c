"""Keyword search and remember() speed (issue 2), beside the spec's LIKE query on the same data in the same run.

For each size N (memories of one owner in one SQLite file, WAL, as Shelf.open makes it):
  * build: N - S memories with Shelf.remember_many in batches (batched throughput), then S single remember()
    calls (single throughput), so the file ends with exactly N memories;
  * queries: questions whose terms match many rows (the most frequent words), a middling number, few, none, and
    mixes of two terms. Each is asked with shelf.search(owner, question, mode="keyword", limit=5) (end to end:
    keywords(), FTS5, building Hit objects) and with the spec 000 search(): keywords(question) then
    `topic LIKE ? OR content LIKE ?` per term, ORDER BY confidence DESC, created_at DESC LIMIT 5, on the memories
    table of the same file through the sqlite3 module memshelf runs on (MEMSHELF_SQLITE's choice: two SQLite
    libraries in one process must not open one file). The two are interleaved query by query. Then the
    same questions with every match ranked (memshelf before it bounded the matches it ranks, SQLiteStore.RANKED),
    each after its LIKE query, as often: their time, and how many return the same five memories as the shipped
    search.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_keyword.py                       # 1k, 10k, 100k
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_keyword.py --sizes 1000 --json out.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (TextGenerator, database_dir, fmt_ms, machine, make_vocabulary, print_table, save_json,  # noqa: E402
                     summarize_ms)

from memshelf import Owner, Shelf, keywords  # noqa: E402
from memshelf.stores import sqlite as sqlite_store  # noqa: E402
from memshelf.stores.sqlite import sqlite3  # noqa: E402  (the store's own SQLite, for the LIKE query too)

OWNER = Owner("bench", "one-user")
LIMIT = 5


def spec_like_search(conn: sqlite3.Connection, terms: list[str], limit: int = LIMIT) -> list[dict]:
    """spec 000's search(), verbatim but for the table name (memshelf's table; one owner in the file)."""
    if not terms:
        return []
    clause = " OR ".join(["topic LIKE ? OR content LIKE ?"] * len(terms))
    params: list = []
    for term in terms:
        params += [f"%{term}%", f"%{term}%"]
    params.append(limit)
    rows = conn.execute(
        "SELECT topic, content, confidence FROM memories"
        f" WHERE {clause}"
        " ORDER BY confidence DESC, created_at DESC LIMIT ?",
        params,
    ).fetchall()
    return [{"topic": r[0], "content": r[1], "confidence": r[2]} for r in rows]


def build_questions(gen: TextGenerator, count: int, seed: int = 3) -> list[tuple[str, str]]:
    """(category, question) pairs. Categories by the vocabulary's Zipf rank, so they are the same at every size."""
    rng = np.random.default_rng(seed)
    vocab = gen.vocabulary
    absent = [w for w in make_vocabulary(len(vocab) + 400, seed=99) if w not in set(vocab)][:200]
    bands = {
        "many": lambda: vocab[int(rng.integers(0, 8))],                  # in 30-70% of rows
        "mid": lambda: vocab[int(rng.integers(40, 200))],                # ~1-5% of rows
        "few": lambda: vocab[int(rng.integers(2500, len(vocab)))],       # a handful of rows (at 100k)
        "none": lambda: absent[int(rng.integers(len(absent)))],          # no row
    }
    templates = ("What did I say about the {}?", "Where is my {}?", "Remind me of the {} again.",
                 "Tell me what you know about {}.")
    two = ("What about the {} and the {}?", "Is the {} near the {}?")
    kinds = ["many", "mid", "few", "none", "many+few", "mid+none", "many+mid"]
    out: list[tuple[str, str]] = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        if "+" in kind:
            a, b = kind.split("+")
            q = two[i % len(two)].format(bands[a](), bands[b]())
        else:
            q = templates[i % len(templates)].format(bands[kind]())
        out.append((kind, q))
    return out


def match_count(conn: sqlite3.Connection, terms: list[str]) -> int:
    """Rows whose topic or content has a word starting with any of the terms (what memshelf's FTS5 query matches),
    counted on the one tenant's full-text table."""
    any_term = " OR ".join('"' + t.replace('"', '""') + '"*' for t in terms)
    table = conn.execute("SELECT words FROM fts_tenants").fetchone()[0]
    return conn.execute(f"SELECT count(*) FROM {table} WHERE {table} MATCH ?",
                        (f"{{topic content}} : ({any_term})",)).fetchone()[0]


def run_size(n: int, args: argparse.Namespace, db_dir: Path) -> dict[str, Any]:
    path = db_dir / f"bench_keyword_{n}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    gen = TextGenerator(vocabulary_size=args.vocabulary, seed=11)
    data = gen.sentences(n)
    singles = min(args.single, n // 2)
    bulk = data[: n - singles]
    shelf = Shelf.open(path, embedder=None)

    t0 = time.perf_counter()
    for start in range(0, len(bulk), args.batch):
        shelf.remember_many(OWNER, [{"topic": t, "content": c, "source": s}
                                    for t, c, s in bulk[start:start + args.batch]])
    batched_s = time.perf_counter() - t0

    single_times = []
    for t, c, s in data[n - singles:]:
        t1 = time.perf_counter()
        shelf.remember(OWNER, t, c, source=s)
        single_times.append(time.perf_counter() - t1)
    single_s = sum(single_times)

    conn = sqlite3.connect(path)  # the spec's connection: a plain one, default settings
    assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == n

    questions = build_questions(gen, args.queries)
    terms = {q: keywords(q) for _, q in questions}
    counts = {q: match_count(conn, terms[q]) for _, q in questions}

    def ours(q: str) -> Any:
        return shelf.search(OWNER, q, mode="keyword", limit=LIMIT)

    def theirs(q: str) -> Any:
        return spec_like_search(conn, keywords(q), LIMIT)

    def every(q: str) -> Any:
        """The same search with every match ranked (memshelf before it bounded the matches it ranks)."""
        bound, sqlite_store.RANKED = sqlite_store.RANKED, 10**12
        try:
            return ours(q)
        finally:
            sqlite_store.RANKED = bound

    # warm-up pass (page cache, statement cache), then timed passes, the two interleaved query by query
    for _, q in questions:
        ours(q)
        theirs(q)
    ours_t: dict[str, list[float]] = defaultdict(list)
    like_t: dict[str, list[float]] = defaultdict(list)
    every_t: dict[str, list[float]] = defaultdict(list)
    like_every = max(1, args.repeats // args.like_repeats)
    clock = time.perf_counter
    for r in range(args.repeats):
        for _, q in questions:
            a = clock()
            ours(q)
            b = clock()
            ours_t[q].append(b - a)
            if r % like_every == 0 and len(like_t[q]) < args.like_repeats:
                c = clock()
                theirs(q)
                d = clock()
                every(q)
                every_t[q].append(clock() - d)
                like_t[q].append(d - c)

    same = {q: [h.memory.id for h in ours(q)] == [h.memory.id for h in every(q)] for _, q in questions}

    by_kind: dict[str, dict[str, list]] = defaultdict(lambda: {"ours": [], "like": [], "counts": [], "every": [],
                                                                "same": []})
    for kind, q in questions:
        by_kind[kind]["ours"] += ours_t[q]
        by_kind[kind]["like"] += like_t[q]
        by_kind[kind]["counts"].append(counts[q])
        by_kind[kind]["every"] += every_t[q]
        by_kind[kind]["same"].append(same[q])
    all_ours = [x for q in ours_t for x in ours_t[q]]
    all_like = [x for q in like_t for x in like_t[q]]
    per_query_ratio = [float(np.median(like_t[q]) / np.median(ours_t[q])) for _, q in questions]
    result = {
        "size": n,
        "db_bytes": path.stat().st_size + (Path(str(path) + "-wal").stat().st_size
                                           if Path(str(path) + "-wal").exists() else 0),
        "remember_many": {"rows": len(bulk), "batch": args.batch, "seconds": batched_s,
                          "per_second": len(bulk) / batched_s if batched_s else None},
        "remember_single": {"rows": singles, "seconds": single_s,
                            "per_second": singles / single_s if single_s else None,
                            **({"latency": summarize_ms(single_times)} if single_times else {})},
        "questions": len(questions), "repeats": args.repeats, "like_repeats": args.like_repeats,
        "keyword": summarize_ms(all_ours), "like": summarize_ms(all_like),
        "ratio_p50": summarize_ms(all_like)["p50_ms"] / summarize_ms(all_ours)["p50_ms"],
        "ratio_median_per_query": float(np.median(per_query_ratio)),
        "ratio_min_per_query": float(np.min(per_query_ratio)),
        "every_match": summarize_ms([x for q in every_t for x in every_t[q]]),
        "same_top5_as_every_match": sum(same.values()),
        "by_kind": {k: {"matching_rows_median": float(np.median(v["counts"])), "keyword": summarize_ms(v["ours"]),
                        "like": summarize_ms(v["like"]), "every_match": summarize_ms(v["every"]),
                        "same_top5": f"{sum(v['same'])}/{len(v['same'])}"} for k, v in by_kind.items()},
    }
    conn.close()
    shelf.close()
    if not args.keep:
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,10000,100000", help="comma-separated memory counts (one owner)")
    p.add_argument("--queries", type=int, default=70, help="distinct questions per size")
    p.add_argument("--repeats", type=int, default=5, help="timed passes over the questions (memshelf)")
    p.add_argument("--like-repeats", type=int, default=3, help="timed passes of the spec's LIKE query")
    p.add_argument("--single", type=int, default=500, help="rows stored with single remember() calls per size")
    p.add_argument("--batch", type=int, default=1000, help="remember_many batch size")
    p.add_argument("--vocabulary", type=int, default=4000)
    p.add_argument("--db-dir", default=None, help="where the SQLite files go (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the database files")
    p.add_argument("--json", default=None, help="write the results to this file")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    db_dir, tmp = database_dir(args.db_dir)

    info = machine()
    print(f"machine: {info['cpus']} cpus, {info['cpu']}, load {info['loadavg_at_start']}, "
          f"SQLite {info['sqlite']}, Python {info['python']}")
    results = []
    started = time.perf_counter()
    for n in sizes:
        print(f"size {n:,}: building and timing ...", flush=True)
        results.append(run_size(n, args, db_dir))
    elapsed = time.perf_counter() - started

    print_table("remember() throughput (one owner, SQLite file, WAL)",
                ["memories", "remember_many rows/s", "batch", "single remember() rows/s", "single p50 ms",
                 "single p95 ms"],
                [[f"{r['size']:,}", f"{r['remember_many']['per_second']:,.0f}", r["remember_many"]["batch"],
                  f"{r['remember_single']['per_second']:,.0f}",
                  fmt_ms(r["remember_single"]["latency"]["p50_ms"]), fmt_ms(r["remember_single"]["latency"]["p95_ms"])]
                 for r in results])
    print_table(f"keyword search, limit {LIMIT} (ms; n = questions x repeats, LIKE: questions x like-repeats)",
                ["memories", "memshelf p50", "memshelf p95", "LIKE p50", "LIKE p95", "p50 ratio",
                 "median per-query ratio", "worst per-query ratio", "every match p50", "every match p95",
                 "same top-5"],
                [[f"{r['size']:,}", fmt_ms(r["keyword"]["p50_ms"]), fmt_ms(r["keyword"]["p95_ms"]),
                  fmt_ms(r["like"]["p50_ms"]), fmt_ms(r["like"]["p95_ms"]), f"{r['ratio_p50']:,.0f}x",
                  f"{r['ratio_median_per_query']:,.0f}x", f"{r['ratio_min_per_query']:,.1f}x",
                  fmt_ms(r["every_match"]["p50_ms"]), fmt_ms(r["every_match"]["p95_ms"]),
                  f"{r['same_top5_as_every_match']}/{r['questions']}"] for r in results])
    rows = []
    for r in results:
        for kind, v in r["by_kind"].items():
            rows.append([f"{r['size']:,}", kind, f"{v['matching_rows_median']:,.0f}", fmt_ms(v["keyword"]["p50_ms"]),
                         fmt_ms(v["keyword"]["p95_ms"]), fmt_ms(v["like"]["p50_ms"]), fmt_ms(v["like"]["p95_ms"]),
                         f"{v['like']['p50_ms'] / v['keyword']['p50_ms']:,.0f}x", fmt_ms(v["every_match"]["p50_ms"]),
                         fmt_ms(v["every_match"]["p95_ms"]), v["same_top5"]])
    print_table("by kind of question (matching rows = FTS5 matches, median over the kind's questions; every match: "
                "the same questions with every match ranked)",
                ["memories", "question terms", "matching rows", "memshelf p50", "memshelf p95", "LIKE p50",
                 "LIKE p95", "p50 ratio", "every match p50", "every match p95", "same top-5"], rows)
    big = max(results, key=lambda r: r["size"])
    print(f"targets at {big['size']:,}: p50 {big['keyword']['p50_ms']:.3f} ms (target < 5 ms: "
          f"{'met' if big['keyword']['p50_ms'] < 5 else 'MISSED'}), {big['ratio_p50']:.0f}x the LIKE query "
          f"(target >= 50x: {'met' if big['ratio_p50'] >= 50 else 'MISSED'}); total {elapsed:.0f} s")
    save_json(args.json, {"benchmark": "keyword", "machine": info, "args": vars(args), "elapsed_s": elapsed,
                          "results": results})
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
