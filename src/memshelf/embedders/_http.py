"""What the embedders that call an HTTP service share: batching, one pooled client with a total deadline per
request, and turning transport failures and error statuses into memshelf's errors (EmbedderUnavailable means "fall
back to keywords and retry later").

httpx's timeouts bound each socket operation, not a request: a server that accepts and trickles a byte a second
never trips a read timeout. So the client's network backend asks, before every connect, send and read, how long is
left of the current deadline (`embedding_deadline`), and gives up when nothing is: a request can never outlive its
deadline, headers and body alike, and pooled connections are kept.
"""

from __future__ import annotations

import ssl
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import httpcore
import httpx
import numpy as np

from ..errors import EmbedderError, EmbedderUnavailable, MemshelfError
from .base import Embedder, as_matrix, embedding_deadline, embedding_time_left


def _bounded(timeout: float | None, expired: type[httpcore.TimeoutException]) -> float | None:
    """The socket timeout for one operation: httpx's own, cut to what is left of the deadline."""
    left = embedding_time_left()
    if left is None:
        return timeout
    if left <= 0:
        raise expired("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_tcp(host, port, bounded, local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, bounded, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _Body(httpx.SyncByteStream):
    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class DeadlineTransport(httpx.BaseTransport):
    """httpx's default transport (a pooled httpcore connection pool, TLS verified as httpx does) on the deadline
    backend. httpcore's errors pass through as they are; `HttpEmbedder._post` translates both families."""

    def __init__(self) -> None:
        self._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(),
                                             network_backend=_DeadlineBackend())

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                           target=request.url.raw_path)
        stream = request.stream
        if not isinstance(stream, Iterable):
            raise EmbedderError("the embedding request body is not a synchronous stream")
        sent = self._pool.handle_request(httpcore.Request(request.method, url, headers=request.headers.raw,
                                                          content=stream, extensions=request.extensions))
        if not isinstance(sent.stream, Iterable):
            raise EmbedderError("the embedding reply is not a synchronous stream")
        return httpx.Response(sent.status, headers=sent.headers, stream=_Body(sent.stream),
                              extensions=sent.extensions)

    def close(self) -> None:
        self._pool.close()


def deadline_client(timeout: float, **options: Any) -> httpx.Client:
    """An httpx client whose every request honours `embedding_deadline` (see the module docstring)."""
    return httpx.Client(timeout=timeout, transport=DeadlineTransport(), **options)


class JsonService:
    """A client of an HTTP JSON API, embedding or chat: one POST within the request's deadline, and every way it can
    fail said in the caller's terms. Subclasses set `where` (the service, for messages), `model_name`, the hints,
    `timeout` and `_client` (made by `deadline_client`); each family sets its two error classes, what a request
    was for (`task`), what a failure costs (`lost`), and how to wait longer (`_too_slow`)."""

    where: str
    model_name: str
    timeout: float
    _client: httpx.Client
    unreachable_hint: str  # what to do when the service cannot be reached or does not answer in time
    url_hint: str          # what to fix when the address is not a usable URL
    busy_hint: str         # what to do on 429 / 5xx
    not_json_hint: str     # what to check when the reply is not the API's JSON
    error: type[MemshelfError]        # the request is wrong: a retry will not fix it
    unavailable: type[MemshelfError]  # the service is down or busy: try later
    task: str              # "embed with": what the refused request was for, before the model name
    lost: str = ""         # ", so nothing was learned": what the failure cost, if anything
    again: str = ""        # what to do once the service is back, after the busy hint

    def close(self) -> None:
        """Release the pooled connections; call it when a long-lived program is done with this client."""
        self._client.close()

    @abstractmethod
    def _too_slow(self) -> str:
        """The message when the service does not answer before the deadline."""

    def _post(self, url: str, payload: dict[str, Any]) -> httpx.Response:
        try:
            with embedding_deadline(self.timeout):
                return self._client.post(url, json=payload)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL, httpcore.UnsupportedProtocol) as exc:
            raise self.error(f"{url!r} is not a usable URL ({exc}): {self.url_hint}") from exc
        except (httpx.TimeoutException, httpcore.TimeoutException) as exc:
            raise self.unavailable(self._too_slow()) from exc
        except (httpx.TransportError, httpcore.NetworkError, httpcore.ProtocolError, httpcore.ProxyError) as exc:
            raise self.unavailable(f"cannot reach {self.where} ({exc}){self.lost}: {self.unreachable_hint}") from exc

    def _json(self, response: httpx.Response, error_text: str) -> dict[str, Any]:
        """The JSON object of a reply the subclass has not refused: 429 and 5xx mean try later, other 4xx mean the
        request itself is wrong."""
        status = response.status_code
        if status == 429 or status >= 500:
            raise self.unavailable(
                f"{self.where} answered HTTP {status} ({error_text}){self.lost}: {self.busy_hint}{self.again}")
        if status >= 400:
            raise self.error(f"{self.where} refused to {self.task} {self.model_name!r} (HTTP {status}: {error_text}): "
                             "check the model name and settings")
        try:
            body = response.json()
        except ValueError as exc:
            raise self.error(f"{self.where} answered with something that is not JSON: {self.not_json_hint}") from exc
        if not isinstance(body, dict):
            raise self.error(f"{self.where} answered with unexpected JSON: {self.not_json_hint}")
        return body


class HttpEmbedder(JsonService, Embedder):
    """Subclasses set what JsonService asks for and `batch_size`, and implement `_embed_chunk`; `embed_batch` is
    built on it.

    `timeout` is the total time one HTTP request may take (connect, send, and every read); a caller's
    `embedding_deadline` can only shorten it.
    """

    batch_size: int
    error = EmbedderError
    unavailable = EmbedderUnavailable
    task = "embed with"

    def _too_slow(self) -> str:
        return (f"{self.where} did not answer in time: {self.unreachable_hint}, or raise the timeout "
                "(MEMSHELF_EMBED_WRITE_TIMEOUT for writes, MEMSHELF_EMBED_SEARCH_TIMEOUT for searches, the "
                "embedder's timeout for backfill)")

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

    def _count_checked(self, rows: object, expected: int) -> list[Any]:
        if not isinstance(rows, list) or len(rows) != expected:
            count = len(rows) if isinstance(rows, list) else "no"
            raise EmbedderError(f"{self.where} returned {count} vectors for {expected} texts: {self.not_json_hint}")
        return rows
