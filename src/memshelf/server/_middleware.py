"""ASGI middleware that runs before any route: ids with an encoded '/', the API key check and the body size
limit."""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING
from collections.abc import Callable
from urllib.parse import unquote, unquote_to_bytes

import anyio
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message as AsgiMessage, Receive, Scope, Send

from ..errors import MemshelfError
from ._errors import KEY_HINT, UNAUTHORIZED, error_response, memshelf_error_response

if TYPE_CHECKING:
    from ..shelf import Shelf

__all__ = ["MAX_BODY_BYTES", "MAX_CHAT_BYTES", "MAX_IMPORT_BYTES", "MCP_PATH", "SEGMENTS_KEPT", "ApiKeyAuth",
           "BodyLimit", "EncodedSlashes", "bearer_secret", "body_limit_for", "is_mcp", "kept_segments"]

MAX_BODY_BYTES = 1 << 20
"""Largest request body (1 MiB). Larger ones get 413; split a big batch into several requests."""
MAX_IMPORT_BYTES = 64 << 20
"""Largest body of POST .../import (64 MiB of JSON Lines). Split bigger exports: importing is idempotent."""
MAX_CHAT_BYTES = 32 << 20
"""Largest body of POST /v1/chat/completions (the memory proxy): a whole conversation, images included."""
MCP_PATH = "/mcp"
_PROTECTED = ("/v1/", MCP_PATH)
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


SEGMENTS_KEPT = "memshelf.segments_kept"
"""Set in a request's scope when EncodedSlashes rewrote its path: the route's parameters are then percent-decoded
(server/_deps.py, WorkerRoute)."""
_IMPORT = re.compile(r"/v1/users/[^/]+/import")


class EncodedSlashes:
    """Keeps a "/" that a client percent-encoded inside a path segment there, so the segment still names one record.

    The server decodes a request's path before routing, so a user id "kaleb/facts/x" sent as
    /v1/users/kaleb%2Ffacts%2Fx was routed as the fact "x" of user "kaleb" (DELETE erased that fact). When a /v1/
    path holds an encoded slash, its routing path is made from the raw path, each segment decoded and then its "%"
    and "/" encoded again; WorkerRoute decodes the route's parameters, so they are the ids as the client sent them.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and raw.startswith(_PROTECTED_BYTES) and not _utf8(raw, scope.get("query_string", b"")):
            await error_response(400, "invalid_path", _NOT_UTF8, rpc=is_mcp(scope))(scope, receive, send)
            return
        if raw and raw.startswith(b"/v1/") and b"%2" in raw:  # the API's own segments are never encoded
            kept = kept_segments(raw)
            if kept is not None:
                scope = {**scope, "path": kept, SEGMENTS_KEPT: True}
        await self.app(scope, receive, send)


_PROTECTED_BYTES = tuple(prefix.encode() for prefix in _PROTECTED)
_NOT_UTF8 = ("the request's path or query is not UTF-8 once percent-decoded: encode ids as UTF-8 (\"Zoë\" is "
             "Zo%C3%AB); read as it was, it would name another user or record")


def _utf8(raw_path: bytes, query: bytes) -> bool:
    """Whether the path and query decode as UTF-8. The server reads bytes that do not as U+FFFD, so "a%FF" and
    "a%FE" were one user, and a client that encodes Latin-1 ("Zo%EB") would merge every name it cannot spell."""
    try:
        for part in (raw_path, query):
            if b"%" in part:
                unquote_to_bytes(part.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def kept_segments(raw: bytes) -> str | None:
    """The routing path of a raw request path with encoded slashes (None when it has none): its segments decoded
    as the server decodes a path, each with "%" and "/" encoded again."""
    if b"%2f" not in raw.lower():
        return None
    return "/".join(unquote(segment).replace("%", "%25").replace("/", "%2F")
                    for segment in raw.decode("latin-1").split("/"))


def bearer_secret(headers: Headers) -> str | None:
    """The API key of a request: `Authorization: Bearer <key>`, else `X-API-Key: <key>`."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return headers.get("x-api-key", "").strip() or None


class ApiKeyAuth:
    """Authenticates every request under /v1/ and /mcp before anything reads its body.

    The live key is put in the request state (`request.state.memshelf_key`); routes decide what it may do. A 401
    carries the WWW-Authenticate challenge, and at /mcp its body is a JSON-RPC error too, which MCP clients report.
    """

    def __init__(self, app: ASGIApp, shelf: Shelf) -> None:
        self.app, self.shelf = app, shelf

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(_PROTECTED):
            await self.app(scope, receive, send)
            return
        secret = bearer_secret(Headers(scope=scope))
        if secret is None:
            await self._refuse(scope, f"missing API key: {KEY_HINT}")(scope, receive, send)
            return
        try:
            if self.shelf.store.quick_reads:  # a lookup of microseconds: a worker-thread hop would cost 0.1-0.4 ms
                key = self.shelf.authenticate(secret)
            else:
                key = await anyio.to_thread.run_sync(self.shelf.authenticate, secret)
        except MemshelfError as exc:
            await memshelf_error_response(exc, rpc=is_mcp(scope))(scope, receive, send)
            return
        if key is None:
            message = f"wrong or revoked API key: check the key you send, or {KEY_HINT}"
            await self._refuse(scope, message, 'error="invalid_token"')(scope, receive, send)
            return
        scope.setdefault("state", {})["memshelf_key"] = key
        await self.app(scope, receive, send)

    @staticmethod
    def _refuse(scope: Scope, message: str, challenge: str = "") -> JSONResponse:
        headers = {"WWW-Authenticate": f"{UNAUTHORIZED}, {challenge}" if challenge else UNAUTHORIZED}
        return error_response(401, "unauthorized", message, headers, rpc=is_mcp(scope))


def is_mcp(scope: Scope) -> bool:
    """Whether a request is for the MCP endpoint, whose errors are JSON-RPC errors too."""
    return scope["path"].startswith(MCP_PATH)


class Unread(enum.Enum):
    """Why a body was not read to its end."""

    TOO_LARGE = "too large"
    CLIENT_GONE = "client gone"


class BodyLimit:
    """Refuses bodies over the limit with 413, by Content-Length and by counting the bytes actually received
    (a chunked body has no Content-Length). The body is read before the route runs, then replayed to it."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int]) -> None:
        self.app, self.limit_for = app, limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await self._too_large(limit, scope, receive, send)
            return
        body = await self._read(receive, limit)
        if body is Unread.TOO_LARGE:
            await self._too_large(limit, scope, receive, send)
        elif isinstance(body, bytes):
            await self.app(scope, _replay(body, receive), send)

    @staticmethod
    async def _read(receive: Receive, limit: int) -> bytes | Unread:
        """The whole body, or why not: it passed the limit (stop reading at once), or the client hung up."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return Unread.CLIENT_GONE
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return Unread.TOO_LARGE
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    async def _too_large(limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, "payload_too_large",
                                  f"the request body is over the limit of {limit:,} bytes: split it into smaller "
                                  "requests (e.g. several batches)", {"Connection": "close"}, rpc=is_mcp(scope))
        await response(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> AsgiMessage:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def body_limit_for(path: str) -> int:
    if _IMPORT.fullmatch(path):  # POST /v1/users/{user}/import, not any path that ends so (a fact named "import")
        return MAX_IMPORT_BYTES
    return MAX_CHAT_BYTES if path == "/v1/chat/completions" else MAX_BODY_BYTES
