"""HTTP throughput of a keyword search against GET /health on the same server, in the same run (issue 17).

`memshelf serve --workers W --embedder none` runs as a subprocess on 127.0.0.1 over a fresh SQLite file whose user
has --memories memories. wrk (Debian's package `wrk`) drives it with --connections connections from one thread:
GET /health, then POST /v1/users/{user}/search (a keyword question, limit 5), alternating in --rounds rounds of
--seconds each; the medians are reported with the search's share of the health check's throughput. Every non-2xx
answer counts as an error.

--src PATH serves another source tree (e.g. a worktree of an older commit) so two versions can be measured in one
run: each --src given is measured in turn, round by round.

    .venv/bin/python bench/bench_http.py                                     # 2 workers, 5 rounds of 3 s
    .venv/bin/python bench/bench_http.py --src ../before/src --src src --json out.json
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from collections.abc import Iterator
from pathlib import Path
from typing import Any


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine, memshelf_serve, print_table, save_json  # noqa: E402

SEED = """
import sys
from memshelf import Owner, Shelf
with Shelf.open(sys.argv[1], embedder=None) as shelf:
    words = ["paper", "toner", "ink", "cables", "stapler", "scanner", "monitor", "keyboard"]
    shelf.remember_many(Owner("bench", "kaleb"), [
        {"topic": "office", "content": f"Note {i}: the {words[i % 8]} in room {i % 50} was checked on day {i % 31}."}
        for i in range(int(sys.argv[2]))])
    print(shelf.create_key("bench")[1])
"""


@contextmanager
def server(src: Path, workers: int, memories: int) -> Iterator[tuple[str, str]]:
    """A fresh database and `memshelf serve` on it, from the source tree `src`; yields (url, key)."""
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "memory.db")
        env = {**os.environ, "PYTHONPATH": str(src)}
        key = subprocess.run([sys.executable, "-c", SEED, db, str(memories)], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        with memshelf_serve(["--db", db, "--embedder", "none"], ["--workers", str(workers)], env) as url:
            yield url, key


def wrk(url: str, seconds: float, connections: int, script: Path | None) -> tuple[float, int]:
    """(requests/s, non-2xx and socket errors) of one wrk run."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", url] + (["-s", str(script)] if script else [])
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    broken = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return rate, (int(bad.group(1)) if bad else 0) + (sum(map(int, broken.groups())) if broken else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", type=Path, help="source tree to serve (repeatable; default src)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memories", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: `sudo apt-get install wrk` (Debian's package), then run this again")
    sources = [s.resolve() for s in (args.src or [ROOT / "src"])]

    results: dict[str, Any] = {"machine": machine(), "workers": args.workers, "memories": args.memories,
                               "connections": args.connections, "seconds": args.seconds, "sources": {}}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scripts:
        servers = {str(src): stack.enter_context(server(src, args.workers, args.memories)) for src in sources}
        samples: dict[str, dict[str, list[float]]] = {s: {"health": [], "search": []} for s in servers}
        errors = dict.fromkeys(servers, 0)
        for url, _ in servers.values():  # warm each worker
            wrk(url + "/health", 1, args.connections, None)
        for _ in range(args.rounds):
            for src, (url, key) in servers.items():
                script = Path(scripts) / f"search-{abs(hash(src))}.lua"
                script.write_text('wrk.method = "POST"\n'
                                  'wrk.body = \'{"question": "toner in room 7", "mode": "keyword", "limit": 5}\'\n'
                                  'wrk.headers["Content-Type"] = "application/json"\n'
                                  f'wrk.headers["Authorization"] = "Bearer {key}"\n')
                for name, target, lua in (("health", url + "/health", None),
                                          ("search", url + "/v1/users/kaleb/search", script)):
                    rate, bad = wrk(target, args.seconds, args.connections, lua)
                    samples[src][name].append(rate)
                    errors[src] += bad
    rows = []
    for src, measured in samples.items():
        health, search = statistics.median(measured["health"]), statistics.median(measured["search"])
        results["sources"][src] = {"health_rps": health, "search_rps": search, "share": search / health,
                                   "errors": errors[src], "rounds": measured}
        rows.append([os.path.relpath(src), f"{health:,.0f}", f"{search:,.0f}", f"{search / health:.2f}",
                     errors[src]])
    print_table(f"requests/s, {args.workers} workers, {args.connections} connections, median of {args.rounds} "
                f"rounds of {args.seconds:g} s", ["source", "GET /health", "keyword search", "search / health",
                                                  "errors"], rows)
    save_json(args.json, results)


if __name__ == "__main__":
    main()
