"""Memory held by the SQLite store's in-process vector cache (issue 9), for many small owners and one big one.

For each case (OWNERSxROWS: that many owners with that many memories each, one SQLite file):
  * the memories are stored with Shelf.remember_many(items with a "vector" key): synthetic 384-d float32 vectors
    (random normal) under the model name "bench:synthetic-384", so no model runs;
  * a fresh Shelf opens the file and searches every owner once (mode="semantic", limit 5), which builds and caches
    each owner's matrix; the memory the process still holds afterwards is read with tracemalloc (numpy's buffers
    are traced), after a gc, against a baseline taken just before the searches;
  * then one more memory is remembered for every owner and every owner is searched again (the cached matrices
    grow on append), and the held memory is read again;
  * finally, with tracemalloc stopped, every owner is searched again and the warm search latency is timed.
The store's own count of cached bytes (`store._vectors.nbytes`) is printed when the store has one.

Then the scan alone, one query against a random (rows, 384) float32 matrix, the two ways in turn in one loop so
both see the same machine: how memshelf scored rows until issue 9 (threadpoolctl's one-BLAS-thread limit entered
and left around `matrix @ q`, once per search) and how it does now (`np.vecdot`, no limit).

Run it on another checkout (PYTHONPATH=that/src) to compare versions:

    .venv/bin/python bench/bench_cache.py                          # 3000x1 and 1x100000
    .venv/bin/python bench/bench_cache.py --cases 3000x1 --cache-mb 4 --scan-rows 0 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database_dir, machine, print_table, save_json, summarize_ms  # noqa: E402

from memshelf import Owner, Shelf  # noqa: E402
from memshelf.embedders.base import Embedder  # noqa: E402

DIM = 384
MODEL = "bench:synthetic-384"
CACHE_ENV = "MEMSHELF_VECTOR_CACHE_MB"


class SyntheticEmbedder(Embedder):
    """Stamps stored vectors "bench:synthetic-384"; every question gets the same fixed vector."""

    model = MODEL

    def __init__(self) -> None:
        self.query = np.random.default_rng(99).standard_normal(DIM).astype(np.float32)

    @property
    def dimensions(self) -> int:
        return DIM

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        return np.tile(self.query, (len(texts), 1))


def parse_case(text: str) -> tuple[int, int]:
    owners, _, rows = text.lower().partition("x")
    return int(owners), int(rows)


def load(path: Path, owners: list[Owner], rows: int, batch: int) -> float:
    rng = np.random.default_rng(5)
    shelf = Shelf(Shelf.open(path, embedder=None).store, embedder=SyntheticEmbedder())
    started = time.perf_counter()
    for owner in owners:
        for start in range(0, rows, batch):
            count = min(batch, rows - start)
            vectors = rng.standard_normal((count, DIM), dtype=np.float32)
            shelf.remember_many(owner, [{"topic": "note", "content": f"{owner.user} memory {start + i}",
                                         "vector": vectors[i]} for i in range(count)])
    shelf.close()
    return time.perf_counter() - started


def held_bytes(baseline: int) -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - baseline


def search_all(shelf: Shelf, owners: list[Owner]) -> list[float]:
    times = []
    for owner in owners:
        started = time.perf_counter()
        shelf.search(owner, "what do I know", mode="semantic", limit=5)
        times.append(time.perf_counter() - started)
    return times


def cache_nbytes(shelf: Shelf) -> int | None:
    return getattr(getattr(shelf.store, "_vectors", None), "nbytes", None)


def run_case(owner_count: int, rows: int, args: argparse.Namespace, db_dir: Path) -> dict[str, Any]:
    path = db_dir / f"bench_cache_{owner_count}x{rows}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    owners = [Owner("bench", f"user{i:05d}") for i in range(owner_count)]
    load_s = load(path, owners, rows, args.batch)

    shelf = Shelf(Shelf.open(path, embedder=None).store, embedder=SyntheticEmbedder())
    gc.collect()
    tracemalloc.start()
    baseline = tracemalloc.get_traced_memory()[0]
    first = search_all(shelf, owners)
    after_search = held_bytes(baseline)
    counted_search = cache_nbytes(shelf)
    for owner in owners:
        shelf.remember_many(owner, [{"topic": "note", "content": f"{owner.user} one more",
                                     "vector": np.ones(DIM, dtype=np.float32)}])
    search_all(shelf, owners)
    after_append = held_bytes(baseline)
    counted_append = cache_nbytes(shelf)
    peak = tracemalloc.get_traced_memory()[1] - baseline
    tracemalloc.stop()
    warm = search_all(shelf, owners) if owner_count > 1 else search_all(shelf, owners * 200)
    shelf.close()
    if not args.keep:
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    vector_bytes = owner_count * rows * DIM * 4
    return {"owners": owner_count, "rows_per_owner": rows, "load_s": load_s, "vector_bytes": vector_bytes,
            "held_after_search": after_search, "held_after_append": after_append, "peak": peak,
            "counted_after_search": counted_search, "counted_after_append": counted_append,
            "first_search": summarize_ms(first), "warm_search": summarize_ms(warm)}


def run_scan(rows: int, repeats: int) -> dict[str, Any]:
    from threadpoolctl import ThreadpoolController

    controller = ThreadpoolController()  # found once, as memshelf did
    rng = np.random.default_rng(rows)
    matrix = rng.standard_normal((rows, DIM), dtype=np.float32)
    query = rng.standard_normal(DIM, dtype=np.float32)
    limited, vecdot = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        with controller.limit(limits=1, user_api="blas"):
            matrix @ query
        middle = time.perf_counter()
        np.vecdot(matrix, query)
        limited.append(middle - started)
        vecdot.append(time.perf_counter() - middle)
    return {"rows": rows, "repeats": repeats, "limit_and_matmul": summarize_ms(limited),
            "vecdot": summarize_ms(vecdot)}


def mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="3000x1,1x100000", help="OWNERSxROWS, comma separated")
    p.add_argument("--cache-mb", default=None, help=f"set {CACHE_ENV} for the run (default: leave it as it is)")
    p.add_argument("--batch", type=int, default=2000, help="remember_many batch size when loading")
    p.add_argument("--scan-rows", default="1000,10000,100000", help="matrix sizes for the scan comparison (0: skip)")
    p.add_argument("--scan-repeats", type=int, default=300)
    p.add_argument("--db-dir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.cache_mb is not None:
        import os

        os.environ[CACHE_ENV] = args.cache_mb
    db_dir, tmp = database_dir(args.db_dir)
    info = machine()
    print(f"machine: {info['cpus']} cpus, {info['cpu']}, load {info['loadavg_at_start']}, numpy {info['numpy']}")
    results = []
    for owners, rows in (parse_case(c) for c in args.cases.split(",") if c.strip()):
        print(f"{owners:,} owners x {rows:,} memories: loading and searching ...", flush=True)
        results.append(run_case(owners, rows, args, db_dir))
    print_table("vector cache memory (MB; tracemalloc, held after a gc)",
                ["owners x memories", "vectors alone", "held after searching each", "store's count",
                 "held after one append each", "store's count", "peak", "first search p50 ms",
                 "warm search p50 ms"],
                [[f"{r['owners']:,} x {r['rows_per_owner']:,}", mb(r["vector_bytes"]), mb(r["held_after_search"]),
                  mb(r["counted_after_search"]), mb(r["held_after_append"]), mb(r["counted_after_append"]),
                  mb(r["peak"]), f"{r['first_search']['p50_ms']:.3f}", f"{r['warm_search']['p50_ms']:.3f}"]
                 for r in results])
    scans = [run_scan(int(rows), args.scan_repeats) for rows in args.scan_rows.split(",") if int(rows) > 0]
    if scans:
        print_table(f"one scan, 384-d float32, interleaved, {args.scan_repeats} each (ms)",
                    ["rows", "limit + matmul p50", "p95", "vecdot p50", "p95"],
                    [[f"{s['rows']:,}", f"{s['limit_and_matmul']['p50_ms']:.3f}",
                      f"{s['limit_and_matmul']['p95_ms']:.3f}", f"{s['vecdot']['p50_ms']:.3f}",
                      f"{s['vecdot']['p95_ms']:.3f}"] for s in scans])
    save_json(args.json, {"benchmark": "cache", "machine": info, "args": vars(args), "results": results,
                          "scans": scans})
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
