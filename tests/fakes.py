"""Test doubles for the embedding services that cannot run here, and a deterministic in-process embedder.

`FakeOllama` and `FakeOpenAI` are real HTTP servers on 127.0.0.1 speaking the slice of each API memshelf uses, so
the clients are tested over real sockets: refused connections, timeouts and status codes included. Their vectors,
like `HashEmbedder`'s, are a hashed bag of words: texts that share words have a higher cosine, and the same text
always gets the same vector. `SilentServer` (accepts, never answers) and `TricklingOllama` (answers one byte a
second) are services that are up but hung, below the HTTP layer. `FakeOllamaChat` and `FakeOpenAIChat` speak the
two chat APIs the model extractors use, with a model whose answers the test scripts.

    with FakeOllama(legacy=True) as ollama:
        embedder = OllamaEmbedder(host=ollama.url)
        ...
        assert [request.path for request in ollama.requests] == [...]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from collections.abc import Iterable, Sequence

import numpy as np

from memshelf.embedders.base import Embedder

DEFAULT_DIMS = 64
_TOKEN = re.compile(r"[a-z0-9]+")


def hash_vector(text: str, dims: int = DEFAULT_DIMS, normalize: bool = True) -> list[float]:
    """A bag of words hashed into `dims` buckets; a text with no words still gets a (fixed) non-zero vector."""
    counts = [0.0] * dims
    for token in _TOKEN.findall(text.lower()) or ["<empty>"]:
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        counts[int.from_bytes(digest, "big") % dims] += 1.0
    if not normalize:
        return counts
    norm = math.sqrt(sum(value * value for value in counts))
    return [value / norm for value in counts]


class HashEmbedder(Embedder):
    """The fakes' bag of words, in process: for library tests that need an embedder but not the real model."""

    def __init__(self, model: str = "test:hash-64", dims: int = DEFAULT_DIMS, window_chars: int | None = None) -> None:
        self.model = model
        self.dims = dims
        self.window_chars = window_chars  # a text longer than this is embedded in pieces
        self.calls: list[int] = []  # the size of every batch asked for, so tests can count embedding work

    @property
    def dimensions(self) -> int:
        return self.dims

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(len(texts))
        rows = [hash_vector(text, self.dims) for text in texts]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dims)


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    body: Any
    headers: dict[str, str]


class _FakeServer:
    """A threaded loopback HTTP server; subclasses answer POSTs in `respond`.

    `fail_status` (settable while running) makes every request fail with that status; `delay` holds every answer
    back that many seconds, to provoke client timeouts.
    """

    def __init__(self, *, fail_status: int | None = None, delay: float = 0.0, dims: int = DEFAULT_DIMS) -> None:
        self.fail_status = fail_status
        self.delay = delay
        self.dims = dims
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._address: tuple[str, int] | None = None

    def start(self) -> Self:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        host, port = self._server.server_address[:2]
        self._address = (str(host), int(port))
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name=type(self).__name__, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering: afterwards connections to `url` are refused, like a stopped service."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def root(self) -> str:
        """http://127.0.0.1:<port>; still the same after `stop()`, so a test can watch the outage there."""
        if self._address is None:
            raise RuntimeError("the fake server was never started: use it as a context manager or call start()")
        return f"http://{self._address[0]}:{self._address[1]}"

    @property
    def paths(self) -> list[str]:
        return [request.path for request in self.requests]

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def respond(self, request: RecordedRequest) -> tuple[int, Any]:
        raise NotImplementedError

    def failure_body(self, status: int) -> Any:
        return {"error": f"fake failure (HTTP {status})"}


def _handler_for(fake: _FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the name http.server looks for)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                self._send(400, {"error": "body is not JSON"})
                return
            request = RecordedRequest(self.path, body, {key.lower(): value for key, value in self.headers.items()})
            fake.record(request)
            if fake.delay:
                time.sleep(fake.delay)
            status = fake.fail_status
            self._send(*((status, fake.failure_body(status)) if status else fake.respond(request)))

        def _send(self, status: int, payload: Any) -> None:
            is_text = isinstance(payload, str)
            data = payload.encode() if is_text else json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if is_text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test); nobody is left to answer

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's signature)
            pass

    return Handler


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


class FakeOllama(_FakeServer):
    """Ollama's /api/embed (batched) and /api/embeddings (one prompt, unnormalized, as the real one is).

    `legacy=True` answers /api/embed with the plain-text 404 of a server that predates it. Models not in `models`
    get Ollama's JSON 404 "model ... not found". `url` is what to pass as `host`.
    """

    def __init__(
        self,
        *,
        models: Iterable[str] = ("nomic-embed-text",),
        legacy: bool = False,
        fail_status: int | None = None,
        delay: float = 0.0,
        dims: int = DEFAULT_DIMS,
    ) -> None:
        super().__init__(fail_status=fail_status, delay=delay, dims=dims)
        self.models = set(models)
        self.legacy = legacy

    @property
    def url(self) -> str:
        return self.root

    def respond(self, request: RecordedRequest) -> tuple[int, Any]:
        body = request.body if isinstance(request.body, dict) else {}
        if request.path == "/api/embed" and not self.legacy:
            return self._embed(body, _as_list(body.get("input")))
        if request.path == "/api/embeddings":
            return self._embed(body, None, prompt=str(body.get("prompt", "")))
        return 404, "404 page not found"

    def _embed(self, body: dict[str, Any], texts: list[str] | None, prompt: str = "") -> tuple[int, Any]:
        model = str(body.get("model", ""))
        if model not in self.models and model.removesuffix(":latest") not in self.models:
            return 404, {"error": f'model "{model}" not found, try pulling it first'}
        if texts is None:
            return 200, {"embedding": hash_vector(prompt, self.dims, normalize=False)}
        return 200, {"model": model, "embeddings": [hash_vector(text, self.dims) for text in texts]}


class FakeOpenAI(_FakeServer):
    """OpenAI's POST /v1/embeddings. `url` is the base URL to pass as `base_url` (it ends in /v1).

    With `api_key` set, requests without "Authorization: Bearer <api_key>" get the API's 401. With `models` set,
    other models get its 404. `shuffle=True` returns `data` out of input order, which the API allows.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        models: Iterable[str] | None = None,
        shuffle: bool = False,
        fail_status: int | None = None,
        delay: float = 0.0,
        dims: int = DEFAULT_DIMS,
    ) -> None:
        super().__init__(fail_status=fail_status, delay=delay, dims=dims)
        self.api_key = api_key
        self.models = set(models) if models is not None else None
        self.shuffle = shuffle

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    def failure_body(self, status: int) -> Any:
        message = "Rate limit reached, please retry later" if status == 429 else f"fake failure (HTTP {status})"
        return {"error": {"message": message, "type": "server_error", "code": None}}

    def respond(self, request: RecordedRequest) -> tuple[int, Any]:
        if request.path != "/v1/embeddings":
            return 404, {"error": {"message": f"Invalid URL (POST {request.path})", "type": "invalid_request_error"}}
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, {"error": {"message": "Incorrect API key provided.", "code": "invalid_api_key"}}
        body = request.body if isinstance(request.body, dict) else {}
        model = str(body.get("model", ""))
        if self.models is not None and model not in self.models:
            message = f"The model `{model}` does not exist or you do not have access to it."
            return 404, {"error": {"message": message, "code": "model_not_found"}}
        dims = int(body.get("dimensions") or self.dims)
        data = [
            {"object": "embedding", "index": index, "embedding": hash_vector(text, dims)}
            for index, text in enumerate(_as_list(body.get("input")))
        ]
        if self.shuffle:
            data = _out_of_order(data)
        return 200, {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": 0, "total_tokens": 0}}


def _out_of_order(items: list[Any]) -> list[Any]:
    """A seeded shuffle that is guaranteed to move something when there are two or more items."""
    shuffled = list(items)
    random.Random(len(items)).shuffle(shuffled)
    return shuffled if shuffled != items or len(items) < 2 else shuffled[::-1]


class _RawServer:
    """A loopback TCP server that misbehaves below HTTP: each connection is handled by `serve(conn)` in a thread.
    A connection is let go after `hold` seconds, so a client without a deadline fails a test instead of hanging it.
    `stop()` closes every connection; `url` stays the same after it."""

    def __init__(self, hold: float = 60.0) -> None:
        self.hold = hold
        self.connections = 0
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self.url = ""

    def start(self) -> Self:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join()
        if self._listener is not None:
            self._listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with self._lock:
                self._open.append(conn)
                self.connections += 1
            self._spawn(self._serve_and_close, conn)

    def _serve_and_close(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            self.serve(conn)


class SilentServer(_RawServer):
    """Accepts every connection, reads what is sent, and never answers: a hung service."""

    def serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.05)
        until = time.monotonic() + self.hold
        while not self._stopping.is_set() and time.monotonic() < until:
            try:
                if not conn.recv(65536):
                    return
            except TimeoutError:
                continue


class TricklingOllama(_RawServer):
    """Reads a request and sends a correct Ollama /api/embed reply, one byte every `interval` seconds, headers
    included: every read succeeds quickly, so per-read timeouts never fire (the reply would take minutes)."""

    def __init__(self, interval: float = 1.0, dims: int = DEFAULT_DIMS, hold: float = 60.0) -> None:
        super().__init__(hold)
        self.interval = interval
        self.dims = dims
        self.bytes_sent = 0

    def serve(self, conn: socket.socket) -> None:
        body = json.loads(_read_http_request(conn) or b"null")
        texts = _as_list(body.get("input")) if isinstance(body, dict) else []
        payload = json.dumps({"embeddings": [hash_vector(text, self.dims) for text in texts]}).encode()
        reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        for index in range(min(len(reply), int(self.hold / self.interval))):
            conn.sendall(reply[index:index + 1])
            self.bytes_sent += 1
            if self._stopping.wait(self.interval):
                return


def _read_http_request(conn: socket.socket) -> bytes:
    """The body of one HTTP request read from a raw socket (headers skipped, Content-Length honoured)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return body


class _FakeChat(_FakeServer):
    """A chat service whose model says the scripted `answers` in turn (the last one again once they run out): a
    callable is called with the request first (to cite the ids it was sent); a str is sent as the model's text as
    it is, anything else as its JSON. Every reply counts `prompt_tokens` and `completion_tokens`."""

    def __init__(self, answers: Sequence[Any] = ({"proposals": []},), *, prompt_tokens: int = 120,
                 completion_tokens: int = 30, fail_status: int | None = None, delay: float = 0.0) -> None:
        super().__init__(fail_status=fail_status, delay=delay)
        self.answers = list(answers)
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self._said = 0

    def next_answer(self, request: RecordedRequest) -> str:
        with self._lock:
            answer = self.answers[min(self._said, len(self.answers) - 1)]
            self._said += 1
        if callable(answer):
            answer = answer(request)
        return answer if isinstance(answer, str) else json.dumps(answer)

    @property
    def conversations(self) -> list[list[dict[str, str]]]:
        """The messages of every chat request received, in order."""
        return [request.body.get("messages", []) for request in self.requests if isinstance(request.body, dict)]


class FakeOllamaChat(_FakeChat):
    """Ollama's POST /api/chat (stream false). Models not in `models` get Ollama's JSON 404. `url` is the host."""

    def __init__(self, answers: Sequence[Any] = ({"proposals": []},), *, models: Iterable[str] = ("llama3.2",),
                 **options: Any) -> None:
        super().__init__(answers, **options)
        self.models = set(models)

    @property
    def url(self) -> str:
        return self.root

    def respond(self, request: RecordedRequest) -> tuple[int, Any]:
        if request.path != "/api/chat":
            return 404, "404 page not found"
        body = request.body if isinstance(request.body, dict) else {}
        model = str(body.get("model", ""))
        if model not in self.models and model.removesuffix(":latest") not in self.models:
            return 404, {"error": f'model "{model}" not found, try pulling it first'}
        return 200, {"model": model, "created_at": "2026-12-03T00:00:00Z", "done": True, "done_reason": "stop",
                     "message": {"role": "assistant", "content": self.next_answer(request)},
                     "prompt_eval_count": self.prompt_tokens, "eval_count": self.completion_tokens}


class FakeOpenAIChat(_FakeChat):
    """OpenAI's POST /v1/chat/completions. `url` is the base URL (it ends in /v1).

    `json_schema=False` plays a server that takes only `json_object`: a request with a json_schema response_format
    gets a 400 saying so, as llama.cpp's and some vLLM versions do. With `api_key` set, other keys get a 401.
    """

    def __init__(self, answers: Sequence[Any] = ({"proposals": []},), *, json_schema: bool = True,
                 api_key: str | None = None, **options: Any) -> None:
        super().__init__(answers, **options)
        self.json_schema = json_schema
        self.api_key = api_key

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    def failure_body(self, status: int) -> Any:
        return {"error": {"message": f"fake failure (HTTP {status})", "type": "server_error", "code": None}}

    def respond(self, request: RecordedRequest) -> tuple[int, Any]:
        if request.path != "/v1/chat/completions":
            return 404, {"error": {"message": f"Invalid URL (POST {request.path})", "type": "invalid_request_error"}}
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, {"error": {"message": "Incorrect API key provided.", "code": "invalid_api_key"}}
        body = request.body if isinstance(request.body, dict) else {}
        wanted = (body.get("response_format") or {}).get("type")
        if wanted == "json_schema" and not self.json_schema:
            return 400, {"error": {"message": "'response_format.type' json_schema is not supported by this server",
                                   "type": "invalid_request_error"}}
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                 "total_tokens": self.prompt_tokens + self.completion_tokens}
        return 200, {"id": "chatcmpl-fake", "object": "chat.completion", "model": body.get("model"),
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": self.next_answer(request)}}],
                     "usage": usage}
