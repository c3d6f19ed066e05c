"""Embeddings from a running Ollama server (https://ollama.com), over its HTTP API.

Current servers embed a whole batch at POST /api/embed. Servers older than that answer 404 there; for them the
client falls back, once and for good, to the per-text POST /api/embeddings.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

import httpx
import numpy as np

from ..errors import EmbedderError
from ._http import HttpEmbedder, deadline_client
from ._pieces import CHARS_PER_TOKEN, window_tokens as window_tokens_of
from .base import MAX_TIMEOUT, EmbedderProvider

DEFAULT_MODEL = "nomic-embed-text"
WINDOW_TOKENS = {"nomic-embed-text": 2048, "mxbai-embed-large": 512, "all-minilm": 256,
                 "snowflake-arctic-embed": 512, "snowflake-arctic-embed2": 8192, "bge-m3": 8192, "bge-large": 512}
"""The input window, in tokens, that Ollama serves each common embedding model with (nomic-embed-text reads 8,192
but Ollama's default context is 2,048); a model not listed is assumed to read DEFAULT_WINDOW_TOKENS."""
DEFAULT_PORT = 11434
_SCHEME_PORTS = {"http": 80, "https": 443}
_WILDCARD_HOSTS = {"", "0.0.0.0", "::"}


def resolve_ollama_host(host: str | None = None) -> str:
    """The server's base URL from `host`, else OLLAMA_HOST, parsed the way Ollama's own clients parse it.

    Accepts "host", "host:port", ":port", "http(s)://host[:port][/path]" and bracketed IPv6. Without a scheme the
    port defaults to 11434; with one it defaults to that scheme's port, as in Ollama. The bind-everything addresses
    people put in OLLAMA_HOST for the server (0.0.0.0, ::) mean this machine when we connect.
    """
    raw = (host or os.environ.get("OLLAMA_HOST", "")).strip().strip("\"'")
    scheme, separator, hostport = raw.partition("://")
    port = DEFAULT_PORT
    if not separator:
        scheme, hostport = "http", raw
    elif scheme.lower() in _SCHEME_PORTS:
        scheme = scheme.lower()
        port = _SCHEME_PORTS[scheme]
    else:
        raise EmbedderError(f"Ollama host {raw!r} has scheme {scheme!r}: use http:// or https://, e.g. localhost:11434")
    parts = urllib.parse.urlsplit(f"{scheme}://{hostport}")
    try:
        port = parts.port or port
    except ValueError as exc:
        raise EmbedderError(f"Ollama host {raw!r} has an invalid port: use host:port, e.g. localhost:11434") from exc
    hostname = parts.hostname or ""
    hostname = "localhost" if hostname in _WILDCARD_HOSTS else hostname
    if ":" in hostname:
        hostname = f"[{hostname}]"
    path = parts.path.strip("/")
    return f"{scheme}://{hostname}:{port}" + (f"/{path}" if path else "")


def _error_text(response: httpx.Response) -> str:
    """Ollama's {"error": "..."} message, or the start of whatever else the server sent."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200]
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    return str(body)[:200]


def _says_model_missing(response: httpx.Response) -> bool:
    """A 404 from a current server naming the model, as opposed to an old server's plain "404 page not found"."""
    try:
        body = response.json()
    except ValueError:
        return False
    message = body.get("error") if isinstance(body, dict) else None
    return isinstance(message, str) and "model" in message.lower() and "not found" in message.lower()


def _normalized(matrix: np.ndarray) -> np.ndarray:
    """Unit-length rows: /api/embed already normalizes, /api/embeddings does not, and one stamp must mean one scale."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.where(norms == 0.0, 1.0, norms)).astype(np.float32)


class OllamaEmbedder(HttpEmbedder):
    """Any embedding model an Ollama server has pulled, e.g. nomic-embed-text (768-d) or mxbai-embed-large."""

    unreachable_hint = "start it with `ollama serve`, or set OLLAMA_HOST to where it runs"
    url_hint = "fix OLLAMA_HOST"
    busy_hint = "check that `ollama serve` is healthy, or set OLLAMA_HOST to a server that is"
    not_json_hint = "upgrade Ollama, and check that OLLAMA_HOST points at it"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        host: str | None = None,
        timeout: float = 30.0,
        batch_size: int = 64,
        window_tokens: int | None = None,
    ) -> None:
        """window_tokens: the model's input window (default MEMSHELF_EMBED_WINDOW_TOKENS, else WINDOW_TOKENS by
        name): longer texts are embedded in overlapping pieces of CHARS_PER_TOKEN characters a token."""
        if batch_size < 1:
            raise EmbedderError(f"batch_size must be at least 1, got {batch_size}: pass a positive number")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
            raise EmbedderError(f"timeout must be the seconds one request may take in all (above 0), got {timeout!r}")
        self.model_name = model
        self.model = f"ollama:{model}"
        self.window_chars = window_tokens_of(model, WINDOW_TOKENS, window_tokens) * CHARS_PER_TOKEN
        self.host = resolve_ollama_host(host)
        self.where = f"Ollama at {self.host}"
        self.batch_size = batch_size
        self._dimensions: int | None = None
        self._legacy = False  # set once the server shows it predates /api/embed
        self.timeout = timeout
        self._client = deadline_client(timeout, base_url=self.host)

    def _finish(self, matrix: np.ndarray) -> np.ndarray:
        return _normalized(matrix)

    def _embed_chunk(self, chunk: list[str]) -> list[Any]:
        if not self._legacy:
            response = self._post("/api/embed", {"model": self.model_name, "input": chunk})
            if response.status_code != 404 or _says_model_missing(response):
                return self._count_checked(self._reply(response).get("embeddings"), len(chunk))
            self._legacy = True
        return [self._embed_one_legacy(text) for text in chunk]

    def _embed_one_legacy(self, text: str) -> Any:
        response = self._post("/api/embeddings", {"model": self.model_name, "prompt": text})
        return self._reply(response).get("embedding")

    def _reply(self, response: httpx.Response) -> dict[str, Any]:
        """The JSON body of a successful reply; otherwise the error translated into one of ours."""
        if response.status_code == 404 and _says_model_missing(response):
            raise EmbedderError(
                f"Ollama at {self.host} does not have the model {self.model_name!r}: "
                f"run `ollama pull {self.model_name}`, or pick a model it has"
            )
        return self._json(response, _error_text(response))


def _factory(model: str | None) -> OllamaEmbedder:
    return OllamaEmbedder(model or DEFAULT_MODEL)


provider = EmbedderProvider(_factory)
"""The `ollama` entry point (pyproject.toml)."""
