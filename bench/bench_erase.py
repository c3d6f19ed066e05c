"""What deleting and changing memories costs on SQLite (issue 17): Shelf.forget_user of a big owner, and single
forget and confirm calls.

Each round runs in a fresh Python process on a new file: --rows memories with synthetic 384-d vectors for one owner
(the keyword benchmark's sentences, a third of them inferred) and a tenth as many for a second owner of the same
tenant, loaded untimed; then, timed: --singles confirm() calls (an inferred memory made stated) and --singles
forget() calls, one memory each, and finally forget_user of the big owner (its rows, full-text entries and vectors,
the scrub included). --src serves another source tree (e.g. a worktree of an older commit), so two versions are
measured in the same run, alternating round by round; medians of --rounds rounds.

    .venv/bin/python bench/bench_erase.py                                   # 20,000 rows, 3 rounds
    .venv/bin/python bench/bench_erase.py --src ../before/src --src src --json out.json
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
from _common import ROOT, add_source_flags, machine, print_table, run_worker, save_json  # noqa: E402

FIGURES = ("confirm p50 ms", "forget p50 ms", "forget_user s")


def run(rows: int, singles: int) -> dict[str, float]:
    """One round's figures (run in a worker process)."""
    import numpy as np

    from _common import TextGenerator
    from bench_semantic import DIM, SyntheticEmbedder
    from memshelf import Owner, Shelf

    big, small = Owner("bench", "big"), Owner("bench", "small")
    texts = TextGenerator(seed=5).sentences(rows + rows // 10)
    vectors = np.random.default_rng(1).standard_normal((len(texts), DIM)).astype(np.float32)
    items = [{"topic": topic, "content": content, "source": "inferred" if i % 3 == 0 else "stated",
              "vector": vectors[i]} for i, (topic, content, _) in enumerate(texts)]
    with tempfile.TemporaryDirectory() as folder:
        shelf = Shelf.open(Path(folder) / "memory.db", embedder=SyntheticEmbedder())
        for at in range(0, rows, 2_000):
            shelf.remember_many(big, items[at:min(at + 2_000, rows)])
        shelf.remember_many(small, items[rows:])
        inferred = [m.id for m in shelf.list_memories(big, limit=singles, source="inferred")[0]]
        others = [m.id for m in shelf.list_memories(big, limit=singles, source="stated")[0]]
        timings: dict[str, list[float]] = {"confirm": [], "forget": []}
        for name, call, ids in (("confirm", shelf.confirm, inferred), ("forget", shelf.forget, others)):
            for memory_id in ids:
                start = time.perf_counter()
                call(big, memory_id)
                timings[name].append(time.perf_counter() - start)
        start = time.perf_counter()
        shelf.forget_user(big)
        erase_s = time.perf_counter() - start
        shelf.close()
    return {"confirm p50 ms": statistics.median(timings["confirm"]) * 1e3,
            "forget p50 ms": statistics.median(timings["forget"]) * 1e3, "forget_user s": erase_s}


def measure(src: Path, rows: int, singles: int) -> dict[str, float]:
    return run_worker(__file__, src, ["--rows", str(rows), "--singles", str(singles)])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000, help="memories of the owner that is erased")
    parser.add_argument("--singles", type=int, default=100, help="confirm() and forget() calls timed one by one")
    add_source_flags(parser, rounds=3)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run(args.rows, args.singles)))
        return
    sources = [src.resolve() for src in (args.src or [ROOT / "src"])]
    samples: dict[str, list[dict[str, float]]] = {str(src): [] for src in sources}
    for _ in range(args.rounds):
        for src in sources:
            samples[str(src)].append(measure(src, args.rows, args.singles))
    first = str(sources[0])
    table = []
    for src in sources:
        for figure in FIGURES:
            values = [round_[figure] for round_ in samples[str(src)]]
            median = statistics.median(values)
            baseline = statistics.median(round_[figure] for round_ in samples[first])
            table.append([os.path.relpath(src), figure, f"{median:,.2f}", " / ".join(f"{v:,.2f}" for v in values),
                          f"{median / baseline:.2f}x"])
    print_table(f"deleting and changing memories ({args.rows:,} rows, {args.singles} single calls, median of "
                f"{args.rounds} rounds)", ["source", "figure", "median", "rounds", "vs first source"], table)
    report: dict[str, Any] = {"machine": machine(), "rows": args.rows, "singles": args.singles,
                              "rounds": args.rounds, "sources": samples}
    save_json(args.json, report)


if __name__ == "__main__":
    main()
