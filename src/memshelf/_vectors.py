"""Exact vector search in process: one normalized float32 matrix per (owner, model), scanned with numpy, and beside
it an int8 copy that a SIMD kernel (simsimd) scans first when it is installed.

The int8 scan reads a quarter of the bytes. Each row is scaled so its largest component is 127 and rounded, so
every score it gives is within a known bound (`VectorMatrix.slack` plus the question's own rounding) of the exact
one. Only the rows whose score could still reach the top `limit` within that bound are scored again in float32, so
the result is the float32 scan's: the same memories, the same scores, in the same order."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from .errors import ConfigError, DimensionMismatch

try:
    import simsimd as _kernel
except ImportError:  # no wheel for this platform: the float32 scan alone, exact all the same
    _kernel = None  # type: ignore[assignment]


PARALLEL_ROWS = 32_768
"""From this many rows a scan is split across the cores: it is memory-bound, and one core cannot use all of the
bandwidth (100k x 384 on 2 cores: 10 ms on one, 5 ms split). Below it, waking a second thread costs more than it
saves."""
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _scan_pool(workers: int) -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(workers - 1, thread_name_prefix="memshelf-scan")
        return _pool


def _cosines(matrix: np.ndarray, q: np.ndarray) -> np.ndarray:
    """matrix @ q, in slices on our own threads for big matrices. Our threads (unlike BLAS's spinning ones) simply
    queue when the machine is busy, so a split scan is never much slower than one."""
    rows, workers = matrix.shape[0], min(os.cpu_count() or 1, 4)
    if rows < PARALLEL_ROWS or workers < 2:
        return _dots(matrix, q)
    pool = _scan_pool(workers)
    out = np.empty(rows, dtype=np.float32)
    bounds = np.linspace(0, rows, workers + 1).astype(int).tolist()
    slices = list(zip(bounds[:-1], bounds[1:]))
    futures = [pool.submit(_dots, matrix[a:b], q, out[a:b]) for a, b in slices[1:]]
    _dots(matrix[slices[0][0]:slices[0][1]], q, out[slices[0][0]:slices[0][1]])
    for future in futures:
        future.result()
    return out


COMPACT_ROWS = 8_192
"""From this many rows a matrix keeps an int8 copy, and a search scans it first. Below it the float32 scan costs a
few hundred microseconds, the second pass would eat what the first saves, and the copy would only take memory."""
ROUNDING = 1e-4
"""Added to the int8 bound for float32's own rounding: a 384-term float32 dot product is off by at most about
2e-5, and the scaled int8 scores by less."""


def _quantized(rows: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, float]:
    """Each row of unit vectors as int8 (largest component to 127) into `out`, and the scale back to the row's
    units: x is about out * scale. Also the largest rounding error of any row, ||x - out * scale||: each component
    is off by at most scale / 2."""
    peaks = np.maximum(rows.max(axis=1), -rows.min(axis=1))  # no |rows| temporary: a sixth faster
    inverse = np.divide(127.0, peaks, out=np.zeros_like(peaks), where=peaks > 0)
    np.rint(rows * inverse[:, None], out=out, casting="unsafe")
    error = float(peaks.max(initial=0.0)) / 254.0 * math.sqrt(rows.shape[1])
    return (peaks / 127.0).astype(np.float32), error


def _dots(matrix: np.ndarray, q: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Each row's dot product with q, on the calling thread. A single query is memory-bound, and BLAS's matrix-vector
    product would wake its own threads, which stall for milliseconds on a busy machine (DESIGN.md); its thread count
    can only be limited for the whole process, under every other thread's feet. vecdot runs one short dot product
    per row, which BLAS never splits across threads, at the speed of a one-thread matrix-vector product from 10,000
    rows up (BENCHMARKS.md)."""
    return np.vecdot(matrix, q, out=out)


def pack(vector: Sequence[float] | np.ndarray) -> bytes:
    """Little-endian float32 bytes, the on-disk form of every vector."""
    return np.asarray(vector, dtype="<f4").tobytes()


def unpack(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4")


def normalize(matrix: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Rows scaled to unit length as float32 (a zero row stays zero), into `out` when given."""
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    if out is None:
        return (matrix / norms).astype(np.float32, copy=False)
    return np.divide(matrix, norms, out=out, casting="same_kind")


WRITE_CHUNK = 4_096
"""Rows copied into a matrix at a time (6 MB of 384-d vectors)."""

GROWTH = 4
"""An append that does not fit copies the rows into buffers a quarter (1/GROWTH) bigger than needed: each row is
copied a bounded number of times over a run of appends, and spare room stays under a quarter of the matrix."""


@dataclass(frozen=True)
class VectorMatrix:
    """An owner's vectors of one model. A built matrix is exactly its rows; appended rows go into spare room when
    there is some, so appending copies only the new rows; `extended` returns a new view and never changes what a
    reader already holds. Rows are in key order, and a memory embedded in pieces has one row per piece, under its
    key, one after the other (`repeats` counts the rows that repeat the key before them)."""

    model: str
    size: int
    _keys: np.ndarray        # int64 backend keys (capacity-long)
    _matrix: np.ndarray      # (capacity, d) float32, rows normalized
    _confidence: np.ndarray  # float32
    _expires: np.ndarray     # float64 epoch seconds, inf when the row never expires
    repeats: int = 0
    _compact: np.ndarray | None = None  # (capacity, d) int8: each row rounded, largest component 127
    _scales: np.ndarray | None = None   # float32: a compact row times its scale is about the row
    slack: float = 0.0
    """How far any compact row is from its row (the largest ||row - compact * scale||)."""

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
    def compact(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The int8 rows and their scales, when the kernel that scans them is installed."""
        if self._compact is None or self._scales is None:
            return None
        return self._compact[:self.size], self._scales[:self.size]

    @property
    def dimensions(self) -> int:
        return int(self._matrix.shape[1])

    @property
    def capacity(self) -> int:
        return int(self._keys.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers, spare room included."""
        return sum(a.nbytes for a in self._arrays())

    def _arrays(self) -> tuple[np.ndarray, ...]:
        compact = () if self._compact is None or self._scales is None else (self._compact, self._scales)
        return (self._keys, self._matrix, self._confidence, self._expires, *compact)

    @property
    def last_key(self) -> int:
        return int(self._keys[self.size - 1]) if self.size else -1

    @classmethod
    def build(cls, model: str, rows: Sequence[Sequence], parse_time: Callable[[Any], datetime | None],
              compact: bool = True) -> VectorMatrix:
        """rows: (key, blob, confidence, expires_at) as the backend stores them, in key order. compact=False: no
        int8 copy (a matrix scanned once would spend more on making it than the copy saves)."""
        width = len(rows[0][1]) // 4 if rows else 0
        keep = compact and _kernel is not None and len(rows) >= COMPACT_ROWS
        rows8, scales = _compact_buffers(len(rows), width) if keep else (None, None)
        return cls(model, 0, *_buffers(len(rows), width), _compact=rows8, _scales=scales)._written(rows, parse_time)

    def extended(self, rows: Sequence[Sequence], parse_time: Callable[[Any], datetime | None]) -> VectorMatrix:
        """This matrix plus `rows` (keys above last_key)."""
        if not rows:
            return self
        if self.size == 0:  # nothing to keep, and an empty matrix does not know the width yet
            return VectorMatrix.build(self.model, rows, parse_time)
        needed = self.size + len(rows)
        crossing = self._compact is None and _kernel is not None and needed >= COMPACT_ROWS
        if needed <= self.capacity and not crossing:
            return self._written(rows, parse_time)
        capacity = max(self.capacity, needed + needed // GROWTH)
        keep = self._compact is not None or crossing
        compact, scales = _compact_buffers(capacity, self.dimensions) if keep else (None, None)
        grown = VectorMatrix(self.model, self.size, *_buffers(capacity, self.dimensions), self.repeats, compact,
                             scales, self.slack)
        for old, new in zip(self._arrays(), grown._arrays()):
            new[:self.size] = old[:self.size]
        if crossing and compact is not None and scales is not None:  # the rows so far get their int8 copy now
            slack = grown.slack
            for start in range(0, self.size, WRITE_CHUNK):
                end = min(self.size, start + WRITE_CHUNK)
                scales[start:end], error = _quantized(grown._matrix[start:end], compact[start:end])
                slack = max(slack, error)
            grown = dataclasses.replace(grown, slack=slack)
        return grown._written(rows, parse_time)

    def _written(self, rows: Sequence[Sequence], parse_time: Callable[[Any], datetime | None]) -> VectorMatrix:
        """`rows` written into the spare room after this matrix's rows (there must be enough). The vectors are
        copied and normalized WRITE_CHUNK rows at a time: joining all the blobs first, then normalizing through a
        temporary as big as the matrix, allocated (and page-faulted) two more copies of it."""
        width, end = self.dimensions, self.size + len(rows)
        slack = self.slack
        for start in range(0, len(rows), WRITE_CHUNK):
            chunk = rows[start:start + WRITE_CHUNK]
            joined = b"".join(row[1] for row in chunk)
            if len(joined) != len(chunk) * width * 4:
                other = next(len(row[1]) // 4 for row in chunk if len(row[1]) != width * 4)
                raise DimensionMismatch(
                    f"stored vectors stamped {self.model} have {width} and {other} dimensions: one model name was "
                    "used for two models; re-embed with `memshelf backfill` under a distinct model name")
            at = self.size + start
            written = normalize(np.frombuffer(joined, dtype="<f4").reshape(len(chunk), width),
                                out=self._matrix[at:at + len(chunk)])
            if self._compact is not None and self._scales is not None:
                self._scales[at:at + len(chunk)], error = _quantized(written, self._compact[at:at + len(chunk)])
                slack = max(slack, error)
        self._keys[self.size:end] = [row[0] for row in rows]
        self._confidence[self.size:end] = [row[2] for row in rows]
        self._expires[self.size:end] = [_epoch(parse_time(row[3])) for row in rows]
        keys = self._keys[self.size:end]
        before = np.concatenate(([self.last_key], keys[:-1]))
        repeats = self.repeats + int(np.count_nonzero(keys == before))
        return VectorMatrix(self.model, end, self._keys, self._matrix, self._confidence, self._expires, repeats,
                            self._compact, self._scales, slack)

    @property
    def writable(self) -> bool:
        """Whether the vectors are in memory (a mapped file's are read-only)."""
        return bool(self._matrix.flags.writeable)

    @property
    def dropped(self) -> int:
        """Rows `patched` took out of every search."""
        return int(np.count_nonzero(self.expires == -math.inf))

    def patched(self, states: Sequence[Sequence], gone: Sequence[int],
                parse_time: Callable[[Any], datetime | None]) -> VectorMatrix:
        """This matrix with some memories changed in place of a rebuild. states: (key, confidence, expires_at) as
        the backend stores them, given to every live row (piece) of the key; gone: keys whose rows leave every
        search for good, their vectors zeroed (the buffers must be `writable`). Keys the matrix does not hold are
        skipped. The confidences and expiry times are copied first, so a reader holding this matrix keeps seeing
        them as they were; only a gone row's vector changes under it, and a reader's answer is read back from the
        database, where that row no longer is.

        Gone rows at the end are cut off, so that `last_key` is a live row's: the backend may give a deleted
        memory's key to the next new one (SQLite takes the largest key plus one), which `extended` then appends
        in key order. The cut matrix has no spare room: the rows cut stay out of the next append's way."""
        confidence, expires = self._confidence.copy(), self._expires.copy()
        keys = self.keys

        def rows(key: int) -> slice:
            return slice(int(np.searchsorted(keys, key, "left")), int(np.searchsorted(keys, key, "right")))

        for key, level, until in states:
            at = rows(key)
            live = expires[at] != -math.inf  # a gone row stays gone
            confidence[at] = np.where(live, level, confidence[at])
            expires[at] = np.where(live, _epoch(parse_time(until)), -math.inf)
        for key in gone:
            at = rows(key)
            expires[at] = -math.inf
            self._matrix[at] = 0.0
            if self._compact is not None and self._scales is not None:
                self._compact[at], self._scales[at] = 0, 0.0
        size = self.size
        while size and expires[size - 1] == -math.inf:
            size -= 1
        if size == self.size:
            return dataclasses.replace(self, _confidence=confidence, _expires=expires)
        kept = self.keys[:size]
        return dataclasses.replace(
            self, size=size, _keys=kept, _matrix=self._matrix[:size], _confidence=confidence[:size],
            _expires=expires[:size], _compact=None if self._compact is None else self._compact[:size],
            _scales=None if self._scales is None else self._scales[:size],
            repeats=int(np.count_nonzero(kept[1:] == kept[:-1])))

    def save(self, path: Path, stamp: dict[str, Any]) -> None:
        """Write the rows to `path` as `mapped` reads them back: numpy arrays one after the other, the first a JSON
        header (the model, `repeats`, `slack`, a format version, and `stamp`, which the caller checks on reading)."""
        header = {"version": SAVED_VERSION, "model": self.model, "repeats": self.repeats, "slack": self.slack, **stamp}
        arrays = [np.frombuffer(json.dumps(header).encode(), np.uint8), self.keys, self.matrix, self.confidence,
                  self.expires, *(self.compact or ())]
        with open(path, "wb") as handle:
            for array in arrays:
                np.lib.format.write_array(handle, np.ascontiguousarray(array), allow_pickle=False)

    @classmethod
    def mapped(cls, path: Path) -> tuple[VectorMatrix, dict[str, Any]]:
        """A matrix written by `save`, its buffers mapped from the file rather than read (pages come in as a scan
        touches them), and the header. It has no spare room: appending copies it into memory. ValueError or
        OSError when the file is not one `save` wrote whole."""
        arrays = _mapped_arrays(path)
        header = json.loads(bytes(arrays[0]))
        if header.get("version") != SAVED_VERSION or len(arrays) not in (5, 7):
            raise ValueError(f"{path} is not a vector file of version {SAVED_VERSION}")
        keys, matrix, confidence, expires, *compact = arrays[1:]
        size = len(keys)
        if matrix.ndim != 2 or any(len(a) != size for a in (matrix, confidence, expires, *compact)):
            raise ValueError(f"{path} holds arrays of different lengths")
        rows8, scales = compact if compact else (None, None)
        return cls(header["model"], size, keys, matrix, confidence, expires, header["repeats"], rows8, scales,
                   header["slack"]), header


SAVED_VERSION = 1
"""The layout `VectorMatrix.save` writes; a file of another version is not read."""


def _mapped_arrays(path: Path) -> list[np.ndarray]:
    """The .npy arrays stored one after the other in `path`, each mapped read-only (an empty one in memory)."""
    arrays: list[np.ndarray] = []
    with open(path, "rb") as handle:
        end = os.fstat(handle.fileno()).st_size
        while handle.tell() < end:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(handle)
            if fortran or dtype.hasobject:
                raise ValueError(f"{path} holds an array memshelf did not write")
            offset = handle.tell()
            nbytes = math.prod(shape) * dtype.itemsize
            if offset + nbytes > end:
                raise ValueError(f"{path} is cut short")
            # Mapped through the handle the headers were read from: by its path, a file replaced in between (another
            # process saving the owner's vectors anew) was mapped at the old file's offsets.
            arrays.append(np.memmap(handle, dtype, "r", offset, shape) if nbytes else np.empty(shape, dtype))
            handle.seek(offset + nbytes)
    return arrays


def _buffers(capacity: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Zeroed keys, matrix, confidence and expiry buffers (zeroed pages cost no memory until written)."""
    return (np.zeros(capacity, np.int64), np.zeros((capacity, width), np.float32), np.zeros(capacity, np.float32),
            np.zeros(capacity, np.float64))


def _compact_buffers(capacity: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Zeroed int8 rows and their scales."""
    return np.zeros((capacity, width), np.int8), np.zeros(capacity, np.float32)


def _epoch(when: datetime | None) -> float:
    return math.inf if when is None else when.timestamp()


def top_k(vm: VectorMatrix, query: np.ndarray, limit: int, floor: float, now: float) -> list[tuple[int, float]]:
    """Indices and cosine scores of the best `limit` live memories scoring at least `floor`, ordered by (score,
    confidence) descending as in spec 002. A memory in pieces scores as its best piece, at the index of its first."""
    q = normalize(np.asarray(query, dtype=np.float32))
    compact = vm.compact if _kernel is not None and vm.size >= COMPACT_ROWS else None
    if compact is None:
        scores, slack = _cosines(vm.matrix, q), 0.0
    else:
        scores, slack = _approximate(compact, vm.slack, q)
    scores = np.where(vm.expires > now, scores, -np.inf)
    firsts: np.ndarray | None = None
    if vm.repeats:
        keys = vm.keys
        firsts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        scores = np.maximum.reduceat(scores, firsts)
    candidates = np.flatnonzero(scores >= floor - slack)
    if slack and candidates.size:
        # Keep what could still be in the top `limit`: a memory whose score plus the bound is below the limit-th
        # best minus the bound is beaten by `limit` others whatever the exact scores are. Then score exactly.
        if candidates.size > limit:
            kth = np.partition(scores[candidates], candidates.size - limit)[candidates.size - limit]
            candidates = candidates[scores[candidates] >= kth - 2 * slack]
        found = _exact(vm, q, candidates, firsts, now)
        candidates, found = candidates[found >= floor], found[found >= floor]
    else:
        found = scores[candidates]
    if candidates.size == 0:
        return []
    if candidates.size > limit:  # the limit-th best score, and every memory tied with it: the order below decides
        kth = np.partition(found, found.size - limit)[found.size - limit]
        candidates, found = candidates[found >= kth], found[found >= kth]
    rows = candidates if firsts is None else firsts[candidates]
    order = sorted(zip(rows.tolist(), found.tolist()),
                   key=lambda pick: (-pick[1], -float(vm.confidence[pick[0]]), -int(vm.keys[pick[0]])))
    return [(i, float(score)) for i, score in order[:limit]]


def _approximate(compact: tuple[np.ndarray, np.ndarray], slack: float, q: np.ndarray) -> tuple[np.ndarray, float]:
    """Every row's score from the int8 rows, and how far from the exact score any of them can be: for a row x,
    its int8 form x' and the question's q', |q.x - q'.x'| <= |x - x'| + |q - q'| |x'|, and |x'| <= 1 + |x - x'|."""
    rows, scales = compact
    q8 = np.empty((1, q.shape[0]), np.int8)
    q_scales, q_error = _quantized(q[None, :], q8)
    # One thread: simsimd's own threads are OpenMP's, which spin after each scan and stall when a core is busy
    # (the reason the float32 scan splits on memshelf's own threads); and it holds the GIL, so memshelf's threads
    # cannot split it. At 100k rows one thread scans the int8 copy in about 1.4 ms. Int8 dot products are exact in
    # float32 up to 2^24. Never `out=`: simsimd 6.5 then returns None without a reference of its own, so every scan
    # took one from None, and on Python 3.11 the process died once None had none left ("none_dealloc").
    dots = np.asarray(_kernel.cdist(q8, rows, metric="dot", out_dtype="float32"))
    scores = dots[0] * scales * q_scales[0]
    return scores, slack + q_error * (1 + slack) + ROUNDING


def _exact(vm: VectorMatrix, q: np.ndarray, picked: np.ndarray, firsts: np.ndarray | None, now: float
           ) -> np.ndarray:
    """The float32 scores of the picked live memories (rows, or groups of pieces starting at `firsts`), computed
    exactly as the plain scan computes them."""
    if firsts is None:
        return _dots(vm.matrix[picked], q)
    starts = firsts[picked]
    ends = np.append(firsts, vm.size)[picked + 1]
    lengths = ends - starts
    offsets = np.cumsum(lengths) - lengths
    rows = np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))
    scores = np.where(vm.expires[rows] > now, _dots(vm.matrix[rows], q), -np.inf)
    return np.maximum.reduceat(scores, offsets)


CACHE_ENV = "MEMSHELF_VECTOR_CACHE_MB"
CACHE_MB_DEFAULT = 1024
"""Room for about 690,000 vectors of 384 dimensions (or 170,000 of 1,536) across all owners of one store; about
550,000 (140,000) where owners are big enough for int8 copies (COMPACT_ROWS)."""
ENTRY_OVERHEAD = 1024
"""Bytes an entry costs besides its buffers (its key, the entry and four array headers), so that many owners with
few or no vectors count against the bound too."""

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


def cache_limit_bytes(megabytes: float | None = None) -> int:
    """The vector cache's bound: `megabytes` when given, else MEMSHELF_VECTOR_CACHE_MB, else the default."""
    name, raw = ("vector_cache_mb", str(megabytes)) if megabytes is not None else (CACHE_ENV, os.environ.get(CACHE_ENV))
    try:
        value = float(raw) if raw is not None and raw.strip() else float(CACHE_MB_DEFAULT)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise ConfigError(f"{name} must be a number of megabytes, 0 or more, such as {CACHE_MB_DEFAULT} (0 keeps no "
                          f"vectors in memory between searches), got {raw!r}")
    return int(value * 1_000_000)


class VectorCache(Generic[Key, Value]):
    """Values kept between searches, bounded by bytes: the least recently used go first. A value bigger than the
    whole bound is not kept (its owner's vectors are read from the database at every search). Thread safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Key, tuple[Value, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes counted against the bound: every kept value's buffers plus ENTRY_OVERHEAD each."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Value | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Key, value: Value, nbytes: int) -> bool:
        """Keep `value` (whose buffers hold `nbytes`), evicting the least recently used; False if it cannot fit."""
        cost = nbytes + ENTRY_OVERHEAD
        with self._lock:
            self._drop(key)
            if cost > self.max_bytes:
                return False
            self._entries[key] = (value, cost)
            self._bytes += cost
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
            return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _drop(self, key: Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry[1]
