"""Vector files beside a SQLite file: big owners' matrices kept in a form that is mapped, not read.

Building a big owner's matrix means reading every vector from SQLite (about a quarter of a second at 100,000 rows),
so the first search by meaning after opening a file was slow. When the SQLiteStore builds a matrix of at least
SAVED_ROWS rows, it writes it to `<file>-vectors/`; the next process maps that file instead, and reads from SQLite
only the rows added since. A file is used at the owner's `generation` (owner_generation: bumped by every
delete, re-embedding, expiry or confidence change) it was written at, or at a later one when the changes between
are ones the store can catch up with (no deletion, no re-embedding: SQLiteStore._caught_up), and only while the
last row it holds is still in the database as it was.

These files hold vectors of memories, so erasure reaches them: forgetting any memory of a tenant removes that
tenant's files (`erase`), under a lock that a writer also takes, and a writer keeps its new file only if the owner's
generation did not move while it wrote. A file is removed, not overwritten: another process may have it mapped,
and keeps reading it until its next search sees the new generation. MEMSHELF_VECTOR_FILES=off keeps no files.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path


from .._vectors import COMPACT_ROWS, VectorMatrix
from ..errors import ConfigError
from ..model import Owner

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock to order writers and erasers, so no files
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("memshelf")

SAVED_ROWS = COMPACT_ROWS
"""An owner's matrix of this many rows or more is written to a file. Smaller ones are read from SQLite in tens of
milliseconds, and a file would only take room."""
FILES_ENV = "MEMSHELF_VECTOR_FILES"


def enabled() -> bool:
    """Whether MEMSHELF_VECTOR_FILES allows the files (on, the default, or off)."""
    raw = os.environ.get(FILES_ENV, "on").strip().lower()
    if raw not in ("on", "off", "1", "0", "true", "false", "yes", "no", ""):
        raise ConfigError(f"{FILES_ENV} must be on or off, got {raw!r}: off keeps no vector files beside the "
                          "SQLite file (the first search by meaning after opening it then reads every vector)")
    return raw in ("on", "1", "true", "yes", "") and fcntl is not None


def _hash(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:20]


class VectorFiles:
    """The folder of one SQLite file's vector files: one file per (owner, model), named by hashes so the folder
    lists no tenant, user or model names."""

    def __init__(self, database: Path) -> None:
        self.folder = database.with_name(database.name + "-vectors")
        self._writers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def path(self, owner: Owner, model: str) -> Path:
        return self.folder / f"{_hash(owner.tenant)}-{_hash(owner.tenant, owner.user, model)}.vec"

    def load(self, owner: Owner, model: str, generation: int,
             current: Callable[[VectorMatrix, int], VectorMatrix | None]) -> VectorMatrix | None:
        """The owner's saved matrix as `current(matrix, the generation it was written at)` makes it usable at
        `generation` (None: not usable); a file written later than `generation`, or stale, or unreadable, is
        removed."""
        path = self.path(owner, model)
        if not path.exists():
            return None
        try:
            matrix, header = VectorMatrix.mapped(path)
            written_at = header.get("generation")
            if not isinstance(written_at, int):
                raise ValueError("no generation in its header")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the vector file %s (%s); it will be written again", path, exc)
            self._remove(path)
            return None
        usable = None
        if written_at <= generation and matrix.model == model and matrix.size:
            usable = current(matrix, written_at)
        if usable is None:
            self._remove(path)
        return usable

    def save_soon(self, owner: Owner, model: str, generation: int, matrix: VectorMatrix,
                  current_generation: Callable[[], int]) -> None:
        """`save` on a thread of its own, so the search that built the matrix does not wait for the disk."""
        if matrix.size < SAVED_ROWS:
            return
        writer = threading.Thread(target=self.save, args=(owner, model, generation, matrix, current_generation),
                                  name="memshelf-vector-file")
        with self._lock:
            self._writers = [w for w in self._writers if w.is_alive()] + [writer]
        writer.start()

    def wait(self) -> None:
        """Until every file being written is in place (or given up)."""
        with self._lock:
            writers = list(self._writers)
        for writer in writers:
            writer.join()

    def save(self, owner: Owner, model: str, generation: int, matrix: VectorMatrix,
             current_generation: Callable[[], int]) -> None:
        """Write `matrix` (built at `generation`) for the owner, and keep it only if `current_generation()` still
        says `generation` once it is written: otherwise something was deleted meanwhile, and an eraser may already
        have passed."""
        if matrix.size < SAVED_ROWS:
            return
        temporary: Path | None = None
        try:
            self.folder.mkdir(exist_ok=True)
            final = self.path(owner, model)
            with tempfile.NamedTemporaryFile(dir=self.folder, prefix=final.name + ".", delete=False) as handle:
                pass  # named after the file it becomes, so that erasing the tenant's files takes it too
            temporary = Path(handle.name)
            matrix.save(temporary, {"generation": generation})
            with self._locked():
                if current_generation() == generation:
                    os.replace(temporary, final)
                    return
        except Exception as exc:  # on a thread of its own: nothing above it would log what went wrong
            log.warning("could not write a vector file in %s (%s): the first search by meaning after opening the "
                        "file will read every vector; make the folder writable or set %s=off", self.folder, exc,
                        FILES_ENV)
        if temporary is not None:
            self._remove(temporary)

    def erase(self, tenants: set[str] | None) -> None:
        """Remove the files of these tenants' owners (None: every file)."""
        if not self.folder.is_dir():
            return
        prefixes = tuple(f"{_hash(t)}-" for t in tenants) if tenants is not None else ("",)
        with self._locked():
            for path in self.folder.iterdir():
                if path.name != ".lock" and path.name.startswith(prefixes):
                    self._remove(path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Held by a writer between checking the generation and putting its file in place, and by an eraser: so an
        eraser never misses a file written from rows it deleted."""
        self.folder.mkdir(exist_ok=True)
        with open(self.folder / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove the vector file %s (%s): delete it by hand", path, exc)
