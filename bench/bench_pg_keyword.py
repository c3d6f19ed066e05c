"""PostgreSQL keyword search, the shipped query against a variant of its SQL, on one load (issue 17).

The data and the measured owner are bench_postgres.py's (synthetic Zipf text, --rows over --tenants tenants, one
user each, vectors with the text). The store is loaded once; then, for --rounds rounds, keyword search (limit 10,
confidence first) and the hybrid (both sides, limit 50, fused) are timed with each variant of `bm25_query` in
turn, so both variants see the same data, caches and machine load. Each round's p50 / p95 is printed; the report
gives the medians over rounds and the ratio.

Variants:
  shipped   the library's bm25_query
  inlined   the same SQL with the `stats` CTE left to the planner (not MATERIALIZED): the query before commit
            "PostgreSQL keyword search: gather the bm25 statistics once per query"

    .venv/bin/python bench/bench_pg_keyword.py --rows 100000 --tenants 100
    .venv/bin/python bench/bench_pg_keyword.py                     # 1M rows / 100 tenants, the issue's size
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import embedded_postgres_url, machine, print_table, save_json, summarize_ms, time_calls  # noqa: E402
from bench_postgres import (  # noqa: E402
    HYBRID_WIDTH, K, MODEL, SERVER_SETTINGS, T0, Data, data_arguments, ingest, questions)

import memshelf.stores.postgres as pg  # noqa: E402
from memshelf._retrieval import both_sides, fuse  # noqa: E402

SHIPPED = pg.bm25_query


def inlined(terms: int, with_context: bool, order: str, seen: str) -> str:
    text = SHIPPED(terms, with_context, order, seen)
    assert " stats AS MATERIALIZED (" in text, "the shipped query changed: update this variant"
    return text.replace(" stats AS MATERIALIZED (", " stats AS (")


VARIANTS: dict[str, Callable[[int, bool, str, str], str]] = {"inlined": inlined, "shipped": SHIPPED}


def main(argv: list[str] | None = None) -> None:
    parser = data_arguments(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    data = Data(args.rows, args.tenants, args.dims)
    qs = questions(data, args.queries)
    owner = data.owner(data.queried)
    with ExitStack() as stack:
        url = args.url or stack.enter_context(embedded_postgres_url(SERVER_SETTINGS))
        store = pg.PostgresStore(url)
        stack.callback(store.close)
        loaded = ingest(store, data, lambda: store.bulk_load("3GB"))
        print(f"loaded {loaded['rows']:,} rows in {loaded['total_s']:.0f} s", flush=True)

        def keyword(q: tuple[list[str], Any]) -> Any:
            return store.keyword_search(owner, q[0], K, T0, by_confidence=True)

        def hybrid(q: tuple[list[str], Any]) -> Any:
            # one side after the other, as when this bench's figures were recorded: it compares keyword SQL
            return fuse(*both_sides(store, owner, MODEL, q[0], q[1], HYBRID_WIDTH, -1.0, T0, at_once=False))[:K]

        rounds: dict[str, dict[str, list[dict[str, float]]]] = {v: {"keyword": [], "hybrid": []} for v in VARIANTS}
        for r in range(args.rounds):
            for name, variant in VARIANTS.items():
                pg.bm25_query = variant  # type: ignore[assignment]
                for kind, fn in (("keyword", keyword), ("hybrid", hybrid)):
                    time_calls(fn, qs[:20])  # warm
                    rounds[name][kind].append(summarize_ms(time_calls(fn, qs)))
                    got = rounds[name][kind][-1]
                    print(f"round {r + 1} {name:8} {kind:8} p50 {got['p50_ms']:.2f} ms p95 {got['p95_ms']:.2f} ms",
                          flush=True)
            pg.bm25_query = SHIPPED  # type: ignore[assignment]
        answers = {}
        for name, variant in VARIANTS.items():  # the same memories, in the same order, from both
            pg.bm25_query = variant  # type: ignore[assignment]
            answers[name] = [[(s.memory.id, round(s.score, 9)) for s in keyword(q)] for q in qs]
        pg.bm25_query = SHIPPED  # type: ignore[assignment]
        same = answers["inlined"] == answers["shipped"]

    def median(name: str, kind: str, key: str) -> float:
        return statistics.median(got[key] for got in rounds[name][kind])

    rows = []
    for kind in ("keyword", "hybrid"):
        before, now = median("inlined", kind, "p50_ms"), median("shipped", kind, "p50_ms")
        rows.append([kind, f"{before:.2f} / {median('inlined', kind, 'p95_ms'):.2f}",
                     f"{now:.2f} / {median('shipped', kind, 'p95_ms'):.2f}", f"{before / now:.2f}x"])
    title = (f"PostgreSQL keyword query, {args.rows:,} rows / {args.tenants} tenants,"
             f" medians of {args.rounds} rounds of {args.queries} questions")
    print_table(title, ["search", "inlined p50 / p95 ms", "shipped p50 / p95 ms", "ratio (p50)"], rows)
    print("the same memories and scores from both variants:", same)
    save_json(args.json, {"machine": machine(), "args": vars(args), "ingest": loaded, "rounds": rounds,
                          "same_answers": same})


if __name__ == "__main__":
    main()
