"""The sqlite3 module the SQLite store runs on: Python's own, or the newer SQLite that the pysqlite3-binary wheel
bundles (`pip install memshelf[sqlite]`, Linux x86-64), whichever is newer, unless MEMSHELF_SQLITE says:

- `auto` (default): the newer of the two; Python's when the wheel is not installed;
- `python`: Python's own sqlite3;
- `pysqlite3`: the wheel's (an error when it is not installed).

A newer SQLite erases faster: from 3.45 FTS5 takes a deleted row's words out of the index in place instead of
merging the tenant's whole index (stores/_sqlite_fts.py, SECURE_DELETE; README, "Erasure")."""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

from ..errors import ConfigError

CHOICES = ("auto", "python", "pysqlite3")


def _wheel() -> ModuleType | None:
    try:
        from pysqlite3 import dbapi2  # type: ignore[import-not-found]
    except ImportError:
        return None
    return dbapi2  # type: ignore[no-any-return]


def choose(setting: str | None) -> ModuleType:
    """The module MEMSHELF_SQLITE=`setting` names."""
    import sqlite3 as python

    wanted = (setting or "auto").strip().lower()
    if wanted not in CHOICES:
        raise ConfigError(f"MEMSHELF_SQLITE must be one of {', '.join(CHOICES)}, got {setting!r}")
    if wanted == "python":
        return python
    wheel = _wheel()
    if wheel is None:
        if wanted == "pysqlite3":
            raise ConfigError("MEMSHELF_SQLITE=pysqlite3 but the pysqlite3-binary wheel is not installed: "
                              "pip install 'memshelf[sqlite]' (Linux x86-64), or unset MEMSHELF_SQLITE")
        return python
    if wanted == "pysqlite3" or wheel.sqlite_version_info > python.sqlite_version_info:
        return wheel
    return python


if TYPE_CHECKING:
    import sqlite3
else:
    sqlite3 = choose(os.environ.get("MEMSHELF_SQLITE"))
