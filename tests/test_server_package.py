"""The shape of memshelf.server: the MCP endpoint and the HTTP server do not import each other at import time, the
errors module is a leaf, and every module says what it exports."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

import memshelf.server  # noqa: E402

SERVER_DIR = Path(memshelf.server.__file__).parent


def loaded_after(statement: str) -> set[str]:
    """The memshelf modules a fresh interpreter has loaded after running `statement`."""
    code = f"import sys; {statement}; print('\\n'.join(m for m in sys.modules if m.startswith('memshelf')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(done.stdout.split())


def test_mcp_imports_only_the_errors_leaf_of_the_server() -> None:
    server_modules = {m for m in loaded_after("import memshelf.mcp") if m.startswith("memshelf.server")}
    assert server_modules == {"memshelf.server", "memshelf.server.errors"}


def test_the_server_imports_mcp_only_when_an_app_is_built() -> None:
    loaded = loaded_after("import memshelf.server.app; from memshelf.server import create_app, serve")
    assert "memshelf.server.routers.memories" in loaded and "memshelf.mcp" not in loaded


def test_errors_is_a_leaf() -> None:
    """memshelf.server.errors imports nothing of memshelf but its exceptions and records."""
    tree = ast.parse((SERVER_DIR / "errors.py").read_text(encoding="utf-8"))
    relative = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
    assert relative <= {"errors", "model"}


def server_modules() -> list[str]:
    return [info.name for info in pkgutil.walk_packages([str(SERVER_DIR)], "memshelf.server.")]


@pytest.mark.parametrize("name", ["memshelf.server", *server_modules()])
def test_every_module_declares_what_it_exports(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__all__, f"{name} has no __all__"
    for exported in module.__all__:
        assert getattr(module, exported) is not None


def test_the_package_exports_what_it_did_as_one_module() -> None:
    from memshelf.server import MAX_BODY_BYTES, SCRUB_PENDING_HEADER, app_from_env, create_app, serve

    assert MAX_BODY_BYTES == 1 << 20 and SCRUB_PENDING_HEADER == "X-Memshelf-Scrub-Pending"
    assert callable(create_app) and callable(serve) and callable(app_from_env)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        memshelf.server.nothing_here  # noqa: B018
