"""Embeddings from the OpenAI API, or any server that speaks its POST /embeddings (vLLM, LM Studio, llama.cpp...).

A missing API key is allowed, because local OpenAI-compatible servers usually want none; the request then goes
out without an Authorization header, and a server that does want one answers 401 with a message saying so.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from ..errors import EmbedderError
from ._http import HttpEmbedder, deadline_client
from ._pieces import CHARS_PER_TOKEN, window_tokens as window_tokens_of
from .base import MAX_TIMEOUT, EmbedderProvider

DEFAULT_MODEL = "text-embedding-3-small"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
WINDOW_TOKENS = {"text-embedding-3-small": 8191, "text-embedding-3-large": 8191, "text-embedding-ada-002": 8191}
"""OpenAI's embedding models' input windows, in tokens; a model not listed (a compatible server's) is assumed to read
DEFAULT_WINDOW_TOKENS."""


def error_text(response: httpx.Response) -> str:
    """The server's own error message: OpenAI's {"error": {"message"}}, or the shapes compatible servers use."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            error = error.get("message") or error.get("detail") or error
        if isinstance(error, str):
            return error
        if isinstance(body.get("detail"), str):
            return body["detail"]
    return str(body)[:200]


class OpenAIEmbedder(HttpEmbedder):
    """OpenAI's embedding models (text-embedding-3-small is 1536-d; `dimensions` asks for shorter vectors)."""

    unreachable_hint = "check the network, or set OPENAI_BASE_URL to a server that runs"
    url_hint = "fix base_url or OPENAI_BASE_URL"
    busy_hint = "wait and retry, or check the account's rate limits and quota"
    not_json_hint = "check that OPENAI_BASE_URL points at an OpenAI-compatible /embeddings endpoint (often .../v1)"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        batch_size: int = 256,
        dimensions: int | None = None,
        window_tokens: int | None = None,
    ) -> None:
        """window_tokens: the model's input window (default MEMSHELF_EMBED_WINDOW_TOKENS, else WINDOW_TOKENS by
        name): longer texts are embedded in overlapping pieces of CHARS_PER_TOKEN characters a token."""
        if batch_size < 1:
            raise EmbedderError(f"batch_size must be at least 1, got {batch_size}: pass a positive number")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
            raise EmbedderError(f"timeout must be the seconds one request may take in all (above 0), got {timeout!r}")
        if dimensions is not None and dimensions < 1:
            raise EmbedderError(f"dimensions must be at least 1, got {dimensions}: pass a positive number or None")
        self.model_name = model
        self.model = f"openai:{model}"
        self.window_chars = window_tokens_of(model, WINDOW_TOKENS, window_tokens) * CHARS_PER_TOKEN
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.where = self.base_url
        self.batch_size = batch_size
        self.requested_dimensions = dimensions
        self._dimensions: int | None = dimensions
        key = api_key or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout = timeout
        self._client = deadline_client(timeout, headers=headers)

    def _embed_chunk(self, chunk: list[str]) -> list[Any]:
        payload: dict[str, Any] = {"model": self.model_name, "input": chunk}
        if self.requested_dimensions is not None:
            payload["dimensions"] = self.requested_dimensions
        data = self._reply(self._post(f"{self.base_url}/embeddings", payload)).get("data")
        return self._in_input_order(self._count_checked(data, len(chunk)))

    def _in_input_order(self, data: list[Any]) -> list[Any]:
        """The vectors sorted by their "index": the API does not promise to answer in input order."""
        try:
            ordered = sorted(data, key=lambda item: int(item["index"]))
            return [item["embedding"] for item in ordered]
        except (KeyError, TypeError, ValueError) as exc:
            raise EmbedderError(
                f"{self.base_url} returned embeddings without an index or vector: {self.not_json_hint}"
            ) from exc

    def _reply(self, response: httpx.Response) -> dict[str, Any]:
        """The JSON body of a successful reply; otherwise the error translated into one of ours."""
        if response.status_code in (401, 403):
            raise EmbedderError(
                f"{self.base_url} rejected the API key (HTTP {response.status_code}: {error_text(response)}): "
                "set OPENAI_API_KEY (or pass api_key=) to a key that may use the embeddings API"
            )
        return self._json(response, error_text(response))


def _factory(model: str | None) -> OpenAIEmbedder:
    return OpenAIEmbedder(model or DEFAULT_MODEL)


provider = EmbedderProvider(_factory)
"""The `openai` entry point (pyproject.toml)."""
