"""Keyword search of two source trees in one process, question by question, on one bench_keyword.py file.

Separate runs of bench_keyword.py differ by 10-30% on a shared machine whatever the code does; here the baseline's
SQLiteStore (another checkout's src/, loaded as a package of its own) and this checkout's answer the same question
one after the other, alternating which goes first, so both see the same machine. It times SQLiteStore.keyword_search
(the store's part of Shelf.search, mode="keyword", limit 5), checks that both give the same memories with the same
scores, and reports p50 / p95 per kind of question.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_keyword.py --sizes 100000 --db-dir DIR --keep
    git worktree add ../before <commit>
    .venv/bin/python bench/ab_keyword.py DIR/bench_keyword_100000.db --baseline ../before/src --rounds 10

Both trees run on the SQLite library memshelf picks (MEMSHELF_SQLITE); the file is only read.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TextGenerator, machine, print_table, save_json, summarize_ms  # noqa: E402
from bench_keyword import OWNER, build_questions  # noqa: E402

import memshelf  # noqa: E402
from memshelf.keywords import search_terms  # noqa: E402
from memshelf.stores import sqlite as this_sqlite  # noqa: E402

LIMIT = 5
KINDS = ("many", "mid", "few", "none", "many+few", "mid+none", "many+mid")


def load_baseline(src: Path) -> Any:
    """The memshelf package of another source tree, as the package `memshelf_baseline`."""
    package = src / "memshelf"
    if not (package / "__init__.py").exists():
        raise SystemExit(f"{src} holds no memshelf package: pass the src/ folder of another checkout")
    spec = importlib.util.spec_from_file_location("memshelf_baseline", package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["memshelf_baseline"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("db", help="a file bench_keyword.py built and kept (--keep)")
    p.add_argument("--baseline", required=True, help="the src/ folder of the checkout to compare with")
    p.add_argument("--rounds", type=int, default=10, help="times each question is asked of each (default 10)")
    p.add_argument("--queries", type=int, default=70, help="questions, as bench_keyword.py --queries")
    p.add_argument("--vocabulary", type=int, default=4000, help="as bench_keyword.py --vocabulary")
    p.add_argument("--json", default=None, help="also write the results as JSON")
    args = p.parse_args()
    if not Path(args.db).exists():
        raise SystemExit(f"{args.db} does not exist: build it with bench_keyword.py --keep (see --help)")
    baseline = load_baseline(Path(args.baseline))
    base_sqlite = importlib.import_module("memshelf_baseline.stores.sqlite")
    if base_sqlite.sqlite3 is not this_sqlite.sqlite3:  # two libraries on one file in one process: never
        raise SystemExit("the two trees picked different SQLite libraries: set MEMSHELF_SQLITE")
    stores = {"baseline": (base_sqlite.SQLiteStore(args.db), baseline.Owner(OWNER.tenant, OWNER.user)),
              "this": (this_sqlite.SQLiteStore(args.db), OWNER)}
    questions = build_questions(TextGenerator(vocabulary_size=args.vocabulary, seed=11), args.queries)
    now = datetime.now(UTC)
    differ = 0
    for _, question in questions:  # warm both, and compare their answers
        answers = [[(s.memory.id, s.score) for s in store.keyword_search(owner, search_terms(question), LIMIT, now,
                                                                        by_confidence=True)]
                   for store, owner in stores.values()]
        differ += answers[0] != answers[1]
    times: dict[str, dict[str, list[float]]] = {name: {kind: [] for kind in KINDS} for name in stores}
    for r in range(args.rounds):
        for kind, question in questions:
            terms = search_terms(question)
            for name in (("baseline", "this") if r % 2 == 0 else ("this", "baseline")):
                store, owner = stores[name]
                start = time.perf_counter()
                store.keyword_search(owner, terms, LIMIT, now, by_confidence=True)
                times[name][kind].append(time.perf_counter() - start)
    rows, results = [], {}
    for name in stores:
        every = [t for kind in KINDS for t in times[name][kind]]
        results[name] = {kind: summarize_ms(v) for kind, v in [("all", every)] + [(k, times[name][k]) for k in KINDS]}
    for kind in ("all", *KINDS):
        b, t = results["baseline"][kind], results["this"][kind]
        rows.append([kind, f"{b['p50_ms']:.2f} / {b['p95_ms']:.2f}", f"{t['p50_ms']:.2f} / {t['p95_ms']:.2f}",
                     f"{b['p50_ms'] / t['p50_ms']:.2f}x", f"{b['p95_ms'] / t['p95_ms']:.2f}x"])
    info = machine()
    print(f"SQLite {this_sqlite.sqlite3.sqlite_version}, {args.rounds} rounds x {len(questions)} questions; "
          f"memshelf {memshelf.__file__}; baseline {args.baseline}")
    print_table("keyword_search, limit 5: p50 / p95 ms (interleaved in one process)",
                ["question terms", "baseline", "this tree", "p50 ratio", "p95 ratio"], rows)
    print(f"questions whose memories or scores differ: {differ} of {len(questions)}")
    save_json(args.json, {"benchmark": "ab_keyword", "machine": info, "args": vars(args),
                          "sqlite": this_sqlite.sqlite3.sqlite_version, "differ": differ, "results": results})


if __name__ == "__main__":
    main()
