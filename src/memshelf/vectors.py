"""Exact vector search in process: one normalized float32 matrix per (owner, model), scanned with numpy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from .errors import DimensionMismatch

_controller: ThreadpoolController | None = None


def _one_blas_thread():  # type: ignore[no-untyped-def]
    """A single query is memory-bound: a second BLAS thread only adds stalls on a busy machine (DESIGN.md)."""
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


def pack(vector: Sequence[float] | np.ndarray) -> bytes:
    """Little-endian float32 bytes, the on-disk form of every vector."""
    return np.asarray(vector, dtype="<f4").tobytes()


def unpack(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4")


def normalize(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32, copy=False)


@dataclass(frozen=True)
class VectorMatrix:
    model: str
    keys: np.ndarray         # int64 row keys of the backend
    matrix: np.ndarray       # (n, d) float32, rows normalized
    confidence: np.ndarray   # (n,) float32
    expires: np.ndarray      # (n,) float64 epoch seconds, inf when the row never expires

    @property
    def size(self) -> int:
        return int(self.keys.shape[0])

    @property
    def dimensions(self) -> int:
        return int(self.matrix.shape[1]) if self.matrix.ndim == 2 else 0

    @classmethod
    def build(cls, model: str, rows: Sequence[Sequence], parse_time: Callable[[Any], datetime | None]
              ) -> VectorMatrix:
        """rows: (key, blob, confidence, expires_at) as the backend stores them."""
        if not rows:
            empty = np.zeros((0, 0), dtype=np.float32)
            return cls(model, np.zeros(0, np.int64), empty, np.zeros(0, np.float32), np.zeros(0))
        width = len(rows[0][1]) // 4
        for row in rows:
            if len(row[1]) // 4 != width:
                raise DimensionMismatch(
                    f"stored vectors stamped {model} have {width} and {len(row[1]) // 4} dimensions: one model "
                    "name was used for two models; re-embed with `memshelf backfill` under a distinct model name")
        blob = b"".join(row[1] for row in rows)
        matrix = normalize(np.frombuffer(blob, dtype="<f4").reshape(len(rows), width))
        expires = np.array([_epoch(parse_time(row[3])) for row in rows], dtype=np.float64)
        return cls(model, np.array([row[0] for row in rows], dtype=np.int64), np.ascontiguousarray(matrix),
                   np.array([row[2] for row in rows], dtype=np.float32), expires)


def _epoch(when: datetime | None) -> float:
    return math.inf if when is None else when.timestamp()


def top_k(vm: VectorMatrix, query: np.ndarray, limit: int, floor: float, now: float) -> list[tuple[int, float]]:
    """Indices and cosine scores of the best `limit` live rows scoring at least `floor`,
    ordered by (score, confidence) descending as in spec 002."""
    q = normalize(np.asarray(query, dtype=np.float32))
    with _one_blas_thread():
        scores = vm.matrix @ q
    scores = np.where(vm.expires > now, scores, -np.inf)
    candidates = np.flatnonzero(scores >= floor)
    if candidates.size == 0:
        return []
    if candidates.size > limit:
        part = np.argpartition(-scores[candidates], limit - 1)[:limit]
        candidates = candidates[part]
    order = sorted(candidates.tolist(), key=lambda i: (-float(scores[i]), -float(vm.confidence[i]), -int(vm.keys[i])))
    return [(i, float(scores[i])) for i in order]
