"""The in-process vector search of the SQLite store: the cached matrices (their growth, their byte bound, eviction)
and concurrent searches, plus the assistant's first loop (recall on an empty memory, remember, recall) by meaning
on both backends."""

from __future__ import annotations

import os
import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np
import pytest
from fakes import HashEmbedder
from test_server import LiveServer, bearer
from threadpoolctl import threadpool_info

from memshelf import ConfigError, DimensionMismatch, Owner, Shelf
from memshelf.server import create_app
from memshelf.stores.sqlite import SQLiteStore, ts
from memshelf import _vectors
from memshelf._vectors import CACHE_ENV, ENTRY_OVERHEAD, GROWTH, WRITE_CHUNK, VectorMatrix, pack, top_k

KALEB = Owner("home", "kaleb")
MAYA = Owner("home", "maya")
PRINTER = "The office printer is on 192.168.1.40."


def contents(hits):
    return [h.memory.content for h in hits]


def cache(shelf):
    return shelf.store._vectors


# ---------------------------------------------------------------- the first loop, by meaning
@pytest.mark.slow
def test_recall_on_an_empty_memory_then_remember_then_recall(open_shelf, local_embedder):
    shelf = open_shelf(embedder=local_embedder)
    assert shelf.search(KALEB, "where is the printer?") == []
    assert shelf.search(KALEB, "where is the printer?", mode="semantic") == []
    shelf.remember(KALEB, "network", PRINTER)
    for mode in ("semantic", "hybrid"):
        assert contents(shelf.search(KALEB, "which address does the printer have", mode=mode)) == [PRINTER]
    assert "192.168.1.40" in shelf.context(KALEB, "printer address")
    assert "192.168.1.40" in shelf.build_prompt("You are helpful.", KALEB, "where is the printer")
    shelf.remember(KALEB, "home", "The coffee maker starts at 07:00.")
    assert contents(shelf.search(KALEB, "when does the coffee start", mode="semantic", limit=1)) == [
        "The coffee maker starts at 07:00."]


@pytest.mark.slow
def test_forget_everything_then_remember_then_recall(open_shelf, local_embedder):
    shelf = open_shelf(embedder=local_embedder)
    first = shelf.remember(KALEB, "network", PRINTER)
    assert contents(shelf.search(KALEB, "printer", mode="semantic")) == [PRINTER]
    shelf.forget(KALEB, first.id)
    assert shelf.search(KALEB, "printer", mode="semantic") == []
    shelf.remember(KALEB, "network", "The printer moved to 10.0.0.7.")
    assert contents(shelf.search(KALEB, "printer", mode="semantic")) == ["The printer moved to 10.0.0.7."]
    shelf.forget_user(KALEB)
    assert shelf.search(KALEB, "printer", mode="semantic") == []
    shelf.remember(KALEB, "network", PRINTER)
    assert contents(shelf.search(KALEB, "printer", mode="semantic")) == [PRINTER]


@pytest.mark.slow
def test_empty_owners_and_models_each_fill_on_their_own(open_shelf, local_embedder):
    real = open_shelf(embedder=local_embedder)
    hashed = open_shelf(embedder=HashEmbedder())  # another model on the same database
    for shelf in (real, hashed):
        for owner in (KALEB, MAYA):
            assert shelf.search(owner, "printer", mode="semantic") == []
    real.remember(KALEB, "network", PRINTER)
    assert hashed.search(KALEB, "printer", mode="semantic") == []  # the other model's vectors are never compared
    hashed.remember(MAYA, "network", "Maya's printer is in the hall.")
    hashed.remember(KALEB, "home", "The printer in the office is new.")
    assert contents(real.search(KALEB, "printer address", mode="semantic")) == [PRINTER]
    assert contents(real.search(MAYA, "printer", mode="semantic")) == []
    assert contents(hashed.search(KALEB, "printer office", mode="semantic")) == ["The printer in the office is new."]
    assert contents(hashed.search(MAYA, "printer hall", mode="semantic")) == ["Maya's printer is in the hall."]


@pytest.mark.slow
def test_first_loop_over_http(tmp_path, local_embedder):
    db = tmp_path / "memshelf.db"
    with Shelf.open(db, embedder=local_embedder) as shelf:
        secret = shelf.create_key("acme")[1]
        with LiveServer(create_app(shelf)) as live, \
                httpx.Client(base_url=live.url, headers=bearer(secret), timeout=30) as client:
            question = {"question": "where is the printer?", "mode": "semantic"}
            assert client.post("/v1/users/bob/search", json=question).json()["hits"] == []
            assert client.post("/v1/users/bob/memories", json={"topic": "network", "content": PRINTER}).is_success
            for _ in range(2):
                found = client.post("/v1/users/bob/search", json=question)
                assert found.status_code == 200
                assert [h["memory"]["content"] for h in found.json()["hits"]] == [PRINTER]
            assert "192.168.1.40" in client.post("/v1/users/bob/context", json={"question": "printer"}).json()[
                "context"]


# ---------------------------------------------------------------- matrix growth
def rows_of(vectors: np.ndarray, first_key: int = 1) -> list[tuple]:
    return [(first_key + i, pack(v), 1.0, None) for i, v in enumerate(vectors)]


def no_time(value):
    return None


def test_a_built_matrix_is_exactly_its_rows_and_an_empty_one_grows_to_any_width():
    rng = np.random.default_rng(1)
    one = VectorMatrix.build("m", rows_of(rng.standard_normal((1, 384))), no_time)
    assert (one.capacity, one.nbytes) == (1, 384 * 4 + 8 + 4 + 8)  # no int8 copy below COMPACT_ROWS
    empty = VectorMatrix.build("m", [], no_time)
    grown = empty.extended(rows_of(rng.standard_normal((3, 384))), no_time)
    assert (grown.size, grown.dimensions, grown.capacity) == (3, 384, 3)
    assert np.allclose(np.linalg.norm(grown.matrix, axis=1), 1.0)


def test_a_matrix_built_in_chunks_is_its_rows_and_refuses_a_second_width_in_any_chunk():
    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((2 * WRITE_CHUNK + 7, 16)).astype(np.float32)
    built = VectorMatrix.build("m", rows_of(vectors), no_time)
    expected = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert built.size == len(vectors) and np.array_equal(built.keys, np.arange(1, len(vectors) + 1))
    assert np.allclose(built.matrix, expected, atol=1e-6)
    rows = rows_of(vectors)
    rows[WRITE_CHUNK + 3] = (rows[WRITE_CHUNK + 3][0], pack(rng.standard_normal(8)), 1.0, None)
    with pytest.raises(DimensionMismatch, match="have 16 and 8 dimensions"):
        VectorMatrix.build("m", rows, no_time)


def test_appends_copy_each_row_a_bounded_number_of_times_and_leave_bounded_room():
    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((2000, 16)).astype(np.float32)
    matrix = VectorMatrix.build("m", rows_of(vectors[:1]), no_time)
    reallocations = 0
    for i in range(1, len(vectors)):
        before = matrix._matrix
        older = matrix
        matrix = matrix.extended(rows_of(vectors[i:i + 1], first_key=i + 1), no_time)
        reallocations += matrix._matrix is not before
        assert matrix.capacity <= matrix.size + matrix.size // GROWTH
        assert older.size == i and older.last_key == i  # what a reader holds never changes
    assert reallocations < 40
    assert np.array_equal(matrix.keys, np.arange(1, 2001))
    assert np.allclose(matrix.matrix, vectors / np.linalg.norm(vectors, axis=1, keepdims=True), atol=1e-6)


# ---------------------------------------------------------------- the byte-bounded cache
def shelf_with_owners(path, owners: int, per_owner: int, **options) -> tuple[Shelf, list[Owner]]:
    shelf = Shelf.open(path, embedder=HashEmbedder(), **options)
    people = [Owner("t", f"user{i}") for i in range(owners)]
    for owner in people:
        shelf.remember_many(owner, [{"topic": "note", "content": f"{owner.user} note {j} about item{j}"}
                                    for j in range(per_owner)])
    return shelf, people


def own_answers(shelf: Shelf, people: list[Owner]) -> list[list[str]]:
    return [contents(shelf.search(owner, f"{owner.user} note 3 about item3", mode="semantic", limit=3))
            for owner in people]


def test_the_cache_stays_under_its_bound_and_evicted_owners_are_rebuilt(tmp_path, monkeypatch):
    path = tmp_path / "many.db"
    roomy, people = shelf_with_owners(path, owners=300, per_owner=5)
    expected = own_answers(roomy, people)
    assert all(answer[0] == f"{owner.user} note 3 about item3" for owner, answer in zip(people, expected))
    roomy.close()

    monkeypatch.setenv(CACHE_ENV, "0.1")
    tight = Shelf.open(path, embedder=HashEmbedder())
    assert cache(tight).max_bytes == 100_000
    for _ in range(2):  # the second pass searches owners evicted during the first
        assert own_answers(tight, people) == expected
        assert 0 < cache(tight).nbytes <= 100_000
        assert len(cache(tight)) < len(people)
    entry = 5 * (64 * 4 + 8 + 4 + 8) + ENTRY_OVERHEAD
    assert len(cache(tight)) == 100_000 // entry  # full, with the most recently searched owners
    tight.remember(people[0], "note", "user0 a sixth note")  # an append to an evicted owner
    assert own_answers(tight, people[:1]) == expected[:1]
    tight.close()


def test_a_cache_of_zero_keeps_nothing_and_still_finds_everything(tmp_path, caplog):
    shelf, people = shelf_with_owners(tmp_path / "zero.db", owners=3, per_owner=5, )
    expected = own_answers(shelf, people)
    shelf.close()
    store = SQLiteStore(str(tmp_path / "zero.db"), vector_cache_mb=0)
    shelf = Shelf(store, embedder=HashEmbedder())
    with caplog.at_level("WARNING", logger="memshelf"):
        assert own_answers(shelf, people) == own_answers(shelf, people) == expected
    assert len(cache(shelf)) == 0 and cache(shelf).nbytes == 0
    assert sum(CACHE_ENV in r.getMessage() for r in caplog.records) == 1  # said once, with what to change
    shelf.close()


def test_the_cache_bound_is_read_from_the_environment_when_the_store_opens(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    with Shelf.open(tmp_path / "a.db", embedder=None) as shelf:
        assert cache(shelf).max_bytes == 1024 * 1_000_000
    monkeypatch.setenv(CACHE_ENV, " 64 ")
    with Shelf.open(tmp_path / "b.db", embedder=None) as shelf:
        monkeypatch.setenv(CACHE_ENV, "8")  # too late for this store
        assert cache(shelf).max_bytes == 64 * 1_000_000
    assert SQLiteStore(str(tmp_path / "c.db"), vector_cache_mb=2.5)._vectors.max_bytes == 2_500_000


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "1e400", "64MB"])
def test_a_bad_cache_bound_is_a_config_error_that_says_what_to_write(tmp_path, monkeypatch, value):
    monkeypatch.setenv(CACHE_ENV, value)
    with pytest.raises(ConfigError, match=f"{CACHE_ENV} must be a number of megabytes, 0 or more, such as 1024"):
        Shelf.open(tmp_path / "bad.db", embedder=None)
    assert not (tmp_path / "bad.db").exists()  # refused before anything is written
    with pytest.raises(ConfigError, match="vector_cache_mb must be a number"):
        SQLiteStore(str(tmp_path / "bad.db"), vector_cache_mb=-5)


# ---------------------------------------------------------------- concurrency
def blas_threads() -> set[int]:
    return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


def test_searches_leave_the_process_blas_threads_alone():
    """The BLAS thread count is process-wide: a search that changed it would change it under every other thread,
    and one search finishing would undo it under another still scanning."""
    from memshelf._vectors import top_k

    rng = np.random.default_rng(5)
    matrix = VectorMatrix.build("m", rows_of(rng.standard_normal((20_000, 64))), no_time)
    stop = threading.Event()

    def search() -> None:
        while not stop.is_set():
            top_k(matrix, rng.standard_normal(64).astype(np.float32), 10, 0.0, 0.0)

    before = blas_threads()  # the library's default: as many threads as cores
    workers = [threading.Thread(target=search) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        samples = [blas_threads() for _ in range(60)]
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert all(sample == before for sample in samples)


def test_concurrent_searches_give_the_serial_answers(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "0.05")  # small enough that threads evict and rebuild under each other
    shelf, people = shelf_with_owners(tmp_path / "busy.db", owners=40, per_owner=8)
    questions = [(owner, f"{owner.user} note {j} about item{j}") for owner in people for j in range(0, 8, 3)]

    def answer(job: tuple[Owner, str]) -> list[tuple[str, float]]:
        return [(h.memory.content, h.score) for h in shelf.search(job[0], job[1], mode="semantic", limit=4)]

    serial = [answer(job) for job in questions]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(3):
            assert list(pool.map(answer, questions)) == serial
    shelf.close()


def test_concurrent_split_scans_give_the_serial_answers():
    from memshelf._vectors import PARALLEL_ROWS, top_k

    rng = np.random.default_rng(4)
    matrix = VectorMatrix.build("m", rows_of(rng.standard_normal((PARALLEL_ROWS + 1000, 32))), no_time)
    queries = rng.standard_normal((24, 32)).astype(np.float32)
    serial = [top_k(matrix, q, 10, -1.0, 0.0) for q in queries]
    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(lambda q: top_k(matrix, q, 10, -1.0, 0.0), queries)) == serial


# ---------------------------------------------------------------- the int8 scan
needs_kernel = pytest.mark.skipif(_vectors._kernel is None, reason="simsimd is not installed")


def awkward_rows(rng: np.random.Generator, pieces: bool) -> tuple[list[tuple], np.ndarray]:
    """Rows that make a bounded first pass work: tight clusters (many scores within the int8 bound of each other),
    exact duplicates (ties), a zero vector, expired rows, and with `pieces` memories of several rows."""
    centres = rng.standard_normal((8, 64)).astype(np.float32)
    vectors = centres[rng.integers(0, 8, 3000)] + 0.05 * rng.standard_normal((3000, 64)).astype(np.float32)
    vectors[100:110] = vectors[99]
    vectors[200] = 0.0
    keys = np.arange(1, 3001)
    if pieces:
        keys = np.sort(rng.integers(1, 1200, 3000))
    expires = [None if n % 7 else "expired" for n in range(3000)]
    rows = [(int(k), pack(v), float(n % 3) / 2, e) for n, (k, v, e) in enumerate(zip(keys, vectors, expires))]
    return rows, centres


def expiry(value):
    return None if value is None else datetime(2000, 1, 1, tzinfo=UTC)


@needs_kernel
@pytest.mark.parametrize("pieces", [False, True])
def test_the_int8_scan_finds_exactly_what_the_float32_scan_finds(monkeypatch, pieces):
    monkeypatch.setattr(_vectors, "COMPACT_ROWS", 1)
    rng = np.random.default_rng(5)
    rows, centres = awkward_rows(rng, pieces)
    matrix = VectorMatrix.build("m", rows, expiry)
    assert matrix.compact is not None and 0 < matrix.slack < 0.05
    questions = [*centres, *(centres[:4] + 0.05 * rng.standard_normal((4, 64)).astype(np.float32)),
                 np.frombuffer(rows[99][1], "<f4"), np.zeros(64, np.float32)]
    asked = [(q, limit, floor) for q in questions for limit, floor in ((1, -1.0), (5, 0.0), (10, 0.3), (50, 0.9))]
    compact = [top_k(matrix, q, limit, floor, now=1e9) for q, limit, floor in asked]
    monkeypatch.setattr(_vectors, "_kernel", None)
    plain = [top_k(matrix, q, limit, floor, now=1e9) for q, limit, floor in asked]
    assert compact == plain
    assert sum(len(found) for found in plain) > 300  # the questions found things, ties and expiry among them


@needs_kernel
def test_the_int8_scores_are_within_their_bound_of_the_exact_ones(monkeypatch):
    monkeypatch.setattr(_vectors, "COMPACT_ROWS", 1)
    rng = np.random.default_rng(6)
    vectors = rng.standard_normal((5000, 384)).astype(np.float32) * rng.uniform(0.01, 10, (5000, 1))
    matrix = VectorMatrix.build("m", rows_of(vectors), no_time)
    for _ in range(20):
        q = _vectors.normalize(rng.standard_normal(384).astype(np.float32))
        approximate, bound = _vectors._approximate(matrix.compact, matrix.slack, q)
        exact = matrix.matrix @ q
        assert np.abs(approximate - exact).max() <= bound
        assert bound < 0.05  # tight enough to leave few rows for the second pass


@needs_kernel
def test_the_int8_scan_leaves_none_its_references(monkeypatch):
    """simsimd 6.5's cdist with out= returned None without a reference of its own: each scan took one of None's,
    and on Python 3.11 a process that searched owners of 8,192 memories or more (the int8 copy's threshold) often
    enough died at exit or mid-way with 'none_dealloc'."""
    monkeypatch.setattr(_vectors, "COMPACT_ROWS", 1)
    rng = np.random.default_rng(8)
    matrix = VectorMatrix.build("m", rows_of(rng.standard_normal((50, 16))), no_time)
    q = _vectors.normalize(rng.standard_normal(16).astype(np.float32))
    before = sys.getrefcount(None)
    for _ in range(2000):
        top_k(matrix, q, 5, 0.0, 0.0)
    assert abs(sys.getrefcount(None) - before) < 100  # 2,000 fewer with the leak


def test_without_the_kernel_no_int8_copy_is_kept_and_search_still_works(monkeypatch, tmp_path):
    monkeypatch.setattr(_vectors, "_kernel", None)
    monkeypatch.setattr(_vectors, "COMPACT_ROWS", 1)
    rng = np.random.default_rng(7)
    matrix = VectorMatrix.build("m", rows_of(rng.standard_normal((10, 8))), no_time)
    assert matrix.compact is None and matrix.nbytes == 10 * (8 * 4 + 8 + 4 + 8)
    assert [i for i, _ in top_k(matrix, matrix.matrix[3], 1, 0.0, 0.0)] == [3]


@needs_kernel
def test_a_matrix_gets_its_int8_copy_when_it_grows_past_the_threshold(monkeypatch):
    monkeypatch.setattr(_vectors, "COMPACT_ROWS", 300)
    rng = np.random.default_rng(8)
    vectors = rng.standard_normal((1000, 32)).astype(np.float32)
    small = VectorMatrix.build("m", rows_of(vectors[:200]), no_time)
    assert small.compact is None  # too small to be worth a copy
    within = small.extended(rows_of(vectors[200:250], first_key=201), no_time)
    assert within.compact is None
    grown = within.extended(rows_of(vectors[250:], first_key=251), no_time)
    rows8, scales = grown.compact
    assert rows8.shape == (1000, 32) and 0 < grown.slack < 0.2
    assert np.abs(rows8 * scales[:, None] - grown.matrix).max() <= grown.slack  # the first 250 rows too
    built = VectorMatrix.build("m", rows_of(vectors), no_time)
    questions = rng.standard_normal((20, 32)).astype(np.float32)
    assert [top_k(grown, q, 10, -1.0, 0.0) for q in questions] == [top_k(built, q, 10, -1.0, 0.0) for q in questions]


# ---------------------------------------------------------------- vector files beside a SQLite file
def test_a_vector_file_replaced_while_it_is_being_mapped_is_read_as_one_file(tmp_path, monkeypatch):
    """The arrays' headers were read through an open file and each array then mapped by the file's path: another
    process saving the owner's vectors anew in between had the new file mapped at the old file's offsets."""
    rng = np.random.default_rng(3)
    old = VectorMatrix.build("m", rows_of(rng.standard_normal((40, 8)).astype(np.float32)), expiry)
    new = VectorMatrix.build("m", rows_of(rng.standard_normal((90, 8)).astype(np.float32), first_key=500), expiry)
    path, replacement = tmp_path / "owner.vec", tmp_path / "owner.vec.new"
    old.save(path, {"generation": 1})
    new.save(replacement, {"generation": 2})
    reads = []

    def replaced_after_the_first_header(read: object) -> object:
        def header(handle: object) -> object:
            if not reads:
                os.replace(replacement, path)  # as _sqlite_vector_files writes a file: a new one moved in place
            reads.append(handle)
            return read(handle)  # type: ignore[operator]
        return header

    for name in ("read_array_header_1_0", "read_array_header_2_0"):
        monkeypatch.setattr(np.lib.format, name, replaced_after_the_first_header(getattr(np.lib.format, name)))
    mapped, header = VectorMatrix.mapped(path)
    assert reads and header["generation"] == 1 and mapped.size == 40
    for ours, theirs in zip(mapped._arrays(), old._arrays()):
        assert np.array_equal(ours[:mapped.size], theirs[:old.size])


@pytest.mark.parametrize("compact", [False, True])
def test_a_saved_matrix_maps_back_to_the_same_rows_and_answers(tmp_path, monkeypatch, compact):
    monkeypatch.setattr(_vectors, "COMPACT_ROWS", 1 if compact else 10**9)
    rows, centres = awkward_rows(np.random.default_rng(8), pieces=True)
    built = VectorMatrix.build("m", rows, expiry)
    assert (built.compact is not None) == (compact and _vectors._kernel is not None)
    built.save(tmp_path / "owner.vec", {"generation": 7})
    mapped, header = VectorMatrix.mapped(tmp_path / "owner.vec")
    assert header["generation"] == 7 and (mapped.model, mapped.size, mapped.repeats) == ("m", 3000, built.repeats)
    assert isinstance(mapped.matrix, np.memmap)  # mapped, not read
    for ours, theirs in zip(mapped._arrays(), built._arrays()):
        assert np.array_equal(ours[:mapped.size], theirs[:built.size])
    assert [top_k(mapped, q, 10, 0.0, now=1e9) for q in centres] == [top_k(built, q, 10, 0.0, now=1e9) for q in centres]
    grown = mapped.extended(rows_of(centres, first_key=5000), no_time)  # no spare room: copied into memory
    assert grown.size == 3008 and not isinstance(grown.matrix, np.memmap)

    data = (tmp_path / "owner.vec").read_bytes()
    (tmp_path / "cut.vec").write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match="cut short"):
        VectorMatrix.mapped(tmp_path / "cut.vec")


@pytest.fixture
def small_files(monkeypatch):
    """Vector files for owners of 20 rows or more (the shipped threshold is thousands)."""
    from memshelf.stores import _sqlite_vector_files

    monkeypatch.setattr(_sqlite_vector_files, "SAVED_ROWS", 20)
    monkeypatch.delenv(_sqlite_vector_files.FILES_ENV, raising=False)
    return _sqlite_vector_files


def vector_files(path) -> list[str]:
    folder = path.with_name(path.name + "-vectors")
    return sorted(p.name for p in folder.iterdir() if p.name != ".lock") if folder.exists() else []


def first_answers(path, monkeypatch, files: str) -> tuple[list[list[str]], list[int]]:
    """Each owner's answers from a newly opened store, and the `after` keys it read vector rows from SQLite with."""
    monkeypatch.setenv("MEMSHELF_VECTOR_FILES", files)
    reads: list[int] = []
    original = SQLiteStore._vector_rows
    monkeypatch.setattr(SQLiteStore, "_vector_rows", lambda self, owner, model, after:
                        reads.append(after) or original(self, owner, model, after))
    shelf = Shelf.open(path, embedder=HashEmbedder())
    try:
        return own_answers(shelf, [KALEB, MAYA]), reads
    finally:
        shelf.close()
        monkeypatch.setattr(SQLiteStore, "_vector_rows", original)


def fill(path, per_owner: int = 30) -> None:
    shelf = Shelf.open(path, embedder=HashEmbedder())
    for owner in (KALEB, MAYA):
        shelf.remember_many(owner, [{"topic": "note", "content": f"{owner.user} note {j} about item{j}"}
                                    for j in range(per_owner)])
    shelf.close()


def filled_with_files(path, monkeypatch) -> dict:
    """A filled file whose owners' vector files are written, and those files' bytes (to put back later)."""
    fill(path)
    first_answers(path, monkeypatch, "on")
    folder = path.with_name(path.name + "-vectors")
    return {folder / name: (folder / name).read_bytes() for name in vector_files(path)}


def put_back(kept: dict) -> None:
    for file, data in kept.items():
        file.write_bytes(data)


def test_a_reopened_store_answers_its_first_search_from_the_vector_files(tmp_path, monkeypatch, small_files):
    path = tmp_path / "memory.db"
    fill(path)
    expected, reads = first_answers(path, monkeypatch, "off")
    assert reads == [-1, -1] and vector_files(path) == []  # off: every vector read from SQLite, no files
    assert expected[0][0] == "kaleb note 3 about item3"
    assert first_answers(path, monkeypatch, "on") == (expected, [-1, -1])  # read, and the files written
    assert len(vector_files(path)) == 2 and all(name.endswith(".vec") for name in vector_files(path))
    answers, reads = first_answers(path, monkeypatch, "on")
    assert answers == expected and reads != [-1, -1]  # only the rows after each file's last one

    shelf = Shelf.open(path, embedder=HashEmbedder())  # a memory added after the file is found too
    shelf.remember(KALEB, "note", "kaleb a newer note about item3")
    shelf.close()
    answers, reads = first_answers(path, monkeypatch, "on")
    assert "kaleb a newer note about item3" in answers[0] and -1 not in reads


def test_forgetting_a_memory_removes_the_tenants_vector_files_and_a_stale_one_is_never_used(
        tmp_path, monkeypatch, small_files):
    path = tmp_path / "memory.db"
    kept = filled_with_files(path, monkeypatch)
    shelf = Shelf.open(path, embedder=HashEmbedder())
    gone = shelf.search(KALEB, "kaleb note 3 about item3", mode="semantic", limit=1)[0].memory
    shelf.forget(KALEB, gone.id)
    assert vector_files(path) == []  # the forgotten memory's vector left the disk with its row
    shelf.close()

    put_back(kept)  # files from before the forget, as if a crash had kept them
    answers, reads = first_answers(path, monkeypatch, "on")
    assert gone.content not in answers[0]
    assert reads[0] == -1 and reads[1] > 0  # Kaleb's file is a generation old: read again; Maya's still holds
    assert len(vector_files(path)) == 2  # and Kaleb's written again


def test_a_file_whose_last_row_is_gone_is_not_used(tmp_path, monkeypatch, small_files):
    path = tmp_path / "memory.db"
    kept = filled_with_files(path, monkeypatch)
    shelf = Shelf.open(path, embedder=HashEmbedder())
    shelf.forget_user(KALEB)  # the owner starts again at generation 0, with other rows
    assert vector_files(path) == []
    shelf.remember_many(KALEB, [{"topic": "note", "content": f"kaleb fresh start {j}"} for j in range(25)])
    shelf.close()
    put_back(kept)
    answers, _ = first_answers(path, monkeypatch, "on")
    assert all(text.startswith("kaleb fresh start") for text in answers[0])


def test_a_damaged_vector_file_is_read_again_from_the_database(tmp_path, monkeypatch, small_files, caplog):
    path = tmp_path / "memory.db"
    fill(path)
    expected, _ = first_answers(path, monkeypatch, "on")
    folder = path.with_name(path.name + "-vectors")
    for name in vector_files(path):
        (folder / name).write_bytes(b"not a vector file")
    with caplog.at_level("WARNING", logger="memshelf"):
        assert first_answers(path, monkeypatch, "on") == (expected, [-1, -1])
    assert "ignoring the vector file" in caplog.text
    assert len(vector_files(path)) == 2 and all((folder / n).stat().st_size > 1000 for n in vector_files(path))


def test_vector_files_can_be_turned_off_and_a_bad_setting_says_what_to_write(tmp_path, monkeypatch, small_files):
    monkeypatch.setenv("MEMSHELF_VECTOR_FILES", "sometimes")
    with pytest.raises(ConfigError, match="on or off"):
        Shelf.open(tmp_path / "memory.db", embedder=HashEmbedder())


# ---------------------------------------------------------------- catching up with changes instead of rebuilding
def vector_reads(monkeypatch) -> list[tuple[int, int]]:
    """(id of the store, `after`) of every read of vector rows from SQLite from now on; after -1 is a rebuild."""
    reads: list[tuple[int, int]] = []
    original = SQLiteStore._vector_rows
    monkeypatch.setattr(SQLiteStore, "_vector_rows", lambda self, owner, model, after:
                        reads.append((id(self), after)) or original(self, owner, model, after))
    return reads


def rebuilds(reads: list[tuple[int, int]], shelf: Shelf) -> int:
    return sum(1 for store, after in reads if store == id(shelf.store) and after == -1)


WORDS = "printer toner desk lamp router wifi garden kettle coffee window".split()
QUESTIONS = ["printer toner", "garden kettle coffee", "wifi router window lamp", "desk"]


def semantic_answers(shelf: Shelf, owner: Owner = KALEB) -> list[list[tuple[str, float, float]]]:
    return [[(h.memory.id, round(h.score, 6), h.memory.confidence)
             for h in shelf.search(owner, q, mode="semantic", limit=8)] for q in QUESTIONS]


def current_ids(shelf: Shelf, owner: Owner, source: str | None = None) -> list[str]:
    """The owner's memories searches may return (neither superseded nor expired), oldest first."""
    query = ("SELECT id FROM memories WHERE tenant = ? AND user_id = ? AND superseded_at IS NULL"
             " AND (expires_at IS NULL OR expires_at > ?)")
    rows = shelf.store._q(query + (" AND source = ?" if source else "") + " ORDER BY pk",
                          (owner.tenant, owner.user, ts(shelf.now())) + ((source,) if source else ())).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("alone", [False, True])
def test_a_matrix_caught_up_with_changes_answers_as_one_read_afresh(tmp_path, monkeypatch, compact, alone):
    """Forget, confirm, expire, supersede and remember in a random order, by the cached store and by a second one on
    the same file; after each, both answer as a store opened afresh, and the cached matrix is rebuilt only after a
    re-embedding (or when deletions have left too many dead rows in it, or a forgotten key went to a new memory).
    alone: Kaleb is the file's only owner, so his newest rows hold the largest keys, which new rows reuse."""
    if compact:
        if _vectors._kernel is None:
            pytest.skip("no int8 kernel (simsimd) on this platform")
        monkeypatch.setattr(_vectors, "COMPACT_ROWS", 16)
    monkeypatch.setenv("MEMSHELF_VECTOR_FILES", "off")
    rng = random.Random(11)
    moment = [datetime(2026, 6, 1, tzinfo=UTC)]
    options = {"embedder": HashEmbedder(window_chars=60), "clock": lambda: moment[0]}
    path = tmp_path / "memory.db"
    shelf, other = Shelf.open(path, **options), Shelf.open(path, **options)

    def text() -> str:  # some longer than the window, so embedded in pieces
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 25)))

    def items(n: int) -> list[dict]:
        return [{"topic": "note", "content": text(), "source": rng.choice(["stated", "mined", "inferred"])}
                for _ in range(n)]

    shelf.remember_many(KALEB, items(80))
    if not alone:
        shelf.remember_many(MAYA, items(30))
    reads = vector_reads(monkeypatch)
    assert semantic_answers(shelf)[0]  # the matrix is cached
    allowed, changes = 1, 0
    used = {r[0] for r in shelf.store._q("SELECT pk FROM memories").fetchall()}
    for step in range(70):
        actor = rng.choice([shelf, other])
        owner = KALEB if alone or rng.random() < 0.85 else MAYA
        ids = current_ids(actor, owner)
        kind = rng.choice(["forget", "confirm", "expire", "expire", "supersede", "remember", "reembed"])
        if kind == "forget":  # the newest half the time: its key goes to the next new memory
            actor.forget(owner, ids[-1] if rng.random() < 0.5 else rng.choice(ids))
        elif kind == "confirm" and current_ids(actor, owner, "inferred"):
            actor.confirm(owner, rng.choice(current_ids(actor, owner, "inferred")))
        elif kind == "expire":
            actor.set_expiry(owner, rng.choice(ids), ttl=rng.choice([None, 60, 600, 86400]))
        elif kind == "supersede":
            old, new = rng.sample(ids, 2)
            assert actor.store.supersede_memory(owner, old, new, actor.now())
        elif kind == "remember":
            added = actor.remember_many(owner, items(rng.randint(1, 3)))
            keys = {actor.store._q("SELECT pk FROM memories WHERE id = ?", (m.id,)).fetchone()[0] for m in added}
            allowed += owner == KALEB and bool(keys & used)  # a forgotten key again: read afresh
            used |= keys
        elif kind == "reembed":  # another tool rewrote one vector under the same model name
            with actor.store.atomic():
                actor.store._q("UPDATE memories SET embedding = (SELECT embedding FROM memories WHERE id = ?)"
                               " WHERE id = ?", tuple(rng.sample(ids, 2)))
            allowed += owner == KALEB
        changes += kind != "remember"
        moment[0] += timedelta(minutes=rng.randint(0, 5))
        fresh = Shelf.open(path, **options)
        try:
            expected = semantic_answers(fresh)
        finally:
            fresh.close()
        assert semantic_answers(shelf) == expected, (step, kind)
        assert semantic_answers(other) == expected, (step, kind)
    assert changes > 40
    assert rebuilds(reads, shelf) <= allowed + 2  # without catching up: one after nearly every change
    shelf.close()
    other.close()


def test_a_forgotten_memorys_vector_is_zeroed_in_the_cached_matrix(tmp_path, monkeypatch):
    monkeypatch.setattr(_vectors, "COMPACT_ROWS", 16)
    monkeypatch.setenv("MEMSHELF_VECTOR_FILES", "off")
    shelf, _ = shelf_with_owners(tmp_path / "memory.db", owners=1, per_owner=40)
    owner = Owner("t", "user0")
    reads = vector_reads(monkeypatch)
    first = shelf.search(owner, "user0 note 3 about item3", mode="semantic", limit=1)[0].memory
    assert rebuilds(reads, shelf) == 1
    pk = shelf.store._q("SELECT pk FROM memories WHERE id = ?", (first.id,)).fetchone()[0]
    shelf.forget(owner, first.id)
    assert first.id not in [h.memory.id for h in shelf.search(owner, "user0 note 3 about item3", mode="semantic")]
    assert rebuilds(reads, shelf) == 1  # caught up, not read again
    matrix = next(iter(cache(shelf)._entries.values()))[0].matrix
    (at,) = np.flatnonzero(matrix.keys == pk)
    assert not matrix.matrix[at].any() and matrix.expires[at] == -np.inf
    assert matrix.matrix[at - 1].any()
    if matrix.compact is not None:
        assert not matrix.compact[0][at].any()
    newest = shelf.list_memories(owner, limit=1)[0][0]  # the row the store checks an owner by is gone too
    shelf.forget(owner, newest.id)
    assert newest.id not in [h.memory.id for h in shelf.search(owner, newest.content, mode="semantic")]
    assert rebuilds(reads, shelf) == 1
    shelf.close()


@pytest.mark.parametrize("search_between", [True, False])
def test_a_deleted_memorys_key_given_to_a_new_memory_never_brings_back_the_old_vector(
        tmp_path, monkeypatch, search_between):
    """SQLite gives a new row the largest key plus one, so forgetting the newest memories frees their keys for the
    next ones: whether the cache caught up with the forget before the new memory came or not, it must serve the
    new memory's vector under that key, never the forgotten one's."""
    monkeypatch.setenv("MEMSHELF_VECTOR_FILES", "off")
    path = tmp_path / "memory.db"
    shelf = Shelf.open(path, embedder=HashEmbedder())
    shelf.remember_many(KALEB, [{"topic": "note", "content": f"{WORDS[j % 10]} {WORDS[(j * 3) % 10]} note {j}"}
                                for j in range(40)])
    newest = shelf.list_memories(KALEB, limit=2)[0]
    keys = [shelf.store._q("SELECT pk FROM memories WHERE id = ?", (m.id,)).fetchone()[0] for m in newest]
    assert semantic_answers(shelf)
    for memory in newest:
        shelf.forget(KALEB, memory.id)
    if search_between:
        assert semantic_answers(shelf)
    new = shelf.remember(KALEB, "note", "the garden kettle by the window")
    assert shelf.store._q("SELECT pk FROM memories WHERE id = ?", (new.id,)).fetchone()[0] == min(keys)  # reused
    fresh = Shelf.open(path, embedder=HashEmbedder())
    try:
        for question in [newest[0].content, newest[1].content, new.content, *QUESTIONS]:
            expected = [(h.memory.id, h.score) for h in fresh.search(KALEB, question, mode="semantic", limit=10)]
            got = [(h.memory.id, h.score) for h in shelf.search(KALEB, question, mode="semantic", limit=10)]
            assert got == expected, question
        assert shelf.search(KALEB, new.content, mode="semantic", limit=1)[0].memory.id == new.id
    finally:
        fresh.close()
        shelf.close()


def test_more_changes_than_the_store_keeps_rebuild_the_matrix(tmp_path, monkeypatch):
    from memshelf.stores._sqlite_schema import CHANGES_KEPT

    monkeypatch.setenv("MEMSHELF_VECTOR_FILES", "off")
    path = tmp_path / "memory.db"
    shelf, _ = shelf_with_owners(path, owners=1, per_owner=30)
    owner = Owner("t", "user0")
    reads = vector_reads(monkeypatch)
    before = semantic_answers(shelf, owner)
    start = shelf.store._q("SELECT generation FROM owner_generation WHERE user_id = ?", (owner.user,)).fetchone()[0]
    with shelf.store.atomic():  # each update one generation: more than the store keeps entries of
        for n in range(CHANGES_KEPT + 10):
            shelf.store._q("UPDATE memories SET confidence = ? WHERE pk = (SELECT min(pk) FROM memories)",
                           (0.5 + (n % 2) * 0.1,))
    kept = shelf.store._q("SELECT count(*), min(generation), max(generation) FROM owner_changes").fetchone()
    assert kept == (CHANGES_KEPT, start + 11, start + CHANGES_KEPT + 10)  # an owner starts at a random one
    answers = semantic_answers(shelf, owner)
    assert rebuilds(reads, shelf) == 2  # the first search, then the one too far behind
    assert [[hit[:2] for hit in q] for q in answers] == [[hit[:2] for hit in q] for q in before]
    shelf.forget_user(owner)
    assert shelf.store._q("SELECT count(*) FROM owner_changes").fetchone() == (0,)  # erased with its owner
    shelf.close()


def test_an_owner_erased_and_refilled_elsewhere_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMSHELF_VECTOR_FILES", "off")
    path = tmp_path / "memory.db"
    shelf = Shelf.open(path, embedder=HashEmbedder())
    shelf.remember_many(KALEB, [{"topic": "note", "content": f"kaleb old note {j}"} for j in range(20)])
    shelf.remember_many(MAYA, [{"topic": "note", "content": f"maya note {j}"} for j in range(20)])
    questions = ["kaleb old note 3", "kaleb desk lamp 3"]
    assert shelf.search(KALEB, questions[0], mode="semantic")  # Kaleb's matrix cached at generation 0
    other = Shelf.open(path, embedder=HashEmbedder())
    other.forget_user(KALEB)
    fresh = other.remember_many(KALEB, [{"topic": "note", "content": f"kaleb desk lamp {j}", "source": "inferred"}
                                        for j in range(20)])
    for memory in fresh[:3]:  # generation 3, with all three entries there: only the last row tells
        other.confirm(KALEB, memory.id)
    expected = [[h.memory.id for h in other.search(KALEB, q, mode="semantic", limit=20)] for q in questions]
    other.close()
    assert [[h.memory.id for h in shelf.search(KALEB, q, mode="semantic", limit=20)] for q in questions] == expected
    assert expected[0] and set(expected[0]) <= {m.id for m in fresh}
    shelf.close()


def test_an_owner_erased_and_refilled_with_as_many_memories_elsewhere_is_read_again(tmp_path, monkeypatch):
    """The owner's counters started at (generation 0, appended n) again after an erasure, so a refill of as many
    memories matched what another process had cached for the erased ones; the refill's last memory, the same as
    before, passed the check of the newest row, and the erased memory's vector scored the new one in its key."""
    monkeypatch.setenv("MEMSHELF_VECTOR_FILES", "off")
    path = tmp_path / "memory.db"
    reader, writer = Shelf.open(path, embedder=HashEmbedder()), Shelf.open(path, embedder=HashEmbedder())
    writer.remember_many(KALEB, [{"topic": "x", "content": "alpha beta"}, {"topic": "y", "content": "gamma"}])
    assert [h.memory.content for h in reader.search(KALEB, "alpha beta", mode="semantic")][0] == "alpha beta"
    writer.forget_user(KALEB)
    writer.remember_many(KALEB, [{"topic": "x", "content": "delta"}, {"topic": "y", "content": "gamma"}])
    expected = [(h.memory.id, round(h.score, 6)) for h in writer.search(KALEB, "alpha beta", mode="semantic")]
    assert [(h.memory.id, round(h.score, 6)) for h in reader.search(KALEB, "alpha beta", mode="semantic")] == expected
    assert all(score < 0.5 for _, score in expected)  # the erased "alpha beta" scores nothing now
    reader.close()
    writer.close()


def test_a_memory_superseded_by_a_clock_ahead_of_ours_takes_no_place_in_the_answer(tmp_path, monkeypatch):
    """A supersession stamped in the future (another process's clock ahead of this one, or an import within the
    allowed clock skew) kept the row in the cached matrix until that instant: it took one of the top k places,
    the rows read back then dropped it (superseded), and the search answered fewer hits than it had."""
    monkeypatch.setenv("MEMSHELF_VECTOR_FILES", "off")
    shelf = Shelf.open(tmp_path / "memory.db", embedder=HashEmbedder())
    old, new, other = (shelf.remember(KALEB, "notes", text) for text in ("alpha beta", "alpha gamma", "delta"))
    assert len(shelf.search(KALEB, "alpha beta", mode="semantic", limit=2, floor=-1.0)) == 2  # the matrix cached
    ahead = datetime.now(UTC) + timedelta(minutes=2)
    assert shelf.store.supersede_memory(KALEB, old.id, new.id, ahead)
    found = [hit.memory.id for hit in shelf.search(KALEB, "alpha beta", mode="semantic", limit=2, floor=-1.0)]
    assert found == [new.id, other.id]
    shelf.close()


def test_a_vector_file_catches_up_with_changes_that_delete_nothing(tmp_path, monkeypatch, small_files):
    path = tmp_path / "memory.db"
    filled_with_files(path, monkeypatch)
    shelf = Shelf.open(path, embedder=HashEmbedder())
    some = current_ids(shelf, KALEB)[:3]
    shelf.set_expiry(KALEB, some[0], ttl=3600)
    shelf.store.supersede_memory(KALEB, some[1], some[2], shelf.now())
    shelf.close()
    expected, _ = first_answers(path, monkeypatch, "off")
    files = vector_files(path)
    answers, reads = first_answers(path, monkeypatch, "on")
    assert answers == expected and -1 not in reads  # both owners from their files, Kaleb's caught up
    assert vector_files(path) == files
