"""Behaviour every backend must show: memshelf.testing's contract suite, run here once per backend in
conftest.BACKENDS. The suite asks for one fixture, `memshelf_target`: conftest.py defines it as `target`, a fresh
SQLite file or PostgreSQL database for the backend under test (a third backend defines its own; see
test_testing.py)."""

from __future__ import annotations

from memshelf.testing.contract import *  # noqa: F403  every contract test, and the fixtures they use
