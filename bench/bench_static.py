"""The static embedder (distilled from the shipped model) against the shipped model itself, in the same run.

For each embedder, in a process of its own, the embedders alternating for --rounds rounds (medians shown):
- query: one question embedded at a time, as search and context embed it;
- ingest: Shelf.remember_many of the texts into a new SQLite file, embedding included;
- context: Shelf.context() end to end over those memories.
Texts and questions are LoCoMo's turns and questions (../shared/data/locomo10.json, or --locomo PATH); without
that file, synthetic sentences, and the output says so. What each finds is measured by bench/locomo.py and
bench/longmemeval.py with --embedder static.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_static.py
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_static.py --texts 5000 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, print_table, save_json, shared_data  # noqa: E402
from bench_embed import texts_and_questions, timings  # noqa: E402

from memshelf.embedders.base import resolve_embedder  # noqa: E402

EMBEDDERS = ("local", "static")


def child(spec: str, texts: list[str], questions: list[str]) -> dict[str, float]:
    embedder = resolve_embedder(spec)
    embedder.embed("warm up")  # loads the model, or reads (or distils, once per machine) the static table
    return timings(embedder, texts, questions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=shared_data("locomo10.json"))
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="measuring processes per embedder")
    parser.add_argument("--json")
    parser.add_argument("--child", choices=EMBEDDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()

    texts, questions, data = texts_and_questions(args.locomo, args.texts, args.queries)
    if args.child:
        print(json.dumps(child(args.child, texts, questions)))
        return
    resolve_embedder("static").embed("distil the table now, if this machine has none, so no round pays for it")
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in EMBEDDERS}
    for _ in range(args.rounds):
        for name in EMBEDDERS:
            proc = subprocess.run([sys.executable, __file__, "--child", name, "--locomo", str(args.locomo),
                                   "--texts", str(args.texts), "--queries", str(args.queries)],
                                  capture_output=True, text=True, check=True)
            rounds[name].append(json.loads(proc.stdout.splitlines()[-1]))
    result: dict[str, Any] = {"machine": machine(), "data": data, "texts": len(texts), "questions": len(questions),
                              "embedders": {}, "rounds": rounds}
    rows = []
    for name, measured in rounds.items():
        row = {key: float(np.median([m[key] for m in measured])) for key in measured[0]}
        result["embedders"][name] = row
        rows.append([name, f"{row['query_p50_ms']:.3f}", f"{row['query_p95_ms']:.3f}", f"{row['context_p50_ms']:.2f}",
                     f"{row['context_p95_ms']:.2f}", f"{row['ingest_texts_per_s']:,.0f}"])
    model, static = result["embedders"]["local"], result["embedders"]["static"]
    ratios = {"query_p50": model["query_p50_ms"] / static["query_p50_ms"],
              "context_p50": model["context_p50_ms"] / static["context_p50_ms"],
              "ingest": static["ingest_texts_per_s"] / model["ingest_texts_per_s"]}
    rows.append(["static speed-up", f"{ratios['query_p50']:.1f}x", "", f"{ratios['context_p50']:.1f}x", "",
                 f"{ratios['ingest']:.1f}x"])
    result["ratios"] = ratios
    print_table(f"static embedder against the shipped model: {len(texts)} texts, {len(questions)} questions ({data})",
                ["embedder", "query p50 ms", "query p95 ms", "context p50 ms", "context p95 ms", "ingest texts/s"],
                rows)
    save_json(args.json, result)


if __name__ == "__main__":
    main()
