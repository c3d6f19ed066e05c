"""Ingest speed (issue 17): Shelf.remember_many into a new SQLite file, with pre-computed vectors and without; and,
with --kinds, the store's import_memories (what `memshelf migrate` and Shelf.import_ write through).

Each measurement runs in a fresh Python process: --rows statements from the keyword benchmark's text generator, in
batches of --batch, one owner, into a new file (WAL, as Shelf.open makes it); with vectors, each item carries a
synthetic 384-d float32 vector (no model runs; the shelf's embedder only names the model). The result is rows per
second over the whole load, closing the shelf included (the last of the WAL is copied into the file
then). --src serves another source tree (e.g. a worktree of an older commit), so two versions
are measured in the same run, alternating round by round; the medians of --rounds rounds are reported.

    .venv/bin/python bench/bench_ingest.py                                   # 20,000 rows, 3 rounds
    .venv/bin/python bench/bench_ingest.py --src ../before/src --src src --json out.json
    .venv/bin/python bench/bench_ingest.py --kinds "import with vectors" --src ../before/src --src src

"import with vectors": the same rows as Memory records (ids, times, provenance given, as a migration copies them)
with their vector blobs, through SQLiteStore.import_memories in batches of --batch.
"postgres with vectors", "postgres keywords only": remember_many into a new database on a throwaway embedded
PostgreSQL (its start is not timed), closing the shelf included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, add_source_flags, machine, print_table, run_worker, save_json  # noqa: E402

KINDS = ("with vectors", "keywords only", "import with vectors", "postgres with vectors", "postgres keywords only")


def load(rows: int, batch: int, kind: str) -> float:
    """Rows per second of one load into a new file (run in a worker process)."""
    import numpy as np

    from _common import TextGenerator, embedded_postgres_url
    from bench_semantic import DIM, SyntheticEmbedder
    from memshelf import Owner, Shelf

    texts = TextGenerator(seed=5).sentences(rows)
    matrix = np.random.default_rng(1).standard_normal((rows, DIM)).astype(np.float32)
    vectors = not kind.endswith("keywords only")
    items = [{"topic": topic, "content": content, "source": source} for topic, content, source in texts]
    if kind == "import with vectors":
        return imported(texts, matrix, batch)
    if vectors:
        for item, vector in zip(items, matrix):
            item["vector"] = vector
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        target = stack.enter_context(embedded_postgres_url()) if kind.startswith("postgres") else \
            str(Path(folder) / "memory.db")
        shelf = Shelf.open(target, embedder=SyntheticEmbedder() if vectors else None)
        owner = Owner("bench", "one-user")
        start = time.perf_counter()
        for at in range(0, rows, batch):
            shelf.remember_many(owner, items[at:at + batch])
        shelf.close()  # timed too: what is left of the WAL is copied into the file here
        elapsed = time.perf_counter() - start
    return rows / elapsed


def imported(texts: list[tuple[str, str, str]], matrix: Any, batch: int) -> float:
    """Rows per second of import_memories into a new file: records as a migration copies them."""
    from datetime import UTC, datetime, timedelta

    from bench_semantic import SyntheticEmbedder
    from memshelf import Owner, Shelf
    from memshelf.model import Memory

    t0, model = datetime(2026, 1, 1, tzinfo=UTC), SyntheticEmbedder().model
    confidence = {"stated": 1.0, "mined": 0.6, "inferred": 0.4}
    records = [Memory(f"m{i}", topic, content, source, confidence[source], t0 + timedelta(seconds=i),
                      embed_model=model) for i, (topic, content, source) in enumerate(texts)]
    blobs = [vector.astype("<f4").tobytes() for vector in matrix]
    with tempfile.TemporaryDirectory() as folder:
        shelf = Shelf.open(Path(folder) / "memory.db", embedder=None)
        owner = Owner("bench", "one-user")
        start = time.perf_counter()
        for at in range(0, len(records), batch):
            shelf.store.import_memories(owner, records[at:at + batch], blobs[at:at + batch])
        shelf.close()
        elapsed = time.perf_counter() - start
    return len(records) / elapsed


def measure(src: Path, rows: int, batch: int, kind: str) -> float:
    return float(run_worker(__file__, src, ["--rows", str(rows), "--batch", str(batch), "--kind", kind])["rows_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=2_000, help="items per remember_many call")
    add_source_flags(parser, rounds=3)
    parser.add_argument("--kinds", default="with vectors,keywords only",
                        help=f"comma-separated, of: {', '.join(KINDS)} (default the first two)")
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps({"rows_per_s": load(args.rows, args.batch, args.kind)}))
        return
    kinds = [kind.strip() for kind in args.kinds.split(",")]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}: use {', '.join(KINDS)}")
    sources = [src.resolve() for src in (args.src or [ROOT / "src"])]
    samples: dict[str, dict[str, list[float]]] = {str(src): {kind: [] for kind in kinds} for src in sources}
    for _ in range(args.rounds):
        for kind in kinds:
            for src in sources:
                samples[str(src)][kind].append(measure(src, args.rows, args.batch, kind))
    report: dict[str, Any] = {"machine": machine(), "rows": args.rows, "batch": args.batch, "rounds": args.rounds,
                              "sources": samples}
    first = str(sources[0])
    rows = []
    for src in sources:
        for kind in kinds:
            median = statistics.median(samples[str(src)][kind])
            ratio = median / statistics.median(samples[first][kind])
            rows.append([os.path.relpath(src), kind, f"{median:,.0f}",
                         " / ".join(f"{value:,.0f}" for value in samples[str(src)][kind]), f"{ratio:.2f}x"])
    print_table(f"Ingest into a new store ({args.rows:,} rows, batches of {args.batch:,}, "
                f"median of {args.rounds} rounds)", ["source", "kind", "rows/s", "rounds", "vs first source"], rows)
    save_json(args.json, report)


if __name__ == "__main__":
    main()
