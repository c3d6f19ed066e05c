"""The public surface is explicit: __all__ is what the README lists, everything in it imports, and the types the
public verbs return, and those a store implementer needs, are exported.

The rule for modules (README, public API section): a module is internal when a part of its dotted name starts with
`_`; every other module is public and listed in the README. No module is neither."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import typing
from pathlib import Path

import pytest

import memshelf
import memshelf.stores

README = Path(__file__).resolve().parent.parent / "README.md"


def test_all_matches_the_readme():
    text = README.read_text(encoding="utf-8")
    section = text.split("The public API is exactly what", 1)[1].split("\nEvery error", 1)[0]
    documented = set(re.findall(r"`([A-Za-z_]+)`", section)) - {"memshelf", "__all__"}
    assert documented == set(memshelf.__all__)


def test_every_public_name_exists():
    for name in memshelf.__all__:
        assert getattr(memshelf, name) is not None, name


PACKAGES_WITH_ALL = ["memshelf", "memshelf.stores", "memshelf.embedders", "memshelf.learning", "memshelf.testing",
                     "memshelf.testing.contract"]


@pytest.mark.parametrize("name", PACKAGES_WITH_ALL)
def test_every_name_in_every_public_all_exists(name):
    module = importlib.import_module(name)
    assert module.__all__, name
    missing = [attr for attr in module.__all__ if getattr(module, attr, None) is None]
    assert missing == [], f"{name}.__all__ names what it does not define: {missing}"


def _modules() -> list[str]:
    """Every module of the memshelf package (walk_packages imports the packages, not the modules)."""
    return ["memshelf"] + [info.name for info in pkgutil.walk_packages(memshelf.__path__, "memshelf.")]


def _internal(module: str) -> bool:
    """The rule the README states: a module is internal when a part of its dotted name starts with `_`."""
    return any(part.startswith("_") for part in module.split("."))


def _documented_modules() -> set[str]:
    section = README.read_text(encoding="utf-8").split("Every other module is public and listed here", 1)[1]
    return set(re.findall(r"`(memshelf(?:\.[a-z_]+)*)`", section.split("\n\n", 1)[0]))


def test_every_module_is_public_and_documented_or_internal_and_marked():
    modules, documented = _modules(), _documented_modules()
    assert {"memshelf._vectors", "memshelf.stores._sqlite_fts", "memshelf.stores.sqlite"} <= set(modules)
    unmarked = sorted(m for m in modules if not _internal(m) and m not in documented)
    assert unmarked == [], f"document these in the README's public API section, or name them with a '_': {unmarked}"
    assert sorted(documented - set(modules)) == [], "the README lists modules that do not exist"
    assert sorted(m for m in documented if _internal(m)) == [], "the README lists an internal module as public"


def test_public_packages_declare_their_names():
    for name in PACKAGES_WITH_ALL:
        assert name in _documented_modules(), name
        assert isinstance(importlib.import_module(name).__all__, list), name


def _memshelf_classes(hints: typing.Iterable[object]) -> set[type]:
    """Every memshelf-defined class in these type hints, in their arguments (list[Memory], ApiKey | None), and,
    for each class found, in its fields and generic bases (SearchResult is a list[Hit])."""
    found: set[type] = set()
    stack = list(hints)
    while stack:
        hint = stack.pop()
        stack.extend(typing.get_args(hint))
        if isinstance(hint, type) and hint.__module__.startswith("memshelf") and hint not in found:
            found.add(hint)
            stack.extend(typing.get_type_hints(hint).values())
            stack.extend(getattr(hint, "__orig_bases__", ()))
    return found


def _methods(cls: type) -> list[typing.Callable[..., object]]:
    return [member for name, member in inspect.getmembers(cls, callable) if not name.startswith("_")]


def test_every_type_a_public_shelf_verb_returns_is_exported():
    returned = _memshelf_classes(typing.get_type_hints(method).get("return") for method in _methods(memshelf.Shelf))
    assert {memshelf.Erased, memshelf.ApiKey, memshelf.SearchResult, memshelf.Hit} <= returned  # the walk works
    missing = sorted(cls.__qualname__ for cls in returned if getattr(memshelf, cls.__name__, None) is not cls)
    assert missing == [], f"public Shelf methods return types memshelf does not export: {missing}"
    assert {cls.__name__ for cls in returned} <= set(memshelf.__all__)


def test_every_type_in_the_store_contract_is_exported_for_implementers():
    """What a Store method takes or returns, a backend author imports from memshelf.stores."""
    used = _memshelf_classes(hint for method in _methods(memshelf.stores.Store)
                             for hint in typing.get_type_hints(method).values())
    assert {memshelf.stores.NewMemory, memshelf.stores.Position, memshelf.stores.Pending} <= used  # the walk works
    missing = sorted(cls.__qualname__ for cls in used if getattr(memshelf.stores, cls.__name__, None) is not cls)
    assert missing == [], f"the Store contract uses types memshelf.stores does not export: {missing}"
    assert {cls.__name__ for cls in used} <= set(memshelf.stores.__all__)


def test_import_has_no_side_effects(tmp_path, monkeypatch):
    """No files, no network, no heavy imports when memshelf is imported."""
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    code = "import sys, memshelf; print(sorted(m for m in ('torch', 'sentence_transformers') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert list(tmp_path.iterdir()) == []


def test_the_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    """The README's Python block, run as written (keyword search only, so no model is needed here)."""
    text = README.read_text(encoding="utf-8")
    code = text.split("## Python\n\n```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSHELF_EMBEDDER", "none")
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "1.0  [network] The office printer is on 192.168.1.40." in printed
    assert "Memory context:\nKnown facts about the user:\n  - user_name: Kaleb" in printed
