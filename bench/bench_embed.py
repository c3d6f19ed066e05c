"""The local model on its two runtimes (issue 17): ONNX Runtime, the default, against torch (sentence-transformers),
measured in the same run so the machine's load falls on both alike.

- start: a fresh Python process that embeds one text (`LocalEmbedder().embed`), wall time and peak memory; the
  ONNX graph is already in the cache (it is made once per machine, and that export is timed separately).
- query: one question at a time, as search and context embed it.
- ingest: Shelf.remember_many of the texts into a new SQLite file (embedding them is nearly all of it).
- context: Shelf.context() end to end (the question's embedding, hybrid search, the block) over those memories.
- agreement: the largest difference between the two runtimes' vectors, and whether each question's top 10 over the
  texts is the same list.

Each runtime is measured in a process of its own, the runtimes alternating for --rounds rounds; medians are shown.
Texts and questions are LoCoMo's turns and questions (../shared/data/locomo10.json, or --locomo PATH); without that
file, synthetic sentences, and the output says so.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_embed.py
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_embed.py --texts 4000 --queries 400 --starts 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, make_vocabulary, percentile, print_table, save_json, shared_data  # noqa: E402

from memshelf import Owner, Shelf  # noqa: E402
from memshelf.embedders import _onnx, local  # noqa: E402

BATCH = 64
START = ("import re, time; t = time.perf_counter(); from memshelf.embedders.local import LocalEmbedder; "
         "LocalEmbedder().embed('Where is the printer?'); took = time.perf_counter() - t; "
         "print(took, re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))")
"""A fresh process's time to its first vector and its peak resident memory (VmHWM, in kB: ru_maxrss would count
the parent's pages from before exec)."""


def texts_and_questions(path: Path, texts: int, queries: int) -> tuple[list[str], list[str], str]:
    if path.is_file():
        samples = json.loads(path.read_text(encoding="utf-8"))
        turns = [f"{turn['speaker']}: {turn['text']}" for sample in samples
                 for key, session in sample["conversation"].items()
                 if key.startswith("session_") and isinstance(session, list) for turn in session]
        asked = [qa["question"] for sample in samples for qa in sample["qa"] if isinstance(qa.get("question"), str)]
        return turns[:texts], asked[:queries], f"LoCoMo ({path.name})"
    print(f"note: {path} is absent; using synthetic sentences instead of LoCoMo's", file=sys.stderr)
    rng, words = random.Random(7), make_vocabulary(5000)
    made = [" ".join(rng.choice(words) for _ in range(rng.randrange(6, 40))) + "." for _ in range(texts + queries)]
    return made[:texts], made[texts:], "synthetic sentences"


def child(runtime: str, texts: list[str], questions: list[str]) -> dict[str, float]:
    """One runtime's timings, in a process of its own (two runtimes in one process slow each other: each keeps its
    worker threads spinning for a while after a run)."""
    embedder = local.LocalEmbedder()
    embedder.embed("warm up")
    assert local.runtime() == runtime, (local.runtime(), runtime)
    return timings(embedder, texts, questions)


def timings(embedder: Any, texts: list[str], questions: list[str]) -> dict[str, float]:
    """One embedder's query, ingest and context() timings (it is loaded already)."""
    query = []
    for question in questions:
        began = time.perf_counter()
        embedder.embed_batch([question])
        query.append((time.perf_counter() - began) * 1000)
    owner = Owner("bench", "user")
    with tempfile.TemporaryDirectory() as folder, Shelf.open(str(Path(folder) / "memory.db"),
                                                              embedder=embedder) as shelf:
        began = time.perf_counter()
        shelf.remember_many(owner, [{"topic": "conversation", "content": text} for text in texts])
        ingest = len(texts) / (time.perf_counter() - began)
        shelf.context(owner, questions[0])  # the owner's vectors are read once
        context = []
        for question in questions:
            began = time.perf_counter()
            shelf.context(owner, question)
            context.append((time.perf_counter() - began) * 1000)
    return {"query_p50_ms": percentile(query, 50), "query_p95_ms": percentile(query, 95),
            "context_p50_ms": percentile(context, 50), "context_p95_ms": percentile(context, 95),
            "ingest_texts_per_s": ingest}


def starts(rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(seconds, peak MB) of `rounds` fresh processes per runtime, alternating."""
    out: dict[str, list[tuple[float, float]]] = {"torch": [], "onnx": []}
    for _ in range(rounds):
        for runtime in out:
            proc = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, check=True,
                                  env={**os.environ, _onnx.RUNTIME_ENV: runtime})
            seconds, peak_kb = proc.stdout.split()
            out[runtime].append((float(seconds), int(peak_kb) / 1024))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=shared_data("locomo10.json"))
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--starts", type=int, default=3, help="fresh processes per runtime")
    parser.add_argument("--rounds", type=int, default=2, help="measuring processes per runtime")
    parser.add_argument("--json")
    parser.add_argument("--child", choices=["torch", "onnx"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    texts, questions, data = texts_and_questions(args.locomo, args.texts, args.queries)
    if args.child:
        print(json.dumps(child(args.child, texts, questions)))
        return
    torch_model = local._shared_model()
    began = time.perf_counter()
    onnx = _onnx.load(local._model_dir(), f"bench-{os.getpid()}", local._shared_model)
    export_seconds = time.perf_counter() - began
    (_onnx.cache_dir() / f"bench-{os.getpid()}.onnx").unlink(missing_ok=True)
    if onnx is None:
        sys.exit("the ONNX graph could not be made: see the warning above")
    local.LocalEmbedder().embed("make sure the process-wide graph exists for the measuring processes")

    def by_torch(batch: list[str]) -> np.ndarray:
        return np.asarray(torch_model.encode(batch, batch_size=BATCH, normalize_embeddings=True,
                                             convert_to_numpy=True, show_progress_bar=False))

    rounds: dict[str, list[dict[str, float]]] = {"torch": [], "onnx": []}
    for _ in range(args.rounds):
        for name in rounds:
            proc = subprocess.run([sys.executable, __file__, "--child", name, "--locomo", str(args.locomo),
                                   "--texts", str(args.texts), "--queries", str(args.queries)],
                                  capture_output=True, text=True, check=True,
                                  env={**os.environ, _onnx.RUNTIME_ENV: name})
            rounds[name].append(json.loads(proc.stdout.splitlines()[-1]))
    ours, theirs = onnx.encode(texts), by_torch(texts)
    q_ours, q_theirs = onnx.encode(questions), by_torch(questions)
    same_top = sum(np.argsort(-(ours @ a), kind="stable")[:10].tolist()
                   == np.argsort(-(theirs @ b), kind="stable")[:10].tolist() for a, b in zip(q_ours, q_theirs))
    started = starts(args.starts)

    result: dict[str, Any] = {"machine": machine(), "data": data, "texts": len(texts), "questions": len(questions),
                              "export_seconds": export_seconds, "runtimes": {}}
    rows = []
    for name, measured in rounds.items():
        row = {key: float(np.median([m[key] for m in measured])) for key in measured[0]}
        row |= {"start_s": float(np.median([s for s, _ in started[name]])),
               "start_peak_mb": float(np.median([m for _, m in started[name]]))}
        result["runtimes"][name] = row
        rows.append([name, f"{row['query_p50_ms']:.2f}", f"{row['query_p95_ms']:.2f}", f"{row['context_p50_ms']:.2f}",
                     f"{row['context_p95_ms']:.2f}",
                     f"{row['ingest_texts_per_s']:,.0f}", f"{row['start_s']:.2f}", f"{row['start_peak_mb']:,.0f}"])
    torch_row, onnx_row = result["runtimes"]["torch"], result["runtimes"]["onnx"]
    ratios = {"query_p50": torch_row["query_p50_ms"] / onnx_row["query_p50_ms"],
              "context_p50": torch_row["context_p50_ms"] / onnx_row["context_p50_ms"],
              "ingest": onnx_row["ingest_texts_per_s"] / torch_row["ingest_texts_per_s"],
              "start": torch_row["start_s"] / onnx_row["start_s"]}
    rows.append(["onnx speed-up", f"{ratios['query_p50']:.2f}x", "", f"{ratios['context_p50']:.2f}x", "",
                 f"{ratios['ingest']:.2f}x",
                 f"{ratios['start']:.2f}x", ""])
    result["ratios"] = ratios
    result["rounds"] = rounds
    result["agreement"] = {"max_abs_difference": float(max(np.abs(ours - theirs).max(),
                                                           np.abs(q_ours - q_theirs).max())),
                           "same_top10": int(same_top), "questions": len(questions)}
    print_table(f"local model runtimes: {len(texts)} texts, {len(questions)} questions ({data}); export "
                f"{export_seconds:.1f} s once", ["runtime", "query p50 ms", "query p95 ms", "context p50 ms",
                                                  "context p95 ms", "ingest texts/s",
                                                  "start s", "start peak MB"], rows)
    print(f"agreement: max |difference| {result['agreement']['max_abs_difference']:.2g}; same top 10 for "
          f"{same_top} of {len(questions)} questions")
    save_json(args.json, result)


if __name__ == "__main__":
    main()
