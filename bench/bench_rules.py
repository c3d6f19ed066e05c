"""Throughput of the `rules` extractor (issue 11), in messages per second on one core.

The messages are the labelled set of tests/data/utterances.jsonl (user statements, questions, hypotheticals,
negations, pretend play, small talk, assistant and tool turns; about 45% user statements), cycled to
`--messages` turns with ids. Two ways of calling it, each timed `--runs` times after one warm-up pass:
  * per turn: one `propose([turn])` call per message, as learning one turn at a time would;
  * batched: one `propose(turns)` call over all of them.
The process pins itself to one CPU (sched_setaffinity) where the platform allows. Reported: median, min and max
messages/s over the runs, and how many proposals one pass wrote.

    .venv/bin/python bench/bench_rules.py                      # 20,000 messages, 5 runs
    .venv/bin/python bench/bench_rules.py --join 4                                   # 4 utterances a message
    .venv/bin/python bench/bench_rules.py --messages 5000 --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, print_table, save_json  # noqa: E402

from memshelf.learning import RulesExtractor, Turn  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "utterances.jsonl"
TARGET = 5_000


def labelled_turns(count: int, join: int = 1) -> list[Turn]:
    """`count` turns cycling through the labelled set, each with its own id; with `join` > 1 each turn is that
    many consecutive utterances in one message (the role of the first)."""
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    turns = []
    for i in range(count):
        parts = [rows[(i * join + j) % len(rows)] for j in range(join)]
        turns.append(Turn(parts[0]["role"], " ".join(part["text"] for part in parts), f"m{i}"))
    return turns


def pin_to_one_core() -> str:
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity)"
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return f"pinned to CPU {core}"


def per_turn(extractor: RulesExtractor, turns: list[Turn]) -> int:
    return sum(len(extractor.propose([turn])) for turn in turns)


def batched(extractor: RulesExtractor, turns: list[Turn]) -> int:
    return len(extractor.propose(turns))


def rates(way: Callable[[RulesExtractor, list[Turn]], int], turns: list[Turn], runs: int) -> tuple[list[float], int]:
    extractor = RulesExtractor()
    written = way(extractor, turns)  # warm-up: compiles nothing new, fills caches
    measured = []
    for _ in range(runs):
        start = time.perf_counter()
        way(extractor, turns)
        measured.append(len(turns) / (time.perf_counter() - start))
    return measured, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--join", type=int, default=1, help="utterances per message (longer messages)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    pinned = pin_to_one_core()
    turns = labelled_turns(args.messages, args.join)
    mean_chars = statistics.mean(len(turn.content) for turn in turns)
    results, rows = {}, []
    for name, way in (("per turn", per_turn), ("batched", batched)):
        measured, written = rates(way, turns, args.runs)
        results[name] = {"median": statistics.median(measured), "min": min(measured), "max": max(measured),
                         "proposals_per_pass": written}
        rows.append([name, f"{statistics.median(measured):,.0f}", f"{min(measured):,.0f}", f"{max(measured):,.0f}",
                     written, "yes" if min(measured) >= TARGET else "NO"])
    print(f"{args.messages:,} messages from {DATA.name} ({args.join} utterance(s) each, {mean_chars:.0f} characters "
          f"on average), {args.runs} runs each, {pinned}")
    print_table("rules extractor throughput (messages/s)",
                ["calls", "median", "min", "max", "proposals/pass", f">= {TARGET:,}"], rows)
    save_json(args.json, {"machine": machine(), "pinned": pinned, "messages": args.messages, "join": args.join,
                          "mean_chars": mean_chars, "runs": args.runs,
                          "results": results})


if __name__ == "__main__":
    main()
