"""Embeddings from the OpenAI API, or any server that speaks its POST /embeddings (vLLM, LM Studio, llama.cpp...).

A missing API key is allowed, because local OpenAI-compatible servers usually want none; the request then goes
out without an Authorization header, and a server that does want one answers 401 with a message saying so.
"""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Sequence

import httpx
import numpy as np

from ..errors import EmbedderError, EmbedderUnavailable
from .base import Embedder, as_matrix, register_embedder

DEFAULT_MODEL = "text-embedding-3-small"
DEFAULT_BASE_URL = "https://api.openai.com/v1"


def _error_text(response: httpx.Response) -> str:
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


class OpenAIEmbedder(Embedder):
    """OpenAI's embedding models (text-embedding-3-small is 1536-d; `dimensions` asks for shorter vectors)."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        batch_size: int = 256,
        dimensions: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise EmbedderError(f"batch_size must be at least 1, got {batch_size}: pass a positive number")
        if dimensions is not None and dimensions < 1:
            raise EmbedderError(f"dimensions must be at least 1, got {dimensions}: pass a positive number or None")
        self.model_name = model
        self.model = f"openai:{model}"
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.batch_size = batch_size
        self.requested_dimensions = dimensions
        self._dimensions: int | None = dimensions
        key = api_key or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)

    def close(self) -> None:
        """Release the pooled connections; call it when a long-lived program is done with this embedder."""
        self._client.close()

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self._dimensions or 0), dtype=np.float32)
        rows: list[Any] = []
        for start in range(0, len(texts), self.batch_size):
            rows.extend(self._embed_chunk(list(texts[start : start + self.batch_size])))
        matrix = as_matrix(rows, self.model, expected=self._dimensions)
        self._dimensions = matrix.shape[1]
        return matrix

    def _embed_chunk(self, chunk: list[str]) -> list[Any]:
        payload: dict[str, Any] = {"model": self.model_name, "input": chunk}
        if self.requested_dimensions is not None:
            payload["dimensions"] = self.requested_dimensions
        data = self._reply(self._post(payload)).get("data")
        return self._in_input_order(data, len(chunk))

    def _in_input_order(self, data: object, expected: int) -> list[Any]:
        """The vectors sorted by their "index": the API does not promise to answer in input order."""
        if not isinstance(data, list) or len(data) != expected:
            count = len(data) if isinstance(data, list) else "no"
            raise EmbedderError(
                f"{self.base_url} returned {count} embeddings for {expected} texts: "
                "check that OPENAI_BASE_URL points at an OpenAI-compatible /embeddings endpoint"
            )
        try:
            ordered = sorted(data, key=lambda item: int(item["index"]))
            return [item["embedding"] for item in ordered]
        except (KeyError, TypeError, ValueError) as exc:
            raise EmbedderError(
                f"{self.base_url} returned embeddings without an index or vector: "
                "check that OPENAI_BASE_URL points at an OpenAI-compatible /embeddings endpoint"
            ) from exc

    def _post(self, payload: dict[str, Any]) -> httpx.Response:
        url = f"{self.base_url}/embeddings"
        try:
            return self._client.post(url, json=payload)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise EmbedderError(f"{url!r} is not a usable URL ({exc}): fix base_url or OPENAI_BASE_URL") from exc
        except httpx.TimeoutException as exc:
            raise EmbedderUnavailable(
                f"{self.base_url} did not answer in time: try again later, or raise the timeout"
            ) from exc
        except httpx.TransportError as exc:
            raise EmbedderUnavailable(
                f"cannot reach {self.base_url} ({exc}): check the network, or set OPENAI_BASE_URL to a server that runs"
            ) from exc

    def _reply(self, response: httpx.Response) -> dict[str, Any]:
        """The JSON body of a successful reply; otherwise the error translated into one of ours."""
        status = response.status_code
        if status in (401, 403):
            raise EmbedderError(
                f"{self.base_url} rejected the API key (HTTP {status}: {_error_text(response)}): "
                "set OPENAI_API_KEY (or pass api_key=) to a key that may use the embeddings API"
            )
        if status == 429 or status >= 500:
            raise EmbedderUnavailable(
                f"{self.base_url} answered HTTP {status} ({_error_text(response)}): "
                "wait and retry, or check the account's rate limits and quota"
            )
        if status >= 400:
            raise EmbedderError(
                f"{self.base_url} refused to embed with {self.model_name!r} (HTTP {status}: {_error_text(response)}): "
                "check the model name and the dimensions setting"
            )
        try:
            body = response.json()
        except ValueError as exc:
            raise EmbedderError(
                f"{self.base_url} answered with something that is not JSON: "
                "check that OPENAI_BASE_URL ends with /v1 (or wherever the API lives)"
            ) from exc
        if not isinstance(body, dict):
            raise EmbedderError(f"{self.base_url} answered with unexpected JSON: check OPENAI_BASE_URL")
        return body


def _factory(model: str | None) -> OpenAIEmbedder:
    return OpenAIEmbedder(model or DEFAULT_MODEL)


register_embedder("openai", _factory)
