"""What the embedders that call an HTTP service share: batching, one pooled client, and turning transport failures
and error statuses into memshelf's errors (EmbedderUnavailable means "fall back to keywords and retry later")."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from ..errors import EmbedderError, EmbedderUnavailable
from .base import Embedder, as_matrix


class HttpEmbedder(Embedder):
    """Subclasses set `where` (the service, for messages), the hints, `batch_size` and `_client`, and implement
    `_embed_chunk`; `embed_batch` is built on it."""

    where: str
    batch_size: int
    _client: httpx.Client
    unreachable_hint: str  # what to do when the service cannot be reached
    url_hint: str          # what to fix when the address is not a usable URL
    busy_hint: str         # what to do on 429 / 5xx
    not_json_hint: str     # what to check when the reply is not the API's JSON

    def close(self) -> None:
        """Release the pooled connections; call it when a long-lived program is done with this embedder."""
        self._client.close()

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self._dimensions or 0), dtype=np.float32)
        rows: list[Any] = []
        for start in range(0, len(texts), self.batch_size):
            rows.extend(self._embed_chunk(list(texts[start : start + self.batch_size])))
        matrix = self._finish(as_matrix(rows, self.model, expected=self._dimensions))
        self._dimensions = matrix.shape[1]
        return matrix

    @abstractmethod
    def _embed_chunk(self, chunk: list[str]) -> list[Any]:
        """One request's worth of texts (at most batch_size) -> their vectors, in input order."""

    def _finish(self, matrix: np.ndarray) -> np.ndarray:
        return matrix

    def _post(self, url: str, payload: dict[str, Any]) -> httpx.Response:
        try:
            return self._client.post(url, json=payload)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise EmbedderError(f"{url!r} is not a usable URL ({exc}): {self.url_hint}") from exc
        except httpx.TimeoutException as exc:
            raise EmbedderUnavailable(
                f"{self.where} did not answer in time: {self.unreachable_hint}, or raise the timeout") from exc
        except httpx.TransportError as exc:
            raise EmbedderUnavailable(f"cannot reach {self.where} ({exc}): {self.unreachable_hint}") from exc

    def _json(self, response: httpx.Response, error_text: str) -> dict[str, Any]:
        """The JSON object of a reply the subclass has not refused: 429 and 5xx mean try later, other 4xx mean the
        request itself is wrong."""
        status = response.status_code
        if status == 429 or status >= 500:
            raise EmbedderUnavailable(f"{self.where} answered HTTP {status} ({error_text}): {self.busy_hint}")
        if status >= 400:
            raise EmbedderError(
                f"{self.where} refused to embed with {self.model!r} (HTTP {status}: {error_text}): "
                "check the model name and settings")
        try:
            body = response.json()
        except ValueError as exc:
            raise EmbedderError(f"{self.where} answered with something that is not JSON: {self.not_json_hint}") from exc
        if not isinstance(body, dict):
            raise EmbedderError(f"{self.where} answered with unexpected JSON: {self.not_json_hint}")
        return body

    def _count_checked(self, rows: object, expected: int) -> list[Any]:
        if not isinstance(rows, list) or len(rows) != expected:
            count = len(rows) if isinstance(rows, list) else "no"
            raise EmbedderError(f"{self.where} returned {count} vectors for {expected} texts: {self.not_json_hint}")
        return rows
