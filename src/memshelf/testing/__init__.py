"""The contract suite, importable: run every behaviour memshelf's own backends show against your storage backend.

A backend author defines ONE pytest fixture, `memshelf_target`: a fresh target (a path or URL that `Shelf.open`
opens with the store you registered through `memshelf.register_store`), new for each test. Every test of the suite
then runs against it; some open a second shelf on the same target, some use `shelf.store.atomic()` and
`shelf.store.keyword_search(...)` directly, so the target must reach one and the same storage every time it is
opened during a test.

Either way works under pytest:

1. Import the suite into a test module (no conftest, no plugin line; pytest collects test functions and fixtures
   that a test module imports)::

       # test_my_store.py
       import pytest
       from memshelf.testing.contract import *  # noqa: F403  every contract test and the fixtures they use

       @pytest.fixture
       def memshelf_target(tmp_path):
           return f"mystore://{tmp_path}/shelf"

2. Or load the fixtures as a plugin, e.g. in conftest.py: `pytest_plugins = ["memshelf.testing"]` (or run
   `pytest -p memshelf.testing`), define `memshelf_target` there, and import only the tests where you want them:
   `from memshelf.testing.contract import *`. The fixtures (`clock`, `open_shelf`, `shelf`) then serve your own
   tests too.

pytest is a test dependency, not a runtime one: `import memshelf` never imports it, `import memshelf.testing`
does (`pip install 'memshelf[testing]'`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ..shelf import Shelf

__all__ = ["Clock", "clock", "open_shelf", "shelf"]


class Clock:
    """A clock the tests move by hand, so expiry is tested without sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def open_shelf(memshelf_target: str) -> Iterator[Callable[..., Shelf]]:
    """Open shelves on `memshelf_target` (keyword-only unless told otherwise); all closed afterwards."""
    opened: list[Shelf] = []

    def _open(**options: Any) -> Shelf:
        options.setdefault("embedder", None)
        shelf = Shelf.open(memshelf_target, **options)
        opened.append(shelf)
        return shelf

    yield _open
    for shelf in opened:
        shelf.close()


@pytest.fixture
def shelf(open_shelf: Callable[..., Shelf], clock: Clock) -> Shelf:
    """A keyword-only shelf on `memshelf_target`, on the test's hand-moved clock."""
    return open_shelf(clock=clock)
