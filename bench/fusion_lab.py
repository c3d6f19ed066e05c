"""Try fusion rules offline, in seconds, against candidate dumps written by the retrieval benchmarks.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/locomo.py --modes auto --dump runs/locomo_sqlite.json
    HF_HUB_OFFLINE=1 .venv/bin/python bench/longmemeval.py --modes auto --dump runs/lme_sqlite.json
    .venv/bin/python bench/fusion_lab.py runs/locomo_sqlite.json runs/lme_sqlite.json [--rules NAME,...]

A dump holds, per question, the hybrid's keyword candidates (the store's own call, with the conversation context)
with raw scores, and every memory's cosine. Each rule here turns those into a ranking; the lab scores it with the
benchmark's own protocol (LoCoMo: frac@5 and frac@10 of the top memories; LongMemEval: the top 50 memories
collapsed to sessions, any@5 and all@5), so a rule is judged on every data set and backend at once; `sum` adds
LoCoMo's frac@5 and the mean of LongMemEval's two, a rough total only. The `library` rule is the library's own
fuse(), so its row must match the benchmark's own numbers; `rrf_shipped` is the rank fusion shipped before (RRF
k=10, semantic weight 0.5). Rule names: rrf_kK_wsW (k and semantic weight), rrf2_kK_ksS_wsW (the semantic side
with its own k), zsum (standardised scores), norm (scores over the best), keep_best/zmax (the better side counts
most), ctxcos (a memory's cosine plus its topic neighbours'), oracle (the ceiling: evidence first).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

DIA_ID = re.compile(r"^D\d+:\d+$")
DEPTH = 50  # memshelf.shelf.CANDIDATES
FLOOR = 0.20  # memshelf.shelf.DEFAULT_FLOOR


@dataclass
class Question:
    kind: str
    evidence: frozenset[str]
    labels: list[list[str]]
    kw: np.ndarray  # memory numbers, best first
    kws: np.ndarray  # their raw keyword scores (higher is better)
    cos: np.ndarray  # every memory's cosine
    prev: np.ndarray  # per memory, the CONTEXT_TURNS memories stored just before it under its topic (-1: none)
    nxt: np.ndarray  # per memory, the ones just after


@dataclass
class Dump:
    name: str
    locomo: bool
    questions: list[Question]


def neighbours(topics: Sequence[str], turns: int = 2) -> tuple[np.ndarray, np.ndarray]:
    prev = np.full((len(topics), turns), -1, dtype=np.int64)
    nxt = np.full((len(topics), turns), -1, dtype=np.int64)
    seen: dict[str, list[int]] = {}
    for i, topic in enumerate(topics):
        before = seen.setdefault(topic, [])
        for j, p in enumerate(reversed(before[-turns:])):
            prev[i, j] = p
            for jj in range(turns):
                if nxt[p, jj] == -1:
                    nxt[p, jj] = i
                    break
        before.append(i)
    return prev, nxt


def load(path: str) -> Dump:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    owners = {}
    for name, o in data["owners"].items():
        prev, nxt = neighbours(o["topics"])
        owners[name] = (o["labels"], prev, nxt)
    questions = []
    for q in data["questions"]:
        labels, prev, nxt = owners[q["owner"]]
        kw = np.array([i for i, _ in q["keyword"]], dtype=np.int64)
        kws = np.array([s for _, s in q["keyword"]], dtype=np.float64)
        cos = np.zeros(len(labels))
        for i, s in q["semantic"]:
            cos[i] = s
        questions.append(Question(q["kind"], frozenset(q["evidence"]), labels, kw, kws, cos, prev, nxt))
    locomo = all(DIA_ID.match(e) for q in questions for e in q.evidence)
    return Dump(Path(path).stem, locomo, questions)


# ---------------------------------------------------------------------------------------------------- scoring
def measure(dump: Dump, ranked: list[np.ndarray]) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for q, order in zip(dump.questions, ranked):
        if dump.locomo:
            for k in (5, 10):
                found = {lab for i in order[:k] for lab in q.labels[i]} & q.evidence
                out.setdefault(f"frac@{k}", []).append(len(found) / len(q.evidence))
                out.setdefault(f"any@{k}", []).append(float(bool(found)))
        else:
            sessions = list(dict.fromkeys(q.labels[i][0] for i in order[:50]))
            for k in (5, 10):
                found = set(sessions[:k]) & q.evidence
                out.setdefault(f"any@{k}", []).append(float(bool(found)))
                out.setdefault(f"all@{k}", []).append(float(found == q.evidence))
    return {m: float(np.mean(v)) for m, v in out.items()}


def rank_by(score: np.ndarray, member: np.ndarray) -> np.ndarray:
    """Members best first; ties go to the newest memory, as the library breaks them."""
    idx = np.flatnonzero(member)
    return idx[np.lexsort((-idx, -score[idx]))]


# ---------------------------------------------------------------------------------------------------- sides
def semantic_side(q: Question, depth: int = DEPTH, floor: float = FLOOR, cos: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The semantic candidates (memory numbers best first, their cosines), as vector_search returns them."""
    cos = q.cos if cos is None else cos
    order = np.lexsort((-np.arange(len(cos)), -cos))
    order = order[cos[order] >= floor][:depth]
    return order, cos[order]


def rrf(q: Question, k: float = 10, wk: float = 1.0, ws: float = 0.5, depth: int = DEPTH, floor: float = FLOOR,
        cos: np.ndarray | None = None, ks: float | None = None) -> np.ndarray:
    """Weighted reciprocal rank fusion (the shipped rule); `ks` gives the semantic side its own k."""
    score = np.zeros(len(q.cos))
    member = np.zeros(len(q.cos), dtype=bool)
    kw = q.kw[:depth]
    score[kw] += wk / (k + np.arange(1, len(kw) + 1))
    member[kw] = True
    sem, _ = semantic_side(q, depth, floor, cos)
    score[sem] += ws / ((k if ks is None else ks) + np.arange(1, len(sem) + 1))
    member[sem] = True
    return rank_by(score, member)


def context_cos(q: Question, share: float, mode: str = "max", after: bool = False) -> np.ndarray:
    """A memory's cosine plus `share` of its topic neighbours' (the turns just before it, and after if asked)."""
    near = np.concatenate([q.prev, q.nxt], axis=1) if after else q.prev
    padded = np.append(q.cos, -1.0)  # index -1 reads the pad
    vals = padded[near]
    if mode == "max":
        ctx = vals.max(axis=1)
    else:
        ctx = np.where(near >= 0, vals, 0).sum(axis=1) / np.maximum(1, (near >= 0).sum(axis=1))
    return q.cos + share * np.maximum(ctx, 0.0)


def normalised(q: Question, depth: int = DEPTH, floor: float = FLOOR, a: float = 0.5,
               cos: np.ndarray | None = None) -> np.ndarray:
    """Convex combination of each side's score over its best: bm25/max and (cos - floor)/(max - floor)."""
    score = np.zeros(len(q.cos))
    member = np.zeros(len(q.cos), dtype=bool)
    kw, kws = q.kw[:depth], q.kws[:depth]
    if len(kw) and kws[0] > 0:
        score[kw] += a * kws / kws[0]
    member[kw] = True
    sem, sims = semantic_side(q, depth, floor, cos)
    if len(sem) and sims[0] > floor:
        score[sem] += (1 - a) * (sims - floor) / (sims[0] - floor)
    member[sem] = True
    return rank_by(score, member)


def keep_best(q: Question, k: float = 10, wk: float = 1.0, ws: float = 0.5, depth: int = DEPTH,
              floor: float = FLOOR, both: float = 1.0, cos: np.ndarray | None = None) -> np.ndarray:
    """Each side's reciprocal rank, the larger one counting fully and the other by `both` (1.0 is RRF)."""
    n = len(q.cos)
    a, b = np.zeros(n), np.zeros(n)
    kw = q.kw[:depth]
    a[kw] = wk / (k + np.arange(1, len(kw) + 1))
    sem, _ = semantic_side(q, depth, floor, cos)
    b[sem] = ws / (k + np.arange(1, len(sem) + 1))
    score = np.maximum(a, b) + both * np.minimum(a, b)
    return rank_by(score, (a > 0) | (b > 0))


def zsum(q: Question, ws: float = 0.5, depth: int = DEPTH, floor: float = FLOOR, missing: float | str = 0.0,
         kdepth: int | None = None, both: float = 1.0) -> np.ndarray:
    """Each side's raw scores as z-scores within its own candidate list, summed. A row one side did not return
    scores `missing` there: a number, "min" (that side's lowest z), or "zero" (the z of no match: keyword 0, cosine
    the floor, but no lower than -3)."""
    n = len(q.cos)
    a, b = np.full(n, np.nan), np.full(n, np.nan)
    fill = []
    kw, kws = q.kw[:kdepth or depth], q.kws[:kdepth or depth]
    sem, sims = semantic_side(q, depth, floor)
    for side, ids, raw, none in ((a, kw, kws, 0.0), (b, sem, sims, floor)):
        if not len(ids):
            fill.append(0.0 if not isinstance(missing, float) else missing)
            continue
        mean, std = raw.mean(), raw.std() or 1.0
        side[ids] = (raw - mean) / std
        if missing == "min-1":
            fill.append(min(-1.0, float(side[ids].min())))
        elif missing == "min":
            fill.append(float(side[ids].min()))
        elif missing == "zero":
            fill.append(max(-3.0, (none - mean) / std))
        else:
            fill.append(float(missing))
    member = ~np.isnan(a) | ~np.isnan(b)
    a, b = np.nan_to_num(a, nan=fill[0]), ws * np.nan_to_num(b, nan=fill[1])
    score = np.maximum(a, b) + both * np.minimum(a, b)  # both=1: the plain sum
    return rank_by(score, member)


def library(q: Question, depth: int = DEPTH, floor: float = FLOOR) -> np.ndarray:
    """The library's own fuse() (memshelf._retrieval, with its current constants) on these candidates."""
    from types import SimpleNamespace

    from memshelf._retrieval import fuse
    from memshelf.stores.base import Scored

    def scored(ids: np.ndarray, raw: np.ndarray) -> list[Scored]:
        return [Scored(SimpleNamespace(id=int(i)), float(s)) for i, s in zip(ids, raw)]  # type: ignore[arg-type]

    sem, sims = semantic_side(q, depth, floor)
    return np.array([c.memory.id for c in fuse(scored(q.kw[:depth], q.kws[:depth]), scored(sem, sims))],
                    dtype=np.int64)


def oracle(q: Question, depth: int = DEPTH, floor: float = FLOOR) -> np.ndarray:
    """The ceiling: every evidence memory either side finds at this depth, first."""
    sem, _ = semantic_side(q, depth, floor)
    pool = list(dict.fromkeys([*q.kw[:depth].tolist(), *sem.tolist()]))
    hit = [i for i in pool if set(q.labels[i]) & q.evidence]
    return np.array(hit + [i for i in pool if i not in set(hit)], dtype=np.int64)


RULES: dict[str, Callable[[Question], np.ndarray]] = {
    "rrf_shipped": lambda q: rrf(q),
    "library": library,
    "oracle": oracle,
    "oracle_depth200": lambda q: oracle(q, 200, -1.0),
    "keyword_only": lambda q: rrf(q, ws=0.0),
    "semantic_only": lambda q: rrf(q, wk=0.0),
}
for _k in (2, 5, 10, 20, 60):
    for _ws in (0.3, 0.5, 0.7, 1.0):
        RULES[f"rrf_k{_k}_ws{_ws}"] = lambda q, k=_k, ws=_ws: rrf(q, k=k, ws=ws)
for _a in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
    RULES[f"norm_a{_a}"] = lambda q, a=_a: normalised(q, a=a)
for _k in (5, 10, 20):
    for _ws in (0.5, 0.7, 1.0):
        for _both in (0.0, 0.5):
            RULES[f"keep_best_k{_k}_ws{_ws}_both{_both}"] = lambda q, k=_k, ws=_ws, b=_both: keep_best(
                q, k=k, ws=ws, both=b)
for _d in (20, 30):
    RULES[f"library_depth{_d}"] = lambda q, d=_d: library(q, depth=d)
for _share in (0.5, 1.0):
    RULES[f"ctxcos_mean_after_{_share}_steep"] = lambda q, s=_share: rrf(
        q, ks=1, ws=0.15, cos=context_cos(q, s, "mean", True))
for _k in (5, 10):
    for _ks in (0, 1, 2, 5):
        for _ws in (0.1, 0.2, 0.3, 0.5):
            RULES[f"rrf2_k{_k}_ks{_ks}_ws{_ws}"] = lambda q, k=_k, ks=_ks, ws=_ws: rrf(q, k=k, ws=ws, ks=ks)
for _ws in (0.3, 0.5, 0.7, 1.0):
    for _miss in (0.0, -1.0, -2.0, "min", "min-1", "zero"):
        RULES[f"zsum_ws{_ws}_miss{_miss}"] = lambda q, ws=_ws, m=_miss: zsum(q, ws=ws, missing=m)
for _ws in (0.6, 0.65, 0.75, 0.8):
    RULES[f"zsum_ws{_ws}_missmin-1"] = lambda q, ws=_ws: zsum(q, ws=ws, missing="min-1")
for _k in (5, 7, 10):
    for _ks in (1, 2, 3):
        for _ws in (0.15, 0.2, 0.25, 0.3):
            RULES.setdefault(f"rrf2_k{_k}_ks{_ks}_ws{_ws}", lambda q, k=_k, ks=_ks, ws=_ws: rrf(q, k=k, ws=ws, ks=ks))
for _ws in (0.5, 0.7, 1.0):
    for _both in (0.0, 0.25, 0.5):
        RULES[f"zmax_ws{_ws}_both{_both}"] = lambda q, ws=_ws, b=_both: zsum(q, ws=ws, missing=-1.0, both=b)
for _d in (10, 20, 30, 100):
    RULES[f"zsum_ws0.5_miss-1.0_depth{_d}"] = lambda q, d=_d: zsum(q, ws=0.5, missing=-1.0, depth=d)
    RULES[f"zsum_ws0.5_miss-1.0_kdepth{_d}"] = lambda q, d=_d: zsum(q, ws=0.5, missing=-1.0, kdepth=d)
for _share in (0.25, 0.5, 1.0):
    for _mode in ("max", "mean"):
        for _after in (False, True):
            RULES[f"ctxcos_{_mode}{'_after' if _after else ''}_{_share}_semantic"] = (
                lambda q, s=_share, m=_mode, a=_after: rrf(q, wk=0.0, cos=context_cos(q, s, m, a)))
            RULES[f"ctxcos_{_mode}{'_after' if _after else ''}_{_share}_rrf"] = (
                lambda q, s=_share, m=_mode, a=_after: rrf(q, cos=context_cos(q, s, m, a)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dumps", nargs="+")
    parser.add_argument("--rules", default="", help="comma-separated rule names, * as a wildcard (default all)")
    args = parser.parse_args(argv)
    dumps = [load(p) for p in args.dumps]
    wanted = [r for r in args.rules.split(",") if r]
    names = [n for n in RULES if not wanted or any(re.fullmatch(w.replace("*", ".*"), n) for w in wanted)]
    for name in names:
        cells = []
        total = 0.0
        for dump in dumps:
            m = measure(dump, [RULES[name](q) for q in dump.questions])
            total += m["frac@5"] if dump.locomo else (m["any@5"] + m["all@5"]) / 2
            cells.append(f"{dump.name} " + (f"frac@5 {m['frac@5']:.3f} frac@10 {m['frac@10']:.3f}" if dump.locomo
                                            else f"any@5 {m['any@5']:.3f} all@5 {m['all@5']:.3f}"))
        print(f"{name:28s} " + " | ".join(cells) + f" | sum {total:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
