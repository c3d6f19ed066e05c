"""Embedders: the registry, the Ollama and OpenAI clients against loopback fakes, and the real offline model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
from fakes import FakeOllama, FakeOpenAI, HashEmbedder, SilentServer, TricklingOllama, hash_vector

import memshelf.embedders
from memshelf.embedders import (
    LocalEmbedder,
    OllamaEmbedder,
    OpenAIEmbedder,
    default_embedder_spec,
    register_embedder,
    registered_providers,
    resolve_embedder,
)
from memshelf import Owner, Shelf
from memshelf.embedders import base
from memshelf.embedders.base import embedding_deadline, embedding_time_left, search_timeout, write_timeout
from memshelf.embedders.local import local_model_available
from memshelf.embedders.ollama import resolve_ollama_host
from memshelf.errors import ConfigError, DimensionMismatch, EmbedderError, EmbedderUnavailable


def expected_rows(texts: list[str], dims: int = 64) -> np.ndarray:
    return np.asarray([hash_vector(text, dims) for text in texts], dtype=np.float32)


def numbered_texts(count: int) -> list[str]:
    return [f"note number {index} about topic{index % 7}" for index in range(count)]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OLLAMA_HOST", "OPENAI_BASE_URL", "OPENAI_API_KEY", "MEMSHELF_EMBEDDER",
                 "MEMSHELF_EMBED_WRITE_TIMEOUT", "MEMSHELF_EMBED_SEARCH_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def private_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a test register providers without leaking them into the rest of the session."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))


@pytest.fixture
def ollama_client() -> Iterator[Callable[..., OllamaEmbedder]]:
    made: list[OllamaEmbedder] = []

    def make(**kwargs: object) -> OllamaEmbedder:
        made.append(OllamaEmbedder(**kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for embedder in made:
        embedder.close()


@pytest.fixture
def openai_client() -> Iterator[Callable[..., OpenAIEmbedder]]:
    made: list[OpenAIEmbedder] = []

    def make(**kwargs: object) -> OpenAIEmbedder:
        made.append(OpenAIEmbedder(**kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for embedder in made:
        embedder.close()


# --- registry ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [None, "none", "None", " none ", "", "off", "keyword"])
def test_no_embedder_specs_resolve_to_none(spec: str | None) -> None:
    assert resolve_embedder(spec) is None


def test_importing_the_package_registers_the_builtin_providers() -> None:
    assert {"local", "ollama", "openai", "static"} <= set(registered_providers())


@pytest.mark.parametrize(
    "spec", ["local", "local:all-MiniLM-L6-v2", "LOCAL", "local:sentence-transformers/all-MiniLM-L6-v2"]
)
def test_local_spec_builds_the_offline_model_with_known_dimensions(spec: str) -> None:
    embedder = resolve_embedder(spec)
    assert isinstance(embedder, LocalEmbedder)
    assert embedder.model == "local:all-MiniLM-L6-v2"
    assert embedder.dimensions == 384


def test_local_spec_with_another_model_says_only_minilm_ships() -> None:
    with pytest.raises(EmbedderError, match="only ships all-MiniLM-L6-v2"):
        resolve_embedder("local:bge-small-en")


@pytest.mark.parametrize(
    ("spec", "stamp", "name"),
    [
        ("ollama:nomic-embed-text", "ollama:nomic-embed-text", "nomic-embed-text"),
        ("ollama", "ollama:nomic-embed-text", "nomic-embed-text"),
        ("ollama:mxbai-embed-large:335m", "ollama:mxbai-embed-large:335m", "mxbai-embed-large:335m"),
    ],
)
def test_ollama_spec(spec: str, stamp: str, name: str) -> None:
    embedder = resolve_embedder(spec)
    assert isinstance(embedder, OllamaEmbedder)
    assert (embedder.model, embedder.model_name, embedder.host) == (stamp, name, "http://localhost:11434")
    embedder.close()


@pytest.mark.parametrize(
    ("spec", "stamp"),
    [("openai:text-embedding-3-small", "openai:text-embedding-3-small"), ("openai", "openai:text-embedding-3-small")],
)
def test_openai_spec(spec: str, stamp: str) -> None:
    embedder = resolve_embedder(spec)
    assert isinstance(embedder, OpenAIEmbedder)
    assert (embedder.model, embedder.base_url) == (stamp, "https://api.openai.com/v1")
    embedder.close()


def test_an_embedder_object_is_used_as_is() -> None:
    embedder = HashEmbedder()
    assert resolve_embedder(embedder) is embedder


def test_a_duck_typed_embedder_is_used_as_is() -> None:
    class Duck:
        model = "duck:1"

        def embed_batch(self, texts: list[str]) -> np.ndarray:
            return np.ones((len(texts), 2), dtype=np.float32)

    duck = Duck()
    assert resolve_embedder(duck) is duck


class ListEmbedder:
    """An embedder as other libraries write them: embed_batch returns plain lists (or a list of arrays)."""

    def __init__(self, shape: Callable[[list[float]], object] = list, drop: int = 0) -> None:
        self.model, self.shape, self.drop = "lists:1", shape, drop

    def embed_batch(self, texts: list[str]) -> object:
        return [self.shape(hash_vector(text)) for text in texts][self.drop:]


@pytest.mark.parametrize("shape", [list, tuple, np.array], ids=["lists", "tuples", "arrays"])
def test_an_embedder_returning_any_sequence_of_vectors_works(tmp_path: Path, shape: Callable[[list[float]], object]
                                                              ) -> None:
    with Shelf.open(tmp_path / "m.db", embedder=ListEmbedder(shape)) as shelf:
        owner = Owner("home", "kaleb")
        printer = shelf.remember(owner, "office", "The office printer is on 192.168.1.40.")
        shelf.remember(owner, "garden", "Tomatoes need water every morning.")
        assert shelf.get(owner, printer.id).embed_model == "lists:1"
        assert [hit.memory.id for hit in shelf.search(owner, "printer", mode="semantic", limit=1)] == [printer.id]


@pytest.mark.parametrize(("embedder", "advice"), [
    (ListEmbedder(drop=1), "returned 0 vectors for 1 texts: return exactly one vector per text"),
    (ListEmbedder(shape=lambda vector: {"embedding": vector}), "return a numpy array of shape (len(texts), dim"),
    (ListEmbedder(shape=lambda vector: [vector, vector]), "returned list, not one vector per text"),
], ids=["too-few", "dicts", "matrices"])
def test_an_embedder_returning_something_else_says_what_to_return(tmp_path: Path, embedder: ListEmbedder,
                                                                   advice: str) -> None:
    with Shelf.open(tmp_path / "m.db", embedder=embedder) as shelf:
        with pytest.raises(EmbedderError, match=re.escape(advice)):
            shelf.search(Owner("home", "kaleb"), "printer", mode="semantic")


def test_unknown_provider_names_the_registered_ones() -> None:
    with pytest.raises(EmbedderError) as caught:
        resolve_embedder("cohere:embed-english-v3.0")
    message = str(caught.value)
    assert "'cohere'" in message
    assert "local, ollama, openai" in message
    assert "register_embedder" in message


def test_something_that_is_not_a_spec_is_refused() -> None:
    with pytest.raises(EmbedderError, match="got int"):
        resolve_embedder(42)


def test_a_user_registered_provider_is_resolved(private_registry: None) -> None:
    register_embedder("hash", lambda model: HashEmbedder(model=f"hash:{model or 'default'}", dims=16))
    embedder = resolve_embedder("hash:wide")
    assert isinstance(embedder, HashEmbedder)
    assert embedder.model == "hash:wide"
    assert resolve_embedder("hash").model == "hash:default"  # type: ignore[union-attr]
    assert "hash" in registered_providers()
    with pytest.raises(EmbedderError, match="hash, local, ollama, openai"):
        resolve_embedder("nope")


def test_default_spec_is_the_environment_variable_then_the_local_model(monkeypatch: pytest.MonkeyPatch) -> None:
    assert local_model_available()  # the test environment installs the 'local' extra
    assert default_embedder_spec() == "local"
    monkeypatch.setenv("MEMSHELF_EMBEDDER", "ollama:nomic-embed-text")
    assert default_embedder_spec() == "ollama:nomic-embed-text"


def test_importing_the_package_does_not_import_torch() -> None:
    source_root = Path(memshelf.embedders.__file__).resolve().parents[2]
    code = (
        "import sys, memshelf.embedders as e; e.resolve_embedder('local'); "
        "print(sorted(m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "[]"


def test_hash_embedder_ranks_shared_words_higher() -> None:
    vectors = HashEmbedder().embed_batch(["the printer jams", "printer paper jams", "coffee at seven"])
    assert vectors.shape == (3, 64)
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])


# --- Ollama ------------------------------------------------------------------------------------------------------


def test_ollama_batches_requests_and_keeps_order(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    texts = numbered_texts(150)
    with FakeOllama() as fake:
        vectors = ollama_client(host=fake.url, batch_size=64).embed_batch(texts)
    assert [len(request.body["input"]) for request in fake.requests] == [64, 64, 22]
    assert fake.paths == ["/api/embed"] * 3
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, expected_rows(texts), atol=1e-6)


def test_ollama_sends_the_model_name(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with FakeOllama(models=["mxbai-embed-large"]) as fake:
        ollama_client(model="mxbai-embed-large", host=fake.url).embed("hello")
    assert fake.requests[0].body == {"model": "mxbai-embed-large", "input": ["hello"]}


def test_ollama_empty_input_sends_nothing(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with FakeOllama() as fake:
        embedder = ollama_client(host=fake.url)
        assert embedder.embed_batch([]).shape == (0, 0)
        assert fake.requests == []
        assert embedder.dimensions == 64  # learned from one call
        assert embedder.embed_batch([]).shape == (0, 64)
    assert len(fake.requests) == 1


def test_ollama_falls_back_to_the_legacy_endpoint_for_good(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with FakeOllama(legacy=True) as fake:
        embedder = ollama_client(host=fake.url)
        first = embedder.embed_batch(["printer jams", "coffee maker"])
        second = embedder.embed_batch(["hall printer"])
    assert fake.paths == ["/api/embed", "/api/embeddings", "/api/embeddings", "/api/embeddings"]
    assert [request.body["prompt"] for request in fake.requests[1:]] == ["printer jams", "coffee maker", "hall printer"]
    # the legacy endpoint answers unnormalized vectors; the client normalizes so both endpoints agree
    np.testing.assert_allclose(first, expected_rows(["printer jams", "coffee maker"]), atol=1e-6)
    np.testing.assert_allclose(second, expected_rows(["hall printer"]), atol=1e-6)


def test_ollama_missing_model_says_to_pull_it(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with FakeOllama(models=["nomic-embed-text"]) as fake:
        with pytest.raises(EmbedderError, match=r"`ollama pull all-minilm`"):
            ollama_client(model="all-minilm", host=fake.url).embed("hello")
    assert fake.paths == ["/api/embed"]  # a model-not-found 404 is not mistaken for an old server


def test_ollama_missing_model_on_a_legacy_server_says_to_pull_it(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with FakeOllama(legacy=True, models=["nomic-embed-text"]) as fake:
        with pytest.raises(EmbedderError, match=r"`ollama pull all-minilm`"):
            ollama_client(model="all-minilm", host=fake.url).embed("hello")
    assert fake.paths == ["/api/embed", "/api/embeddings"]


@pytest.mark.parametrize("status", [500, 503, 429])
def test_ollama_server_errors_are_unavailable(status: int, ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with FakeOllama(fail_status=status) as fake:
        with pytest.raises(EmbedderUnavailable) as caught:
            ollama_client(host=fake.url).embed("hello")
    message = str(caught.value)
    assert fake.url in message and f"HTTP {status}" in message and "ollama serve" in message


def test_ollama_bad_request_is_an_error_quoting_the_server(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with FakeOllama(fail_status=400) as fake:
        with pytest.raises(EmbedderError, match=r"HTTP 400: fake failure"):
            ollama_client(host=fake.url).embed("hello")


def test_ollama_timeout_is_unavailable(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with FakeOllama(delay=2.0) as fake:
        started = time.monotonic()
        with pytest.raises(EmbedderUnavailable, match="did not answer in time"):
            ollama_client(host=fake.url, timeout=0.2).embed("hello")
        assert time.monotonic() - started < 1.5


def test_ollama_stopped_server_is_unavailable(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    fake = FakeOllama().start()
    embedder = ollama_client(host=fake.url)
    assert embedder.embed("up").shape == (64,)
    fake.stop()
    with pytest.raises(EmbedderUnavailable) as caught:
        embedder.embed("down")
    message = str(caught.value)
    assert embedder.host in message
    assert "ollama serve" in message and "OLLAMA_HOST" in message


def test_ollama_reply_with_other_dimensions_is_a_mismatch(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with FakeOllama() as fake:
        embedder = ollama_client(host=fake.url)
        embedder.embed("first")
        fake.dims = 32  # someone re-pulled another model under the same name
        with pytest.raises(DimensionMismatch):
            embedder.embed("second")


@pytest.mark.parametrize(
    ("value", "url"),
    [
        (None, "http://localhost:11434"),
        ("", "http://localhost:11434"),
        ("0.0.0.0", "http://localhost:11434"),
        ("0.0.0.0:8080", "http://localhost:8080"),
        ("[::]:8080", "http://localhost:8080"),
        (":5000", "http://localhost:5000"),
        ("example.com", "http://example.com:11434"),
        ("example.com:1234", "http://example.com:1234"),
        ("10.0.0.5", "http://10.0.0.5:11434"),
        ("http://example.com:1234", "http://example.com:1234"),
        ("http://example.com:1234/", "http://example.com:1234"),
        ("http://example.com", "http://example.com:80"),
        ("https://example.com", "https://example.com:443"),
        ("https://example.com/ollama/", "https://example.com:443/ollama"),
        ("[::1]", "http://[::1]:11434"),
        ("[::1]:9000", "http://[::1]:9000"),
        ('"example.com:1234"', "http://example.com:1234"),
    ],
)
def test_ollama_host_is_read_like_ollama_reads_it(
    value: str | None, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is not None:
        monkeypatch.setenv("OLLAMA_HOST", value)
    assert resolve_ollama_host() == url


@pytest.mark.parametrize("value", ["ftp://example.com", "example.com:port"])
def test_ollama_unusable_host_is_an_error(value: str) -> None:
    with pytest.raises(EmbedderError, match="localhost:11434"):
        resolve_ollama_host(value)


def test_ollama_uses_ollama_host_and_the_argument_wins(
    monkeypatch: pytest.MonkeyPatch, ollama_client: Callable[..., OllamaEmbedder]
) -> None:
    with FakeOllama() as fake:
        monkeypatch.setenv("OLLAMA_HOST", fake.url.removeprefix("http://"))
        from_env = ollama_client()
        assert from_env.host == fake.url
        from_env.embed("from the environment")
        monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:1")
        ollama_client(host=fake.url).embed("from the argument")
    assert [request.body["input"] for request in fake.requests] == [["from the environment"], ["from the argument"]]


# --- OpenAI ------------------------------------------------------------------------------------------------------


def test_openai_batches_requests_and_keeps_order(openai_client: Callable[..., OpenAIEmbedder]) -> None:
    texts = numbered_texts(600)
    with FakeOpenAI() as fake:
        vectors = openai_client(base_url=fake.url).embed_batch(texts)
    assert [len(request.body["input"]) for request in fake.requests] == [256, 256, 88]
    assert fake.paths == ["/v1/embeddings"] * 3
    assert fake.requests[0].body["model"] == "text-embedding-3-small"
    np.testing.assert_allclose(vectors, expected_rows(texts), atol=1e-6)


def test_openai_reorders_shuffled_replies_by_index(openai_client: Callable[..., OpenAIEmbedder]) -> None:
    texts = numbered_texts(20)
    with FakeOpenAI(shuffle=True) as fake:
        raw = httpx.post(f"{fake.url}/embeddings", json={"model": "m", "input": texts}).json()
        vectors = openai_client(base_url=fake.url, batch_size=8).embed_batch(texts)
    assert [item["index"] for item in raw["data"]] != list(range(20))  # the fake really does shuffle
    np.testing.assert_allclose(vectors, expected_rows(texts), atol=1e-6)


def test_openai_sends_the_bearer_key(openai_client: Callable[..., OpenAIEmbedder]) -> None:
    with FakeOpenAI(api_key="sk-test") as fake:
        vectors = openai_client(base_url=fake.url, api_key="sk-test").embed_batch(["hello"])
    assert vectors.shape == (1, 64)
    assert fake.requests[0].headers["authorization"] == "Bearer sk-test"


def test_openai_without_a_key_sends_no_authorization(openai_client: Callable[..., OpenAIEmbedder]) -> None:
    with FakeOpenAI() as fake:
        openai_client(base_url=fake.url).embed("hello")
    assert "authorization" not in fake.requests[0].headers


@pytest.mark.parametrize("key", ["sk-wrong", None])
def test_openai_rejected_key_says_to_set_it(key: str | None, openai_client: Callable[..., OpenAIEmbedder]) -> None:
    with FakeOpenAI(api_key="sk-right") as fake:
        with pytest.raises(EmbedderError) as caught:
            openai_client(base_url=fake.url, api_key=key).embed("hello")
    message = str(caught.value)
    assert "HTTP 401" in message and "Incorrect API key" in message and "OPENAI_API_KEY" in message
    assert "sk-wrong" not in message


@pytest.mark.parametrize("status", [429, 500, 502])
def test_openai_rate_limits_and_server_errors_are_unavailable(
    status: int, openai_client: Callable[..., OpenAIEmbedder]
) -> None:
    with FakeOpenAI(fail_status=status) as fake:
        with pytest.raises(EmbedderUnavailable, match=f"HTTP {status}"):
            openai_client(base_url=fake.url).embed("hello")


def test_openai_other_client_errors_quote_the_server(openai_client: Callable[..., OpenAIEmbedder]) -> None:
    with FakeOpenAI(models=["text-embedding-3-small"]) as fake:
        with pytest.raises(EmbedderError, match="The model `text-embedding-4` does not exist"):
            openai_client(base_url=fake.url, model="text-embedding-4").embed("hello")


def test_openai_timeout_and_outage_are_unavailable(openai_client: Callable[..., OpenAIEmbedder]) -> None:
    with FakeOpenAI(delay=2.0) as slow:
        with pytest.raises(EmbedderUnavailable, match="did not answer in time"):
            openai_client(base_url=slow.url, timeout=0.2).embed("hello")
    fake = FakeOpenAI().start()
    embedder = openai_client(base_url=fake.url)
    fake.stop()
    with pytest.raises(EmbedderUnavailable, match="cannot reach"):
        embedder.embed("hello")


def test_openai_reads_base_url_and_key_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, openai_client: Callable[..., OpenAIEmbedder]
) -> None:
    with FakeOpenAI(api_key="sk-env") as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.url + "/")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
        embedder = openai_client()
        assert embedder.base_url == fake.url
        assert embedder.embed("hello").shape == (64,)
    assert fake.requests[0].headers["authorization"] == "Bearer sk-env"


def test_openai_dimensions_are_requested_and_known_up_front(openai_client: Callable[..., OpenAIEmbedder]) -> None:
    with FakeOpenAI() as fake:
        embedder = openai_client(base_url=fake.url, dimensions=32)
        assert embedder.embed_batch([]).shape == (0, 32)
        assert fake.requests == []
        assert embedder.embed_batch(["a", "b"]).shape == (2, 32)
    assert fake.requests[0].body["dimensions"] == 32


# --- deadlines: a hung service never holds a caller past its deadline ---------------------------------------------


def test_a_trickling_reply_is_cut_at_the_request_deadline(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with TricklingOllama(interval=1.0) as fake:
        embedder = ollama_client(host=fake.url, timeout=2.5)
        started = time.monotonic()
        with pytest.raises(EmbedderUnavailable, match="did not answer in time"):
            embedder.embed("hello")
        elapsed = time.monotonic() - started
    assert fake.bytes_sent >= 2  # every read got a byte within a second: a per-read timeout never fires
    assert 2.0 < elapsed < 4.0


def test_a_caller_deadline_shortens_the_embedders_own(openai_client: Callable[..., OpenAIEmbedder]) -> None:
    with SilentServer() as silent:
        embedder = openai_client(base_url=f"{silent.url}/v1", timeout=30.0)
        started = time.monotonic()
        with embedding_deadline(0.5), pytest.raises(EmbedderUnavailable, match="did not answer in time"):
            embedder.embed("hello")
        assert time.monotonic() - started < 2.0
    assert silent.connections == 1


def test_a_deadline_is_kept_by_the_service_that_answers(ollama_client: Callable[..., OllamaEmbedder]) -> None:
    with FakeOllama() as fake, embedding_deadline(5.0):
        assert ollama_client(host=fake.url).embed_batch(numbered_texts(100)).shape == (100, 64)


def test_deadlines_nest_and_the_earlier_one_wins() -> None:
    assert embedding_time_left() is None
    with embedding_deadline(1.0):
        with embedding_deadline(60.0):
            left = embedding_time_left()
            assert left is not None and 0 < left <= 1.0
        with embedding_deadline(None):
            assert 0 < (embedding_time_left() or 0) <= 1.0
    assert embedding_time_left() is None


def test_the_write_and_search_deadlines_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (write_timeout(), search_timeout()) == (base.WRITE_TIMEOUT, base.SEARCH_TIMEOUT)
    monkeypatch.setenv("MEMSHELF_EMBED_WRITE_TIMEOUT", "0.25")
    monkeypatch.setenv("MEMSHELF_EMBED_SEARCH_TIMEOUT", "7")
    assert (write_timeout(), search_timeout()) == (0.25, 7.0)


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "1e9"])
def test_an_unusable_deadline_setting_says_what_to_set(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSHELF_EMBED_WRITE_TIMEOUT", value)
    with pytest.raises(ConfigError, match="MEMSHELF_EMBED_WRITE_TIMEOUT must be a number of seconds"):
        write_timeout()


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), True])
def test_an_unusable_embedder_timeout_is_refused(timeout: float) -> None:
    with pytest.raises(EmbedderError, match="timeout must be"):
        OllamaEmbedder(timeout=timeout)


HUNG_SERVICES = {"silent": lambda: SilentServer(), "trickling": lambda: TricklingOllama(interval=1.0)}


@pytest.mark.parametrize("hung", sorted(HUNG_SERVICES))
def test_writes_and_searches_do_not_wait_for_a_hung_service(
    hung: str, open_shelf: Callable[..., Shelf], monkeypatch: pytest.MonkeyPatch,
    ollama_client: Callable[..., OllamaEmbedder],
) -> None:
    """remember, search and import give a hung embedding service their deadline, not the embedder's 30 s: the
    memory is stored without a vector and found by keywords, the search says it degraded, and a later backfill
    embeds what was stored."""
    monkeypatch.setenv("MEMSHELF_EMBED_WRITE_TIMEOUT", "1")
    monkeypatch.setenv("MEMSHELF_EMBED_SEARCH_TIMEOUT", "1")
    owner = Owner("home", "kaleb")
    with HUNG_SERVICES[hung]() as service:
        shelf = open_shelf(embedder=ollama_client(host=service.url))  # the embedder's own timeout: 30 s
        started = time.monotonic()
        memory = shelf.remember(owner, "network", "The office printer is on 192.168.1.40.")
        assert time.monotonic() - started < 3.0
        assert memory.embed_model is None
        started = time.monotonic()
        result = shelf.search(owner, "printer")
        assert time.monotonic() - started < 3.0
        started = time.monotonic()
        assert shelf.import_(Owner("home", "maya"), shelf.export(owner))["memories"] == 1
        assert time.monotonic() - started < 3.0
    assert result.degraded and "did not answer in time" in result.reason
    assert [hit.memory.id for hit in result] == [memory.id]
    with FakeOllama() as fake:
        healthy = open_shelf(embedder=ollama_client(host=fake.url))
        assert healthy.backfill() == 2
        found = healthy.search(owner, "where is the office printer", mode="semantic")
    assert [hit.memory.id for hit in found] == [memory.id]


def test_an_embedder_without_deadline_support_still_works(open_shelf: Callable[..., Shelf]) -> None:
    class Plain:  # a third-party embedder: one method and a model name, nothing else
        model = "plain:hash"

        def embed_batch(self, texts: list[str]) -> np.ndarray:
            return np.asarray([hash_vector(text, 16) for text in texts], dtype=np.float32).reshape(len(texts), 16)

    shelf = open_shelf(embedder=Plain())
    owner = Owner("home", "kaleb")
    stored = shelf.remember(owner, "network", "The printer jams on thick paper.")
    given = shelf.remember_many(owner, [{"topic": "t", "content": "coffee at seven",
                                         "vector": hash_vector("coffee at seven", 16)}])[0]
    assert (stored.embed_model, given.embed_model) == ("plain:hash", "plain:hash")
    with pytest.raises(DimensionMismatch, match="plain:hash"):
        shelf.remember_many(owner, [{"topic": "t", "content": "x", "vector": [1.0, 0.0]}])
    result = shelf.search(owner, "printer paper", mode="semantic")
    assert result[0].memory.id == stored.id and not result.degraded


# --- precomputed vectors are checked without asking the service --------------------------------------------------

DOWN_SERVICES = {
    "ollama": (FakeOllama, lambda url: OllamaEmbedder(host=url), "ollama:nomic-embed-text"),
    "openai": (FakeOpenAI, lambda url: OpenAIEmbedder(base_url=url), "openai:text-embedding-3-small"),
}


def _vector_item(text: str, dims: int = 64) -> dict[str, object]:
    return {"topic": "notes", "content": text, "vector": hash_vector(text, dims)}


@pytest.mark.parametrize("provider", sorted(DOWN_SERVICES))
def test_precomputed_vectors_are_checked_by_what_is_stored_while_the_service_is_down(
    provider: str, open_shelf: Callable[..., Shelf]
) -> None:
    fake_class, make, stamp = DOWN_SERVICES[provider]
    owner = Owner("home", "kaleb")
    service = fake_class().start()
    up = make(service.url)
    open_shelf(embedder=up).remember(owner, "notes", "made while the service was up")
    service.stop()
    down = make(service.url)  # a new process: the embedder has never heard from the service
    shelf = open_shelf(embedder=down)
    try:
        kept = shelf.remember_many(owner, [_vector_item("the printer jams"), _vector_item("coffee")])
        assert [m.embed_model for m in kept] == [stamp, stamp]
        with pytest.raises(DimensionMismatch) as caught:
            shelf.remember_many(owner, [_vector_item("fine"), _vector_item("too short", 32)])
        message = str(caught.value)
        assert f"32 dimensions but {stamp} makes 64-d vectors (as the vectors home/kaleb has stored show)" in message
        assert "Nothing was stored" in message
        memories, _ = shelf.list_memories(owner)
        assert len(memories) == 3
        found = shelf.search(owner, "printer jams", mode="keyword")
        assert found[0].memory.id == kept[0].id
    finally:
        up.close()
        down.close()


@pytest.mark.parametrize("provider", sorted(DOWN_SERVICES))
def test_precomputed_vectors_of_a_new_owner_use_what_the_embedder_learned(
    provider: str, open_shelf: Callable[..., Shelf]
) -> None:
    fake_class, make, stamp = DOWN_SERVICES[provider]
    service = fake_class().start()
    embedder = make(service.url)
    embedder.embed("the service answers once")
    service.stop()
    shelf = open_shelf(embedder=embedder)
    newcomer = Owner("home", "maya")
    try:
        with pytest.raises(DimensionMismatch, match=f"{stamp} makes 64-d vectors \\(as the embedder reports\\)"):
            shelf.remember_many(newcomer, [_vector_item("wrong model", 32)])
        assert shelf.remember_many(newcomer, [_vector_item("right model")])[0].embed_model == stamp
    finally:
        embedder.close()


def test_when_nothing_is_known_the_first_vector_sets_the_length(open_shelf: Callable[..., Shelf]) -> None:
    service = FakeOllama().start()
    service.stop()
    embedder = OllamaEmbedder(host=service.url)
    shelf = open_shelf(embedder=embedder)
    owner = Owner("home", "kaleb")
    try:
        with pytest.raises(DimensionMismatch, match="makes 48-d vectors \\(as the first vector of this batch says\\)"):
            shelf.remember_many(owner, [_vector_item("a", 48), _vector_item("b", 64)])
        assert shelf.list_memories(owner)[0] == []
        assert shelf.remember_many(owner, [_vector_item("a", 48)])[0].embed_model == "ollama:nomic-embed-text"
        with pytest.raises(DimensionMismatch, match=r"makes 48-d vectors \(as the vectors home/kaleb has stored"):
            shelf.remember_many(owner, [_vector_item("b", 64)])
    finally:
        embedder.close()


# --- the real offline model ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_local_model_gives_normalized_384_d_vectors(local_embedder: LocalEmbedder) -> None:
    vectors = local_embedder.embed_batch(["The printer jams on thick paper.", "hello"])
    assert local_embedder.model == "local:all-MiniLM-L6-v2"
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert local_embedder.embed_batch([]).shape == (0, 384)


@pytest.mark.slow
def test_local_model_is_deterministic_and_batching_keeps_order(local_embedder: LocalEmbedder) -> None:
    texts = ["The printer jams on thick paper.", "The office printer is on 192.168.1.40.", "coffee"]
    batch = local_embedder.embed_batch(texts)
    np.testing.assert_allclose(local_embedder.embed_batch(texts), batch, atol=1e-6)
    for text, row in zip(texts, batch):
        np.testing.assert_allclose(local_embedder.embed(text), row, atol=1e-4)
    assert cosine(batch[0], batch[2]) < 0.9  # different texts really get different vectors


@pytest.mark.slow
def test_local_model_finds_meaning_not_spelling(local_embedder: LocalEmbedder) -> None:
    question, printer, coffee = local_embedder.embed_batch(
        [
            "what is the thing in the hall that eats paper",
            "The printer jams on thick paper.",
            "The morning routine starts the coffee maker at 07:00.",
        ]
    )
    assert cosine(question, printer) > cosine(question, coffee) + 0.1


# --- the local model's two runtimes: ONNX Runtime (the default) and torch ------------------------------------------

def _utterances() -> list[str]:
    import json

    folder = Path(__file__).resolve().parent / "data"
    return [json.loads(line)["text"] for name in ("utterances.jsonl", "utterances_heldout.jsonl",
                                                  "utterances_heldout2.jsonl")
            for line in (folder / name).read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.slow
def test_onnx_gives_torchs_vectors_and_the_same_search_results(local_embedder: LocalEmbedder) -> None:
    from memshelf.embedders import local

    assert local.runtime() == "onnx"  # the test extra installs onnxruntime, so the default is the graph
    torch_model = local._shared_model()
    corpus = _utterances()
    odd = ["", "ok", "東京の天気は晴れです。", "naïve café ✓ " * 40, "printer " * 400]  # empty, CJK, truncated
    ours = local_embedder.embed_batch(corpus + odd)
    theirs = torch_model.encode(corpus + odd, normalize_embeddings=True, convert_to_numpy=True,
                                show_progress_bar=False)
    assert float(np.abs(ours - theirs).max()) < 1e-5
    questions = ["what is my name?", "where do I live?", "which food do I like?", "when is my birthday?",
                 "what do I do for work?", "do I have pets?"]
    for question in questions:
        q_ours, q_theirs = local_embedder.embed(question), torch_model.encode(question, normalize_embeddings=True)
        top_ours = np.argsort(-(ours[:len(corpus)] @ q_ours), kind="stable")[:10]
        top_theirs = np.argsort(-(theirs[:len(corpus)] @ q_theirs), kind="stable")[:10]
        assert top_ours.tolist() == top_theirs.tolist(), question


@pytest.mark.slow
def test_a_damaged_or_disagreeing_graph_is_never_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture,
                                                      local_embedder: LocalEmbedder) -> None:
    from memshelf.embedders import _onnx, local

    monkeypatch.setenv("MEMSHELF_CACHE_DIR", str(tmp_path))
    graph = tmp_path / "minilm.onnx"
    graph.write_bytes(b"half a file")
    older = tmp_path / "minilm-1234.onnx"  # the graph of earlier weights of the model: replaced by the new one
    older.write_bytes(b"an old graph")
    model = _onnx.load(local._model_dir(), "minilm", local._shared_model)
    assert model is not None and graph.stat().st_size > 1_000_000 and "exporting it again" in caplog.text
    assert not older.exists()
    np.testing.assert_allclose(model.encode(["hello"])[0], local_embedder.embed("hello"), atol=1e-6)
    graph.unlink()
    monkeypatch.setattr(_onnx, "AGREEMENT", -1.0)  # any difference at all is too much
    assert _onnx.load(local._model_dir(), "minilm", local._shared_model) is None
    assert not graph.exists() and "runs on torch" in caplog.text
    assert list(tmp_path.iterdir()) == []  # no half-written file left behind


@pytest.mark.slow
def test_a_process_with_the_graph_made_never_imports_torch(local_embedder: LocalEmbedder) -> None:
    code = ("import sys; from memshelf.embedders.local import LocalEmbedder, runtime; "
            "v = LocalEmbedder().embed_batch(['Where is the printer?']); "
            "print(runtime(), v.shape, sorted(m for m in ('torch', 'sentence_transformers', 'transformers') "
            "if m in sys.modules))")
    for choice, expected in [("onnx", "onnx (1, 384) []"),
                             ("torch", "torch (1, 384) ['sentence_transformers', 'torch', 'transformers']")]:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "MEMSHELF_LOCAL_RUNTIME": choice})
        assert proc.stdout.strip() == expected, (proc.stdout, proc.stderr)


# --- the static embedder, distilled from the local model ---------------------------------------------------------

def test_static_spec_builds_the_distilled_embedder_and_refuses_other_models() -> None:
    from memshelf.embedders.static import StaticEmbedder

    embedder = resolve_embedder("static")
    assert isinstance(embedder, StaticEmbedder)
    assert (embedder.model, embedder.dimensions) == ("static:all-MiniLM-L6-v2", 256)
    assert embedder.model != LocalEmbedder().model  # its vectors are never compared with the model's
    with pytest.raises(EmbedderError, match="distilled from all-MiniLM-L6-v2 only"):
        resolve_embedder("static:nomic-embed-text")


@pytest.mark.slow
def test_the_static_embedder_is_distilled_once_and_finds_by_meaning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   local_embedder: LocalEmbedder) -> None:
    from memshelf.embedders import static

    monkeypatch.setattr(static, "_table", None)
    # the local model's graph, already made this session, so only the table is distilled here
    monkeypatch.setattr(static._onnx, "cache_dir", lambda: tmp_path)
    embedder = static.StaticEmbedder()
    texts = ["The office printer is on 192.168.1.40.", "Where is the printer?", "I love hiking in the Alps.",
             "printer " * 5000]
    vectors = embedder.embed_batch(texts)
    assert [p.name for p in tmp_path.glob("static-*.npy")] != []
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[1] @ vectors[0] > vectors[1] @ vectors[2] + 0.1
    assert embedder.pieces([texts[3]]) == [[texts[3]]]  # read whole, however long

    monkeypatch.setattr(static, "_table", None)  # a new process: the table is read back, not distilled again
    monkeypatch.setattr(static, "distil", lambda model_dir: pytest.fail("distilled a second time"))
    assert np.array_equal(embedder.embed_batch(texts), vectors)

    with Shelf.open(tmp_path / "memory.db", embedder="static") as shelf:
        owner = Owner("home", "kaleb")
        shelf.remember_many(owner, [{"topic": "network", "content": texts[0]},
                                    {"topic": "trips", "content": "We spent a week walking in the mountains."}])
        hits = shelf.search(owner, "Where can I print?", mode="semantic", limit=1)
        assert [h.memory.content for h in hits] == [texts[0]]


def test_a_damaged_static_table_is_distilled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    from memshelf.embedders import static

    table = tmp_path / "table.npy"
    table.write_bytes(b"not a numpy file")
    made = np.ones((4, static.DIMENSIONS), dtype=np.float32)
    monkeypatch.setattr(static, "distil", lambda model_dir: made)
    assert np.array_equal(static._load_or_distil(table, tmp_path), made)
    assert "could not be read" in caplog.text
    assert np.array_equal(np.load(table), made)  # kept for the next process


@pytest.mark.slow
def test_the_static_table_is_the_same_from_torch_and_from_the_onnx_graph(monkeypatch: pytest.MonkeyPatch,
                                                                          local_embedder: LocalEmbedder) -> None:
    from memshelf.embedders import local, static

    onnx = static._pooled_pieces(64, 101, 102)  # the first 64 word pieces, between [CLS] and [SEP]
    monkeypatch.setattr(local, "_shared_onnx", lambda: None)  # a machine where the graph cannot be made
    torch = static._pooled_pieces(64, 101, 102)
    assert onnx.shape == (64, 384) and float(np.abs(onnx - torch).max()) < 1e-4
