"""`Shelf.learn` latency per turn without a model (issue 11): the `rules` extractor, SQLite in a temporary file.

The chat: threads of `--turns-per-thread` messages (10 by default) alternating user and assistant, spread over
`--owners` owners. User turns cycle through the user lines of the labelled sets in tests/data (statements about
the user, questions, hypotheticals, negations, small talk: roughly half say something to learn); assistant turns
are short replies. Every message is logged with `log_message`, then each thread is learned with one
`shelf.learn(owner, thread=...)` call, which reads the thread, asks the extractor, checks each proposal and
applies the plan in one transaction. Timed per call:
  * log: each `log_message` call (the same-run baseline: what storing the conversation already costs);
  * extract: `RulesExtractor().propose` over the same thread's turns alone (no store);
  * learn: each `learn` call, and the same divided by the thread's turns.
The CPU time (process_time) of log and learn calls is reported too: a busy machine inflates it far less than the
wall time, and the CPU ratio (learn CPU per turn over log_message CPU, both means) is the steadier comparison.
Reported: p50 and p95 milliseconds of each, throughput in turns learned per second (turns / total learn time),
and the ratios learn / log and learn / extract per turn. With `--embedder local` the same runs with the local
model (new memories are embedded, and `learn` searches the owner's related memories by meaning too).

    .venv/bin/python bench/bench_learn.py                         # embedder none, 2,000 turns
    .venv/bin/python bench/bench_learn.py --embedder local --turns 500
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, percentile, print_table, save_json  # noqa: E402

from memshelf import Owner, Shelf  # noqa: E402
from memshelf.learning import RulesExtractor, Turn  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
REPLIES = ("Got it.", "Sure, here is a short answer.", "That sounds lovely!", "Thanks for telling me.",
           "Here are three ideas you could try.", "Noted, I'll keep that in mind.", "Happy to help with that.")


def user_lines() -> list[str]:
    lines = []
    for path in sorted(DATA.glob("utterances*.jsonl")):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        lines += [row["text"] for row in rows if row["role"] == "user"]
    return lines


def chat(turns: int, per_thread: int, owners: int) -> list[tuple[Owner, str, list[tuple[str, str]]]]:
    """(owner, thread, [(role, content)]) for `turns` messages, threads dealt round-robin to the owners."""
    said, threads = user_lines(), []
    for index in range(max(1, turns // per_thread)):
        owner = Owner("bench", f"user{index % owners}")
        messages = [("user", said[(index * per_thread + k) % len(said)]) if k % 2 == 0
                    else ("assistant", REPLIES[(index + k) % len(REPLIES)]) for k in range(per_thread)]
        threads.append((owner, f"t{index}", messages))
    return threads


def run(embedder: str | None, threads: list[tuple[Owner, str, list[tuple[str, str]]]]) -> dict[str, object]:
    log_ms, learn_ms, extract_ms, per_turn_ms, learn_cpu_ms, log_cpu_ms = [], [], [], [], [], []
    written = 0
    clock = [datetime(2026, 5, 20, 9, 0, tzinfo=UTC)]

    def now() -> datetime:
        clock[0] += timedelta(seconds=1)
        return clock[0]

    extractor = RulesExtractor()
    with tempfile.TemporaryDirectory(prefix="memshelf-bench-learn-") as folder:
        with Shelf.open(Path(folder) / "learn.db", embedder=embedder, clock=now) as shelf:
            for owner, thread, messages in threads:
                for role, content in messages:
                    started, cpu = time.perf_counter(), time.process_time()
                    shelf.log_message(owner, thread, role, content)
                    log_ms.append((time.perf_counter() - started) * 1000)
                    log_cpu_ms.append((time.process_time() - cpu) * 1000)
                turns = [Turn(role, content, f"m{k}") for k, (role, content) in enumerate(messages)]
                started = time.perf_counter()
                extractor.propose(turns)
                extract_ms.append((time.perf_counter() - started) * 1000)
                started, cpu = time.perf_counter(), time.process_time()
                plan = shelf.learn(owner, thread=thread, extractor="rules")
                took = (time.perf_counter() - started) * 1000
                learn_cpu_ms.append((time.process_time() - cpu) * 1000)
                learn_ms.append(took)
                per_turn_ms.append(took / len(messages))
                written += len(plan.applied)
    turns = sum(len(messages) for _, _, messages in threads)
    stats = {name: {"p50": percentile(values, 50), "p95": percentile(values, 95)}
             for name, values in (("log_message", log_ms), ("extract_per_thread", extract_ms),
                                  ("learn_per_call", learn_ms), ("learn_per_turn", per_turn_ms),
                                  ("log_message_cpu", log_cpu_ms), ("learn_cpu_per_call", learn_cpu_ms))}
    return {"embedder": embedder or "none", "threads": len(threads), "turns": turns, "records_written": written,
            "learn_turns_per_s": turns / (sum(learn_ms) / 1000), "stats": stats,
            "learn_over_log_per_turn": stats["learn_per_turn"]["p50"] / stats["log_message"]["p50"],
            "learn_over_extract": stats["learn_per_call"]["p50"] / stats["extract_per_thread"]["p50"],
            "learn_cpu_per_turn_over_log_cpu": sum(learn_cpu_ms) / turns / (sum(log_cpu_ms) / len(log_cpu_ms))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=2_000, help="messages logged and learned (default 2,000)")
    parser.add_argument("--turns-per-thread", type=int, default=10)
    parser.add_argument("--owners", type=int, default=20)
    parser.add_argument("--embedder", default="none", help="none (default) or an embedder spec such as local")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    threads = chat(args.turns, args.turns_per_thread, args.owners)
    result = run(None if args.embedder == "none" else args.embedder, threads)
    stats = result["stats"]
    assert isinstance(stats, dict)
    rows = [[name, f"{values['p50']:.3f}", f"{values['p95']:.3f}"] for name, values in stats.items()]
    print(f"{result['turns']:,} turns in {result['threads']} threads of {args.turns_per_thread}, {args.owners} owners, "
          f"embedder {result['embedder']}; {result['records_written']} records written")
    print_table("Shelf.learn with the rules extractor (ms)", ["what", "p50", "p95"], rows)
    print(f"throughput {result['learn_turns_per_s']:,.0f} turns learned/s; per turn, learn p50 is "
          f"{result['learn_over_log_per_turn']:.2f}x a log_message p50; a learn call is "
          f"{result['learn_over_extract']:.1f}x the extractor alone on the same turns (p50); in CPU time, learning "
          f"costs {result['learn_cpu_per_turn_over_log_cpu']:.1f}x logging per turn (means)")
    save_json(args.json, {"machine": machine(), "args": vars(args), **result})


if __name__ == "__main__":
    main()
