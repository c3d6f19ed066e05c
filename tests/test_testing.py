"""memshelf.testing is what its docstring promises: a third backend runs the whole contract suite with one fixture,
in its own test file, with no conftest and no plugin line, and importing memshelf does not import pytest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import memshelf

# A backend author's whole test file: a store of their own (here the SQLite store under another class and another
# URL scheme), registered the public way, and the one fixture the suite asks for.
THIRD_BACKEND_TESTS = '''
import pytest

from memshelf.stores import register_store
from memshelf.stores.sqlite import SQLiteStore
from memshelf.testing.contract import *  # noqa: F403


class ThirdStore(SQLiteStore):
    """A backend memshelf does not ship."""


register_store("third", lambda target: ThirdStore(target.removeprefix("third://")))


@pytest.fixture
def memshelf_target(tmp_path):
    return f"third://{tmp_path / 'shelf.db'}"


def test_the_suite_runs_on_the_third_store(shelf):
    assert type(shelf.store) is ThirdStore
'''


def _env() -> dict[str, str]:
    """This checkout's memshelf first on the path, whatever the working directory."""
    source = str(Path(memshelf.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)}


def test_a_third_backend_runs_the_whole_contract_suite(tmp_path):
    (tmp_path / "test_third_store.py").write_text(textwrap.dedent(THIRD_BACKEND_TESTS), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_third_store.py"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed is not None and int(passed.group(1)) > 50, summary
    assert "failed" not in summary and "error" not in summary and "skipped" not in summary, summary


def test_importing_memshelf_does_not_import_pytest():
    code = ("import sys, memshelf, memshelf.stores, memshelf.embedders; "
            "print('pytest' in sys.modules, '_pytest' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False False"


def test_a_backend_written_before_page_users_serves_the_rest_and_says_what_it_lacks(tmp_path):
    from memshelf import Owner, Shelf, StoreError, Store
    from memshelf.stores.sqlite import SQLiteStore

    class OlderStore(SQLiteStore):
        page_users = Store.page_users  # what a backend inherits when it does not implement it

    with Shelf(OlderStore(str(tmp_path / "shelf.db"))) as shelf:
        shelf.remember(Owner("home", "kaleb"), "network", "The office printer is on 192.168.1.40.")
        assert len(shelf.list_memories(Owner("home", "kaleb"))[0]) == 1
        with pytest.raises(StoreError, match="the OlderStore backend cannot list a tenant's users: implement "
                                             "Store.page_users"):
            shelf.list_users("home")
