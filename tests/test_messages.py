"""Each face says what to do in its own terms (issue 13): the CLI names options and commands, the HTTP API names
routes, the MCP tools name tools; none speaks Python to its users. Custom sources are declared from every face
(--sources, MEMSHELF_SOURCES). Counts read as words ("1 memory"), and a warning is said once."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from collections.abc import AsyncIterator

import anyio
import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient
from fakes import FakeOllama, HashEmbedder
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from test_cli import ok, run
from test_mcp import call, call_error, http_session
from test_server import LiveServer, bearer

from memshelf import ConfigError, Owner, Shelf
from memshelf.model import sources_from_text
from memshelf.server import create_app
from memshelf.server._app import _worker_settings
from memshelf.stores.postgres import setup_sql

KALEB = Owner("home", "kaleb")
NO_ID = "m_0123456789abcdef"
PYTHON = ("Shelf.open(", "embedder='", "sources={", "mode='")
"""What a message speaks when it speaks Python."""


def python_free(message: str) -> str:
    assert not any(word in message for word in PYTHON), message
    return message


def cli_error(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """The one line a failing command prints, checked to be one line with no Python in it."""
    proc = run(tmp_path, *args, env=env)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return python_free(proc.stderr)


# ---------------------------------------------------------------------------------------------- the CLI's terms

@pytest.mark.parametrize("args, says, not_says", [
    (["get", NO_ID], "list ids with `memshelf list`", "memshelf search`"),
    (["forget", NO_ID], "list ids with `memshelf list`", "memshelf search`"),
    (["forget-fact", "shoe_size"], "list them with `memshelf facts`", None),
    (["remember", "t", "x", "--source", "crm"], "declare it and its worth (above 0, at most 1) with --sources "
                                                "crm=0.8 or MEMSHELF_SOURCES", None),
    (["remember", "t", "x", "--source", "Stated"], "did you mean 'stated'?", None),
    (["search", "printer", "--mode", "semantic"], "semantic search needs an embedder: pass --embedder local "
                                                  "(or ollama:MODEL, openai:MODEL), or --mode keyword", None),
    (["search", "   "], "question is empty or only whitespace: pass the words to search for", "text to store"),
    (["set-fact", "bio", "x" * 5_000], "keep one short current value", "shorter statements"),
])
def test_cli_errors_say_what_to_do_in_options_and_commands(tmp_path, args, says, not_says):
    message = cli_error(tmp_path, *args)
    assert says in message
    assert not_says is None or not_says not in message


def test_an_import_error_keeps_the_cli_advice_and_names_the_missing_field(tmp_path):
    """An import record's error is said at its line of the file: its advice stays the CLI's."""
    dump = tmp_path / "dump.jsonl"
    dump.write_text(json.dumps({"kind": "fact", "key": "a", "value": "b", "source": "crm",
                                "updated_at": "2026-01-01T00:00:00+00:00"}) + "\n")
    message = cli_error(tmp_path, "import", str(dump))
    assert "dump.jsonl: field 'source': unknown source 'crm'" in message and "--sources crm=0.8" in message
    assert "line 1 of " in message
    assert message.rstrip().endswith("nothing was imported (fix the record or re-export)")
    dump.write_text(json.dumps({"kind": "fact", "key": "a", "value": "b",
                                "updated_at": "2026-01-01T00:00:00+00:00"}) + "\n")
    assert "dump.jsonl: field 'source' is missing" in cli_error(tmp_path, "import", str(dump))


def test_counts_of_one_read_as_words(tmp_path):
    ok(tmp_path, "remember", "t", "short lived", "--ttl", "0.001")
    time.sleep(0.01)
    assert ok(tmp_path, "purge").stdout.startswith("purged 1 memory, 0 messages")
    ok(tmp_path, "remember", "network", "The printer jams.")
    ok(tmp_path, "set-fact", "user_name", "Kaleb")
    dump = tmp_path / "kaleb.jsonl"
    ok(tmp_path, "export", "--out", str(dump))
    imported = ok(tmp_path, "--user", "maya", "import", str(dump)).stdout
    assert imported.startswith("imported 1 memory, 1 fact, 0 messages")
    erased = ok(tmp_path, "forget-user", "--yes").stdout
    assert erased.startswith("erased 1 memory, 1 fact, 1 fact_change, 0 messages")


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_embedder_is_said_once(tmp_path):
    down = {"MEMSHELF_EMBEDDER": "ollama:nomic-embed-text", "OLLAMA_HOST": f"http://127.0.0.1:{closed_port()}"}
    stored = ok(tmp_path, "remember", "network", "The printer jams.", env=down)
    assert stored.stderr.count("embedder unavailable") == 1
    assert "storing 1 memory without vectors" in stored.stderr
    found = ok(tmp_path, "search", "printer", env=down)
    assert found.stderr.count("embedder unavailable") == 1, found.stderr
    assert "The printer jams." in found.stdout


def test_search_by_meaning_says_to_backfill_what_has_no_vector(tmp_path):
    ok(tmp_path, "remember", "network", "The printer jams on thick paper.")  # MEMSHELF_EMBEDDER=none: no vector
    with FakeOllama() as ollama:
        served = {"MEMSHELF_EMBEDDER": "ollama:nomic-embed-text", "OLLAMA_HOST": ollama.url}
        empty = ok(tmp_path, "search", "printer paper", "--mode", "semantic", env=served)
        assert empty.stdout.strip() == ""
        assert ("no matches; 1 memory of yours not embedded yet cannot be found by meaning: run `memshelf backfill`"
                in empty.stderr)
        ok(tmp_path, "backfill", env=served)
        found = ok(tmp_path, "search", "printer paper", "--mode", "semantic", env=served)
    assert "The printer jams on thick paper." in found.stdout and "backfill" not in found.stderr


# ---------------------------------------------------------------------------------------------- custom sources

@pytest.mark.parametrize("how", ["option", "option-after-command", "environment"])
def test_the_cli_declares_sources(tmp_path, how):
    args = {"option": ["--sources", "crm=0.5, imported=0.7", "--json", "remember", "t", "from the crm",
                       "--source", "crm"],
            "option-after-command": ["remember", "t", "from the crm", "--source", "crm", "--sources",
                                     "crm=0.5,imported=0.7", "--json"],
            "environment": ["--json", "remember", "t", "from the crm", "--source", "crm"]}[how]
    env = {"MEMSHELF_SOURCES": "crm=0.5,imported=0.7"} if how == "environment" else None
    memory = json.loads(ok(tmp_path, *args, env=env).stdout)
    assert (memory["source"], memory["confidence"]) == ("crm", 0.5)


@pytest.mark.parametrize("args, env, says", [
    (["--sources", "crm", "facts"], None, "--sources: 'crm' is not NAME=WORTH: write NAME=WORTH pairs separated by "
                                          "commas, with WORTH in (0, 1], e.g. imported=0.7,crm=0.5"),
    (["--sources", "crm=high", "facts"], None, "--sources: the worth of 'crm' is 'high', not a number"),
    (["--sources", "crm=2", "facts"], None, "--sources: source 'crm' must be worth a number in (0, 1]"),
    (["facts"], {"MEMSHELF_SOURCES": "crm=0.5,crm=0.6"}, "MEMSHELF_SOURCES: source 'crm' is declared twice"),
    (["facts"], {"MEMSHELF_SOURCES": "=0.5"}, "MEMSHELF_SOURCES: '=0.5' is not NAME=WORTH"),
])
def test_a_malformed_sources_setting_is_one_line_naming_the_setting(tmp_path, args, env, says):
    assert says in cli_error(tmp_path, *args, env=env)


def test_the_library_reads_memshelf_sources_and_an_argument_wins(monkeypatch):
    monkeypatch.setenv("MEMSHELF_SOURCES", "crm=0.5")
    with Shelf.open(":memory:", embedder=None) as shelf:
        assert shelf.remember(KALEB, "t", "x", "crm").confidence == 0.5
    with Shelf.open(":memory:", embedder=None, sources={"crm": 0.3}) as shelf:
        assert shelf.sources["crm"] == 0.3
    monkeypatch.setenv("MEMSHELF_SOURCES", "crm:0.5")
    with pytest.raises(ConfigError, match="MEMSHELF_SOURCES: 'crm:0.5' is not NAME=WORTH"):
        Shelf.open(":memory:", embedder=None)
    assert sources_from_text(" a = 0.25 ,, b=1 ", "x") == {"a": 0.25, "b": 1.0} and sources_from_text("", "x") == {}


def test_serve_workers_learn_the_sources_from_the_environment():
    told = _worker_settings(None, None, {"crm": 0.5, "imported": 0.7})["MEMSHELF_SOURCES"]
    assert told is not None and sources_from_text(told, "MEMSHELF_SOURCES") == {"crm": 0.5, "imported": 0.7}


@pytest.mark.slow
def test_memshelf_serve_declares_sources_for_http_and_mcp(tmp_path):
    secret = json.loads(ok(tmp_path, "--json", "keys", "create", "--tenant", "home").stdout)["secret"]
    port = closed_port()
    environment = {**os.environ, "MEMSHELF_DB": str(tmp_path / "memory.db"), "MEMSHELF_EMBEDDER": "none",
                   "MEMSHELF_ACCESS_LOG": "0"}
    server = subprocess.Popen([sys.executable, "-m", "memshelf.cli", "serve", "--port", str(port), "--sources",
                               "crm=0.5"], env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, headers=bearer(secret), timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.get("/health")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and server.poll() is None, "memshelf serve did not start"
                    time.sleep(0.2)
            stored = client.post("/v1/users/kaleb/memories", json={"topic": "t", "content": "x", "source": "crm"})
            assert stored.status_code == 201 and stored.json()["confidence"] == 0.5, stored.text

        async def remember_from_the_crm(session: ClientSession) -> None:
            remembered = await call(session, "remember", topic="t", content="y", source="crm")
            assert remembered["confidence"] == 0.5

        anyio.run(_with, http_session(url, secret, "kaleb"), remember_from_the_crm)
    finally:
        server.terminate()
        server.wait(timeout=30)


async def _with(opened: Any, check: Any) -> None:
    async with opened as session:
        await check(session)


# ---------------------------------------------------------------------------------------------- the MCP tools' terms

@asynccontextmanager
async def stdio(db: Path, entry: str, sources: str | None, env: dict[str, str] | None = None
                ) -> AsyncIterator[ClientSession]:
    owner = ["--db", str(db), "--tenant", "home", "--user", "kaleb", "--embedder", "none"]
    declared = [] if sources is None else ["--sources", sources]
    args = (["-m", "memshelf.mcp", *owner, *declared] if entry == "module"
            else ["-m", "memshelf.cli", *owner, *declared, "mcp"])
    params = StdioServerParameters(command=sys.executable, args=args,
                                   env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env or {})})
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def tool_advice_check(sources_given: bool):
    async def check(session: ClientSession) -> None:
        if sources_given:
            assert (await call(session, "remember", topic="t", content="x", source="crm"))["confidence"] == 0.5
        unknown = python_free(await call_error(session, "remember", topic="t", content="x", source="gossip"))
        assert "a new one is declared where the memshelf MCP server is started, e.g. MEMSHELF_SOURCES=gossip=0.8" \
            in unknown and "--sources" not in unknown
        missing = await call_error(session, "forget", memory_id=NO_ID)
        assert "call memories (or recall) for the ids" in missing
        assert "`memshelf" not in missing
    return check


@pytest.mark.slow
@pytest.mark.parametrize("entry, sources, env", [("module", "crm=0.5", None), ("cli", "crm=0.5", None),
                                                 ("module", None, {"MEMSHELF_SOURCES": "crm=0.5"})])
def test_mcp_over_stdio_declares_sources_and_advises_in_tools(tmp_path, entry, sources, env):
    anyio.run(_with, stdio(tmp_path / "mcp.db", entry, sources, env), tool_advice_check(True))


def test_mcp_module_refuses_malformed_sources_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "memshelf.mcp", "--db", str(tmp_path / "x.db"), "--tenant", "t",
                           "--user", "u", "--embedder", "none", "--sources", "crm=lots"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": ":".join(sys.path)},
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--sources: the worth of 'crm' is 'lots', not a number" in done.stderr


def test_mcp_over_http_advises_in_tools(tmp_path):
    db = tmp_path / "memshelf.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key("home")[1]
    with LiveServer(create_app(target=str(db), embedder=None)) as live:
        anyio.run(_with, http_session(live.url, secret, "kaleb"), tool_advice_check(False))


# ---------------------------------------------------------------------------------------------- the HTTP API's terms

@pytest.fixture
def api(tmp_path):
    db = tmp_path / "memshelf.db"
    with Shelf.open(db, embedder=None) as shelf:
        keys = {"home": shelf.create_key("home")[1], "admin": shelf.create_key(None)[1]}
    with TestClient(create_app(target=str(db), embedder=None, sources={"crm": 0.5}, mcp=False)) as client:
        yield client, keys


def http_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert "`memshelf" not in message and "--" not in message, message
    return python_free(message)


def test_http_errors_name_routes_not_commands(api):
    client, keys = api
    home, admin = bearer(keys["home"]), bearer(keys["admin"])
    assert "list the user's memory ids with GET /v1/users/ka%20leb/memories" in http_error(
        client.get(f"/v1/users/ka leb/memories/{NO_ID}", headers=home), 404)
    assert "list the user's memory ids with GET /v1/users/kaleb/memories" in http_error(
        client.delete(f"/v1/users/kaleb/memories/{NO_ID}", headers=home), 404)
    assert "list the user's facts with GET /v1/users/kaleb/facts" in http_error(
        client.delete("/v1/users/kaleb/facts/shoe_size", headers=home), 404)
    assert "list the keys with GET /v1/admin/keys" in http_error(
        client.delete("/v1/admin/keys/key_0123456789abcdef", headers=admin), 404)
    unknown = http_error(client.post("/v1/users/kaleb/memories", headers=home,
                                     json={"topic": "t", "content": "x", "source": "gossip"}), 422)
    assert "declared: stated=1.0, mined=0.6, inferred=0.4, crm=0.5" in unknown
    assert "a new one is declared where the server is started, e.g. MEMSHELF_SOURCES=gossip=0.8" in unknown
    semantic = http_error(client.post("/v1/users/kaleb/search", headers=home,
                                      json={"question": "printer", "mode": "semantic"}), 400)
    assert 'this server has no embedder: send "mode": "keyword"' in semantic
    blank = http_error(client.post("/v1/users/kaleb/search", headers=home, json={"question": "   "}), 422)
    assert "question is empty or only whitespace: pass the words to search for" in blank


def test_http_declares_sources_from_the_app_and_the_environment(api, monkeypatch, tmp_path):
    client, keys = api
    stored = client.post("/v1/users/kaleb/memories", headers=bearer(keys["home"]),
                         json={"topic": "t", "content": "x", "source": "crm"})
    assert stored.status_code == 201 and stored.json()["confidence"] == 0.5
    monkeypatch.setenv("MEMSHELF_SOURCES", "imported=0.7")
    with TestClient(create_app(target=str(tmp_path / "memshelf.db"), embedder=None, mcp=False)) as other:
        again = other.post("/v1/users/kaleb/memories", headers=bearer(keys["home"]),
                           json={"topic": "t", "content": "y", "source": "imported"})
    assert again.status_code == 201 and again.json()["confidence"] == 0.7


def test_http_search_by_meaning_counts_what_has_no_vector(tmp_path):
    db = tmp_path / "memshelf.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key("home")[1]
        shelf.remember(KALEB, "network", "The printer jams on thick paper.")
    with Shelf.open(db, embedder=HashEmbedder()) as shelf, TestClient(create_app(shelf, mcp=False)) as client:
        found = client.post("/v1/users/kaleb/search", headers=bearer(secret),
                            json={"question": "printer paper", "mode": "semantic"}).json()
        assert (found["hits"], found["unembedded"]) == ([], 1)
        shelf.backfill()
        found = client.post("/v1/users/kaleb/search", headers=bearer(secret),
                            json={"question": "printer paper", "mode": "semantic"}).json()
        assert len(found["hits"]) == 1 and found["unembedded"] == 0


# ---------------------------------------------------------------------------------------------- PostgreSQL set-up

def test_a_login_role_that_may_not_set_up_gets_the_sql_to_run(pg_server):
    """A role that is no superuser, in a database it does not own, with no extension: the error prints the SQL a
    superuser runs once, and after running exactly that, the same URL opens."""
    database = pg_server.empty_database("memshelf_nosetup")
    role = f"alice-{os.getpid()}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN PASSWORD \'pw\' NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB')
    parts = httpx.URL(database)
    url = str(parts.copy_with(username=role, password="pw"))
    with pytest.raises(Exception) as refused:
        Shelf.open(url, embedder=None)
    message = str(refused.value)
    assert "docstring" not in message and "\n" not in message
    found = re.search(r"run once as a superuser in database \S+: (.*;) Then retry", message)
    assert found, message
    assert found.group(1) == (f'ALTER SCHEMA "public" OWNER TO "{role}"; CREATE EXTENSION IF NOT EXISTS vector; '
                              "CREATE EXTENSION IF NOT EXISTS unaccent; GRANT memshelf_app, memshelf_admin TO "
                              f'"{role}";')
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(found.group(1))
    with Shelf.open(url, embedder=None) as shelf:
        assert shelf.remember(KALEB, "t", "set up").confidence == 1.0


def test_the_setup_sql_creates_only_what_is_missing():
    nothing = setup_sql("ops", "mem", "public", owns_schema=True, extensions=set(), roles={})
    assert nothing.endswith("CREATE EXTENSION IF NOT EXISTS vector; CREATE EXTENSION IF NOT EXISTS unaccent; "
                            "CREATE ROLE memshelf_app NOLOGIN; CREATE ROLE memshelf_admin NOLOGIN; GRANT "
                            'memshelf_app, memshelf_admin TO "ops"; Then retry')
    members = {"memshelf_app": True, "memshelf_admin": True}
    done = setup_sql("ops", "mem", "public", owns_schema=True, extensions={"vector", "unaccent"}, roles=members)
    assert "ALTER TABLE <table> OWNER TO \"ops\"" in done and "CREATE" not in done
