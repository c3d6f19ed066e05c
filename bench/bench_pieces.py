"""What embedding long memories in pieces costs at write time (issue 12, part 3): remember_many with pieces on (the
library as shipped) against pieces off (each text embedded whole, truncated by the model: the library before), in
the same run, on the same texts, with the real local model and no embedding cache (the embedding is the cost).

Texts are LongMemEval user turns (../shared/data/longmemeval_s_dev.json), in file order, distinct: `long` ones of
over 1,000 characters and `short` ones of at most 300. Each (texts, off/on) pair runs --runs times, interleaved,
each into a fresh SQLite file, in batches of --batch; the median run is reported, as characters stored per second
and how many vectors were made.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_pieces.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, shared_data  # noqa: E402

LONG_CHARS = 1_000
SHORT_CHARS = 300


def turns(path: Path, long: bool, count: int) -> list[str]:
    """The first `count` distinct user turns of the file that are long (over LONG_CHARS) or short."""
    seen: dict[str, None] = {}
    for item in json.loads(path.read_text(encoding="utf-8")):
        for session in item["haystack_sessions"]:
            for turn in session:
                text = turn.get("content", "")
                if turn.get("role") == "user" and text.strip() and (len(text) > LONG_CHARS if long
                                                                    else len(text) <= SHORT_CHARS):
                    seen.setdefault(text[:16_000], None)
                    if len(seen) == count:
                        return list(seen)
    return list(seen)


def run_once(embedder: Any, texts: Sequence[str], batch: int, folder: Path) -> dict[str, float]:
    from memshelf import Owner, Shelf

    counting = Counting(embedder)
    path = folder / f"run-{time.monotonic_ns()}.db"
    with Shelf.open(str(path), embedder=counting) as shelf:
        started = time.perf_counter()
        for start in range(0, len(texts), batch):
            shelf.remember_many(Owner("bench", "u"), [{"topic": "t", "content": c} for c in texts[start:start + batch]])
        seconds = time.perf_counter() - started
    path.unlink()
    return {"seconds": seconds, "vectors": counting.vectors}


class Counting:
    """The embedder, counting the vectors it makes (pieces included)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.model, self.vectors = inner, inner.model, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def embed_batch(self, texts: Sequence[str]) -> Any:
        self.vectors += len(texts)
        return self.inner.embed_batch(texts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", default=str(shared_data("longmemeval_s_dev.json")))
    p.add_argument("--long", type=int, default=120, help="long texts (over 1,000 characters)")
    p.add_argument("--short", type=int, default=600, help="short texts (at most 300 characters)")
    p.add_argument("--batch", type=int, default=64, help="memories per remember_many call")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from memshelf.embedders.local import LocalEmbedder

    class Whole(LocalEmbedder):
        """Pieces off: every text embedded whole (the model reads its first 254 word pieces), as before."""

        def pieces(self, texts: Sequence[str]) -> list[list[str]]:
            return [[text] for text in texts]

    on, off = LocalEmbedder(), Whole()
    on.embed("warm up")
    on.pieces(["warm " * 400])
    report: dict[str, Any] = {"machine": machine(), "args": vars(args), "sets": {}}
    with tempfile.TemporaryDirectory(prefix="memshelf-pieces-") as tmp:
        for name, long in (("short", False), ("long", True)):
            texts = turns(Path(args.data), long, args.long if long else args.short)
            chars = sum(len(t) for t in texts)
            runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
            for _ in range(args.runs):
                for label, embedder in (("off", off), ("on", on)):
                    runs[label].append(run_once(embedder, texts, args.batch, Path(tmp)))
            result = {"texts": len(texts), "chars": chars, "mean_chars": chars / len(texts)}
            for label, done in runs.items():
                seconds = statistics.median(r["seconds"] for r in done)
                result[label] = {"seconds": seconds, "chars_per_s": chars / seconds, "vectors": done[0]["vectors"],
                                 "runs_s": [round(r["seconds"], 3) for r in done]}
            result["time_ratio_on_off"] = result["on"]["seconds"] / result["off"]["seconds"]
            report["sets"][name] = result
            print(f"{name}: {len(texts)} texts, {chars / len(texts):,.0f} chars each on average; "
                  f"off {result['off']['chars_per_s']:,.0f} chars/s ({result['off']['vectors']} vectors), "
                  f"on {result['on']['chars_per_s']:,.0f} chars/s ({result['on']['vectors']} vectors): "
                  f"on/off time {result['time_ratio_on_off']:.2f}x")
    short, long_ = report["sets"]["short"], report["sets"]["long"]
    report["long_on_vs_short_off_per_char"] = short["off"]["chars_per_s"] / long_["on"]["chars_per_s"]
    print(f"long texts with pieces cost {report['long_on_vs_short_off_per_char']:.2f}x per character what short "
          "texts cost before")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
