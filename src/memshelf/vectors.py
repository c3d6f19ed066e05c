"""Exact vector search in process: one normalized float32 matrix per (owner, model), scanned with numpy."""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
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


PARALLEL_ROWS = 32_768
"""From this many rows a scan is split across the cores: it is memory-bound, and one core cannot use all of the
bandwidth (100k x 384 on 2 cores: 10 ms on one, 5 ms split). Below it, waking a second thread costs more than it
saves."""
_pool: ThreadPoolExecutor | None = None


def _cosines(matrix: np.ndarray, q: np.ndarray) -> np.ndarray:
    """matrix @ q, in slices on our own threads for big matrices, each on one BLAS thread. Our threads (unlike
    BLAS's spinning ones) simply queue when the machine is busy, so a split scan is never much slower than one."""
    global _pool
    rows, workers = matrix.shape[0], min(os.cpu_count() or 1, 4)
    with _one_blas_thread():
        if rows < PARALLEL_ROWS or workers < 2:
            return matrix @ q
        if _pool is None:
            _pool = ThreadPoolExecutor(workers - 1, thread_name_prefix="memshelf-scan")
        out = np.empty(rows, dtype=np.float32)
        bounds = np.linspace(0, rows, workers + 1).astype(int).tolist()
        slices = list(zip(bounds[:-1], bounds[1:]))
        futures = [_pool.submit(np.dot, matrix[a:b], q, out[a:b]) for a, b in slices[1:]]
        np.dot(matrix[slices[0][0]:slices[0][1]], q, out[slices[0][0]:slices[0][1]])
        for future in futures:
            future.result()
        return out


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
    """An owner's vectors of one model. Rows live in buffers with spare capacity, so appending new memories
    copies only the new rows; `extended` returns a new view and never changes what a reader already holds."""

    model: str
    size: int
    _keys: np.ndarray        # int64 backend keys (capacity-long)
    _matrix: np.ndarray      # (capacity, d) float32, rows normalized
    _confidence: np.ndarray  # float32
    _expires: np.ndarray     # float64 epoch seconds, inf when the row never expires

    @property
    def keys(self) -> np.ndarray:
        return self._keys[:self.size]

    @property
    def matrix(self) -> np.ndarray:
        return self._matrix[:self.size]

    @property
    def confidence(self) -> np.ndarray:
        return self._confidence[:self.size]

    @property
    def expires(self) -> np.ndarray:
        return self._expires[:self.size]

    @property
    def dimensions(self) -> int:
        return int(self._matrix.shape[1])

    @property
    def last_key(self) -> int:
        return int(self._keys[self.size - 1]) if self.size else -1

    @classmethod
    def build(cls, model: str, rows: Sequence[Sequence], parse_time: Callable[[Any], datetime | None]
              ) -> VectorMatrix:
        """rows: (key, blob, confidence, expires_at) as the backend stores them, in key order."""
        width = len(rows[0][1]) // 4 if rows else 0
        empty = cls(model, 0, np.zeros(0, np.int64), np.zeros((0, width), np.float32), np.zeros(0, np.float32),
                    np.zeros(0))
        return empty.extended(rows, parse_time)

    def extended(self, rows: Sequence[Sequence], parse_time: Callable[[Any], datetime | None]) -> VectorMatrix:
        """This matrix plus `rows` (keys above last_key), growing the buffers geometrically when full."""
        if not rows:
            return self
        width = self.dimensions if self.size else len(rows[0][1]) // 4
        for row in rows:
            if len(row[1]) != width * 4:
                raise DimensionMismatch(
                    f"stored vectors stamped {self.model} have {width} and {len(row[1]) // 4} dimensions: one model "
                    "name was used for two models; re-embed with `memshelf backfill` under a distinct model name")
        new_size = self.size + len(rows)
        keys, matrix, confidence, expires = self._keys, self._matrix, self._confidence, self._expires
        if new_size > keys.shape[0] or matrix.shape[1] != width:
            capacity = max(new_size, 2 * self.size, 64)
            keys, matrix = _grow(keys, self.size, capacity), _grow(matrix, self.size, capacity, width)
            confidence, expires = _grow(confidence, self.size, capacity), _grow(expires, self.size, capacity)
        blob = b"".join(row[1] for row in rows)
        matrix[self.size:new_size] = normalize(np.frombuffer(blob, dtype="<f4").reshape(len(rows), width))
        keys[self.size:new_size] = [row[0] for row in rows]
        confidence[self.size:new_size] = [row[2] for row in rows]
        expires[self.size:new_size] = [_epoch(parse_time(row[3])) for row in rows]
        return VectorMatrix(self.model, new_size, keys, matrix, confidence, expires)


def _grow(array: np.ndarray, used: int, capacity: int, width: int | None = None) -> np.ndarray:
    shape = (capacity,) if array.ndim == 1 else (capacity, width if width is not None else array.shape[1])
    grown = np.zeros(shape, dtype=array.dtype)
    grown[:used] = array[:used]
    return grown


def _epoch(when: datetime | None) -> float:
    return math.inf if when is None else when.timestamp()


def top_k(vm: VectorMatrix, query: np.ndarray, limit: int, floor: float, now: float) -> list[tuple[int, float]]:
    """Indices and cosine scores of the best `limit` live rows scoring at least `floor`,
    ordered by (score, confidence) descending as in spec 002."""
    q = normalize(np.asarray(query, dtype=np.float32))
    scores = _cosines(vm.matrix, q)
    scores = np.where(vm.expires > now, scores, -np.inf)
    candidates = np.flatnonzero(scores >= floor)
    if candidates.size == 0:
        return []
    if candidates.size > limit:
        part = np.argpartition(-scores[candidates], limit - 1)[:limit]
        candidates = candidates[part]
    order = sorted(candidates.tolist(), key=lambda i: (-float(scores[i]), -float(vm.confidence[i]), -int(vm.keys[i])))
    return [(i, float(scores[i])) for i in order]
