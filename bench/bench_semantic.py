"""Semantic search speed (issue 3), beside the spec's pure-Python cosine loop on the same rows in the same run,
and remember() throughput with the real local model.

For each size N (one owner, one SQLite file):
  * N memories with clustered synthetic 384-d float32 vectors (256 random centres, each point centre + noise, so
    members of a cluster score ~0.5 against each other and ~0 against the rest), stored with
    Shelf.remember_many(items with a "vector" key) under the model name "bench:synthetic-384" (no model runs);
  * queries: centre + noise of a random cluster, asked with shelf.search(owner, q, mode="semantic", limit=5,
    floor=F) through an embedder that returns the pre-computed query vector, so the query's own embedding time is
    excluded (the timed path: keywords(), the generation check, numpy top_k, fetching the 5 rows);
  * the first query after opening the file is timed separately, on a fresh Shelf each time: with vector files off
    (the owner's matrix is read from SQLite), on the first open with them on (read, and the file written), and on
    later opens (the file mapped); the answers of the first and the last are compared;
  * the first query after a change to the owner's memories, on one open Shelf (vector files off): a memory's
    expiry changed, or one forgotten, then the next search timed, alternating with the same change made while the
    store may not catch up (`stores.sqlite.PATCH_SHARE` 0: it reads every vector again, as before catching up);
  * the spec 002 semantic_search() loop (cosine() and unpack() verbatim, the same floor and limit) over the same
    rows through the sqlite3 module memshelf runs on (two SQLite libraries in one process must not open one
    file), for fewer queries (it takes ~0.25 s per query per 10k rows).

Then, with embedder="local" (all-MiniLM-L6-v2 on the CPU): remember_many of 512 real conversation turns (LoCoMo)
in one call vs single remember() calls, on a fresh file.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_semantic.py                       # 10k and 100k + local model
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_semantic.py --sizes 10000 --no-model --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from array import array
from pathlib import Path
from typing import Any
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TextGenerator, database_dir, fmt_ms, machine, print_table, save_json, summarize_ms  # noqa: E402

from memshelf import Owner, Shelf, _vectors  # noqa: E402
from memshelf.embedders.base import Embedder  # noqa: E402
from memshelf.stores import _sqlite_vector_files as vector_files, sqlite as sqlite_store  # noqa: E402
from memshelf.stores.sqlite import sqlite3  # noqa: E402  (the store's own SQLite, for the spec's loop too)

OWNER = Owner("bench", "one-user")
DIM = 384
MODEL = "bench:synthetic-384"
LIMIT = 5
LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json"


class SyntheticEmbedder(Embedder):
    """Stamps stored vectors "bench:synthetic-384"; at query time returns the vector set in `next_query`."""

    model = MODEL

    def __init__(self) -> None:
        self.next_query: np.ndarray | None = None

    @property
    def dimensions(self) -> int:
        return DIM

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        if self.next_query is None:
            raise AssertionError("storage should never need to embed: every item carries its vector")
        return self.next_query.reshape(1, DIM)


# ---- spec 002, verbatim but for the table name and the pre-computed question vector
def cosine(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"vector length mismatch: {len(a)} vs {len(b)}")
    dot = sum(x * y for x, y in zip(a, b))
    norm_a = sum(x * x for x in a) ** 0.5
    norm_b = sum(y * y for y in b) ** 0.5
    if norm_a == 0.0 or norm_b == 0.0:
        return 0.0
    return dot / (norm_a * norm_b)


def unpack(blob: bytes) -> list[float]:
    arr = array("f")
    arr.frombytes(blob)
    return list(arr)


def spec_semantic_search(conn: sqlite3.Connection, q: list[float], limit: int = 3, floor: float = 0.0) -> list[dict]:
    hits: list[dict] = []
    for content, confidence, blob in conn.execute(
        "SELECT content, confidence, embedding FROM memories"
        " WHERE embedding IS NOT NULL"
    ):
        score = cosine(q, unpack(blob))
        if score >= floor:
            hits.append({"content": content, "confidence": confidence, "score": score})
    hits.sort(key=lambda h: (h["score"], h["confidence"]), reverse=True)
    return hits[:limit]
# ----


def clustered(n: int, rng: np.random.Generator, centres: np.ndarray, noise: float) -> np.ndarray:
    which = rng.integers(len(centres), size=n)
    return (centres[which] + noise * rng.standard_normal((n, DIM), dtype=np.float32)).astype(np.float32)


def restore_files(setting: str | None) -> None:
    """MEMSHELF_VECTOR_FILES as it was before the bench changed it."""
    if setting is None:
        os.environ.pop(vector_files.FILES_ENV, None)
    else:
        os.environ[vector_files.FILES_ENV] = setting


def first_after_changes(fresh: Any, ask: Any, queries: np.ndarray, runs: int, files_before: str | None
                        ) -> dict[str, Any]:
    """The first search after each kind of change, caught up with (shipped) and read again (PATCH_SHARE 0), in
    turn on one open Shelf with vector files off; ms per kind and way, and how many answers differed from a Shelf
    opened afresh."""
    os.environ[vector_files.FILES_ENV] = "off"
    shelf = fresh()
    ask(shelf, queries[0])
    ids = [m.id for m in shelf.list_memories(OWNER, limit=4 * runs)[0]]
    shipped = sqlite_store.PATCH_SHARE
    times: dict[str, list[float]] = {f"{kind} {way}": [] for kind in ("expiry", "forget")
                                     for way in ("caught up", "read again")}
    differ = 0
    for i in range(runs):
        for kind in ("expiry", "forget"):
            for way, share in (("caught up", shipped), ("read again", 0.0)):
                sqlite_store.PATCH_SHARE = share
                memory = ids.pop()
                if kind == "expiry":
                    shelf.set_expiry(OWNER, memory, ttl=86_400)
                else:
                    shelf.forget(OWNER, memory)
                a = time.perf_counter()
                found = ask(shelf, queries[i])
                times[f"{kind} {way}"].append(time.perf_counter() - a)
                sqlite_store.PATCH_SHARE = shipped
                if way == "caught up":
                    check = fresh()
                    differ += [(h.memory.id, h.score) for h in found] != \
                        [(h.memory.id, h.score) for h in ask(check, queries[i])]
                    check.close()
    shelf.close()
    restore_files(files_before)
    return {"runs": runs, "answers_that_differ": differ, **{k: summarize_ms(v) for k, v in times.items()}}


def run_size(n: int, args: argparse.Namespace, db_dir: Path) -> dict[str, Any]:
    path = db_dir / f"bench_semantic_{n}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    rng = np.random.default_rng(5)
    centres = rng.standard_normal((256, DIM), dtype=np.float32)
    vectors = clustered(n, rng, centres, 1.0)
    queries = clustered(args.queries, rng, centres, 1.0)
    texts = TextGenerator(seed=13).sentences(n)

    embedder = SyntheticEmbedder()
    shelf = Shelf(Shelf.open(path, embedder=None).store, embedder=embedder)
    t0 = time.perf_counter()
    for start in range(0, n, args.batch):
        shelf.remember_many(OWNER, [{"topic": t, "content": c, "source": s, "vector": vectors[i]}
                                    for i, (t, c, s) in enumerate(texts[start:start + args.batch], start)])
    build_s = time.perf_counter() - t0
    shelf.close()

    def fresh() -> Shelf:
        return Shelf(Shelf.open(path, embedder=None).store, embedder=embedder)

    def ask(s: Shelf, q: np.ndarray) -> list:
        embedder.next_query = q
        return s.search(OWNER, "what about it", mode="semantic", limit=LIMIT, floor=args.floor)

    # first query on a freshly opened file (OS page cache warm), three ways: with vector files off, the owner's
    # matrix is read from SQLite; the first open with them on also writes the owner's file; later opens map it.
    def first_query(files: str, i: int) -> tuple[float, float, list]:
        os.environ[vector_files.FILES_ENV] = files
        s = fresh()
        a = time.perf_counter()
        found = ask(s, queries[i])
        b = time.perf_counter()
        ask(s, queries[i + 1])
        c = time.perf_counter()
        s.close()
        return b - a, c - b, [(h.memory.id, h.score) for h in found]

    files_before = os.environ.get(vector_files.FILES_ENV)
    first_query("off", 0)  # the first open after the build is slower whatever it does (the new file's pages)
    writing = first_query("on", 0)[0]
    first, second, mapped, mapped_differ = [], [], [], 0
    for i in range(args.first_runs):
        read_s, second_s, read_found = first_query("off", i)
        map_s, _, map_found = first_query("on", i)
        first.append(read_s)
        second.append(second_s)
        mapped.append(map_s)
        mapped_differ += read_found != map_found
    restore_files(files_before)

    shelf = fresh()
    for q in queries[:10]:
        ask(shelf, q)  # warm
    # The same file scanned in float32 only (the matrix built without its int8 copy), query by query in turn with
    # the shipped scan: the same-run baseline of the int8 first pass, and a check that both find the same. Built
    # from SQLite (vector files off: the owner's file holds the int8 copy).
    os.environ[vector_files.FILES_ENV] = "off"
    plain = fresh()
    restore_files(files_before)
    kernel, _vectors._kernel = _vectors._kernel, None
    ask(plain, queries[0])
    _vectors._kernel = kernel
    times: list[float] = []
    plain_times: list[float] = []
    differ = 0
    clock = time.perf_counter
    for _ in range(args.repeats):
        for q in queries:
            a = clock()
            found = ask(shelf, q)
            b = clock()
            expected = ask(plain, q)
            c = clock()
            times.append(b - a)
            plain_times.append(c - b)
            differ += [(h.memory.id, h.score) for h in found] != [(h.memory.id, h.score) for h in expected]
    plain.close()

    # the spec's loop over the same rows, fewer queries; also check that both return the same rows
    spec_n = args.spec_queries if n <= 20_000 else args.spec_queries_large
    conn = sqlite3.connect(path)
    spec_times, agree = [], 0
    for q in queries[:spec_n]:
        ql = q.astype(np.float64).tolist()
        a = clock()
        theirs = spec_semantic_search(conn, ql, limit=LIMIT, floor=args.floor)
        spec_times.append(clock() - a)
        ours = ask(shelf, q)
        agree += [h["content"] for h in theirs] == [h.memory.content for h in ours]
    conn.close()
    # memshelf's times for exactly the queries the loop ran, for a like-for-like ratio
    ours_same = [times[r * len(queries) + i] for r in range(args.repeats) for i in range(spec_n)]
    shelf.close()
    changed = first_after_changes(fresh, ask, queries, args.first_runs, files_before)
    size_bytes = path.stat().st_size
    if not args.keep:
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    ours_s = summarize_ms(times)
    spec_s = summarize_ms(spec_times)
    return {
        "size": n, "db_bytes": size_bytes, "build_seconds": build_s, "build_rows_per_second": n / build_s,
        "floor": args.floor, "limit": LIMIT, "queries": args.queries, "repeats": args.repeats,
        "semantic": ours_s, "semantic_same_queries": summarize_ms(ours_same),
        "float32_only": summarize_ms(plain_times), "float32_only_differs": differ, "int8_kernel": kernel is not None,
        "first_query": summarize_ms(first), "second_query": summarize_ms(second),
        "first_query_writing_file": writing * 1e3, "first_query_mapped": summarize_ms(mapped),
        "mapped_differs": mapped_differ, "after_change": changed,
        "spec_loop": spec_s, "spec_queries": spec_n, "same_top5": f"{agree}/{spec_n}",
        "ratio_p50": spec_s["p50_ms"] / ours_s["p50_ms"],
        "ratio_p50_same_queries": spec_s["p50_ms"] / summarize_ms(ours_same)["p50_ms"],
    }


def locomo_turns(count: int) -> list[str]:
    data = json.loads(LOCOMO.read_text())
    out: list[str] = []
    for conv in data:
        c = conv["conversation"]
        i = 1
        while f"session_{i}" in c:
            for turn in c[f"session_{i}"]:
                out.append(f"{turn['speaker']}: {turn['text']}")
            i += 1
    seen, unique = set(), []
    for t in out:
        if t not in seen:
            seen.add(t)
            unique.append(t)
    return unique[:count]


def run_model(args: argparse.Namespace, db_dir: Path) -> dict[str, Any]:
    from memshelf.embedders.local import LocalEmbedder

    turns = locomo_turns(args.model_batch + args.model_single + 16)
    batch, single = turns[: args.model_batch], turns[args.model_batch: args.model_batch + args.model_single]
    warm = turns[-16:]
    t0 = time.perf_counter()
    emb = LocalEmbedder()
    emb.embed_batch(warm)  # loads the model once per process
    load_s = time.perf_counter() - t0
    runs: dict[str, list[float]] = {"embed_batch": [], "remember_many": [], "remember_single": []}
    for r in range(args.model_runs):
        path = db_dir / f"bench_model_{r}.db"
        shelf = Shelf.open(path, embedder=emb)
        a = time.perf_counter()
        emb.embed_batch(batch)
        b = time.perf_counter()
        shelf.remember_many(OWNER, [{"topic": "chat", "content": t} for t in batch])
        c = time.perf_counter()
        for t in single:
            shelf.remember(OWNER, "chat-single", t)
        d = time.perf_counter()
        runs["embed_batch"].append(len(batch) / (b - a))
        runs["remember_many"].append(len(batch) / (c - b))
        runs["remember_single"].append(len(single) / (d - c))
        shelf.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    med = {k: float(np.median(v)) for k, v in runs.items()}
    return {"model": emb.model, "load_and_first_batch_s": load_s, "batch_rows": len(batch),
            "single_rows": len(single), "runs": args.model_runs, "rows_per_second_median": med,
            "rows_per_second_all": runs, "batched_vs_single": med["remember_many"] / med["remember_single"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000")
    p.add_argument("--queries", type=int, default=200, help="distinct query vectors per size")
    p.add_argument("--repeats", type=int, default=3, help="timed passes over the queries")
    p.add_argument("--floor", type=float, default=0.30, help="cosine floor for both (memshelf's default)")
    p.add_argument("--first-runs", type=int, default=5, help="fresh opens to time the first query")
    p.add_argument("--spec-queries", type=int, default=20, help="spec loop queries at sizes up to 20k")
    p.add_argument("--spec-queries-large", type=int, default=5, help="spec loop queries above 20k")
    p.add_argument("--batch", type=int, default=2000, help="remember_many batch size when loading")
    p.add_argument("--no-model", action="store_true", help="skip the local-model remember() throughput")
    p.add_argument("--model-batch", type=int, default=512)
    p.add_argument("--model-single", type=int, default=64)
    p.add_argument("--model-runs", type=int, default=3)
    p.add_argument("--db-dir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    db_dir, tmp = database_dir(args.db_dir)

    info = machine()
    print(f"machine: {info['cpus']} cpus, {info['cpu']}, load {info['loadavg_at_start']}, numpy {info['numpy']}")
    started = time.perf_counter()
    results = []
    for n in sizes:
        print(f"size {n:,}: building and timing ...", flush=True)
        results.append(run_size(n, args, db_dir))
    model = None if args.no_model else run_model(args, db_dir)
    elapsed = time.perf_counter() - started

    if results:
        print_table("the int8 first pass against the float32 scan alone, query by query in turn (ms)",
                    ["memories", "kernel", "shipped p50", "shipped p95", "float32 only p50", "float32 only p95",
                     "float32 / shipped p50", "answers that differ"],
                    [[f"{r['size']:,}", "simsimd" if r["int8_kernel"] else "none", fmt_ms(r["semantic"]["p50_ms"]),
                      fmt_ms(r["semantic"]["p95_ms"]), fmt_ms(r["float32_only"]["p50_ms"]),
                      fmt_ms(r["float32_only"]["p95_ms"]),
                      f"{r['float32_only']['p50_ms'] / r['semantic']['p50_ms']:.2f}x", r["float32_only_differs"]]
                     for r in results])
        print_table(f"semantic search, 384-d, limit {LIMIT}, floor {args.floor} (ms; query embedding excluded)",
                ["memories", "memshelf p50", "memshelf p95", "n", "first query p50", "second query p50",
                 "spec loop p50", "spec n", "same top-5", "p50 ratio"],
                [[f"{r['size']:,}", fmt_ms(r["semantic"]["p50_ms"]), fmt_ms(r["semantic"]["p95_ms"]),
                  r["semantic"]["n"], fmt_ms(r["first_query"]["p50_ms"]), fmt_ms(r["second_query"]["p50_ms"]),
                  fmt_ms(r["spec_loop"]["p50_ms"]), r["spec_queries"], r["same_top5"], f"{r['ratio_p50']:,.0f}x"]
                 for r in results])
    print_table("the first query after opening the file (ms, p50 of the fresh opens; query embedding excluded)",
                ["memories", "vectors read from SQLite", "first open, writing the vector file", "vector file mapped",
                 "read / mapped", "answers that differ"],
                [[f"{r['size']:,}", fmt_ms(r["first_query"]["p50_ms"]), fmt_ms(r["first_query_writing_file"]),
                  fmt_ms(r["first_query_mapped"]["p50_ms"]),
                  f"{r['first_query']['p50_ms'] / r['first_query_mapped']['p50_ms']:.0f}x", r["mapped_differs"]]
                 for r in results])
    print_table("the first query after a change, on an open Shelf (ms, p50 of the runs)",
                ["memories", "expiry changed: caught up", "read again", "memory forgotten: caught up", "read again",
                 "answers that differ"],
                [[f"{r['size']:,}", *(fmt_ms(r["after_change"][f"{kind} {way}"]["p50_ms"])
                                      for kind in ("expiry", "forget") for way in ("caught up", "read again")),
                  r["after_change"]["answers_that_differ"]] for r in results])
    print_table("loading", ["memories", "remember_many rows/s (pre-computed vectors)", "file MB"],
                [[f"{r['size']:,}", f"{r['build_rows_per_second']:,.0f}", f"{r['db_bytes'] / 1e6:,.0f}"]
                 for r in results])
    if model:
        m = model["rows_per_second_median"]
        print_table(f"remember() with {model['model']} (rows/s, median of {model['runs']} runs; model load "
                    f"{model['load_and_first_batch_s']:.1f} s excluded)",
                    ["embed_batch only", f"remember_many ({model['batch_rows']} rows)",
                     f"single remember() ({model['single_rows']} calls)", "batched / single"],
                    [[f"{m['embed_batch']:,.0f}", f"{m['remember_many']:,.0f}", f"{m['remember_single']:,.1f}",
                      f"{model['batched_vs_single']:.1f}x"]])
    big = max(results, key=lambda r: r["size"]) if results else None
    if big is not None:
        print(f"targets at {big['size']:,}: p50 {big['semantic']['p50_ms']:.2f} ms (target < 10 ms: "
              f"{'met' if big['semantic']['p50_ms'] < 10 else 'MISSED'}), {big['ratio_p50']:.0f}x the spec's loop "
              f"(target >= 500x: {'met' if big['ratio_p50'] >= 500 else 'MISSED'}); total {elapsed:.0f} s")
    save_json(args.json, {"benchmark": "semantic", "machine": info, "args": vars(args), "elapsed_s": elapsed,
                          "results": results, "local_model": model})
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
