"""The shape of memshelf.server: the MCP endpoint and the HTTP server do not import each other at import time, the
errors module is a leaf, and every module says what it exports."""

from __future__ import annotations

import ast
import dataclasses
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
    assert server_modules == {"memshelf.server", "memshelf.server._errors"}


def test_the_server_imports_mcp_only_when_an_app_is_built() -> None:
    loaded = loaded_after("import memshelf.server._app; from memshelf.server import create_app, serve")
    assert "memshelf.server._routers.memories" in loaded and "memshelf.mcp" not in loaded


def test_errors_is_a_leaf() -> None:
    """memshelf.server._errors imports nothing of memshelf but its exceptions and records."""
    tree = ast.parse((SERVER_DIR / "_errors.py").read_text(encoding="utf-8"))
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


# ---------------------------------------------------------------------------------------------- records as responses

def record_fields(record: type) -> list[str]:
    return [field.name for field in dataclasses.fields(record)]


def test_response_models_show_every_field_of_their_record_in_its_order() -> None:
    from memshelf.model import Fact, FactChange, Hit, Memory, Message
    from memshelf.server._schemas import (ErasedOut, FactChangeOut, FactOut, HitOut, KeyOut, MemoryOut,
                                         MessageOut)
    from memshelf.stores.base import ApiKey, Erased

    for model, record in ((MemoryOut, Memory), (HitOut, Hit), (FactChangeOut, FactChange), (MessageOut, Message),
                          (KeyOut, ApiKey), (ErasedOut, Erased)):
        assert list(model.model_fields) == record_fields(record), model.__name__
    assert list(FactOut.model_fields) == [*(f for f in record_fields(Fact) if f != "outranked"), "note",
                                          "outranked_at"]
    assert HitOut.model_fields["memory"].annotation is MemoryOut


def test_a_field_added_to_a_record_appears_in_the_answer() -> None:
    from memshelf.server._schemas import Out, fields_of

    @dataclasses.dataclass(frozen=True)
    class Thread:
        """A conversation thread."""

        id: str
        title: str
        turns: int = 0

    @fields_of(Thread)
    class ThreadOut(Out):
        pass

    assert ThreadOut.of(Thread("t1", "printer", 3)).model_dump() == {"id": "t1", "title": "printer", "turns": 3}
    schema = ThreadOut.model_json_schema()
    assert schema["required"] == ["id", "title", "turns"] and schema["description"] == "A conversation thread."


def test_the_api_offers_the_search_modes_the_shelf_knows() -> None:
    from memshelf.model import MODES
    from memshelf.server._schemas import ContextIn, PromptIn, SearchIn

    for body in (SearchIn, ContextIn, PromptIn):
        assert tuple(body.model_json_schema()["properties"]["mode"]["enum"]) == MODES
