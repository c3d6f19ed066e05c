"""`memshelf serve`: the HTTP API, the MCP endpoint at /mcp, and a small web page at /.

Thin by design: a route parses the request, takes the tenant from the API key and the user from the path, calls
one Shelf verb and formats the answer. No rule of the memory lives here; memshelf's exceptions become HTTP
statuses only at this edge, and every error body has one shape:

    {"error": {"type": "invalid_input", "message": "what is wrong, and what to do"}}

Limits (documented in the OpenAPI description): request bodies up to MAX_BODY_BYTES (1 MiB; imports
MAX_IMPORT_BYTES), `limit` 1..100 on search and 1..1000 on lists, and opaque `cursor`s for paging.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import json
import logging
import os
from datetime import datetime
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, Self, TypeVar
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import anyio
from fastapi import Depends, FastAPI, Path, Query, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from fastapi.security import APIKeyHeader, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Message as AsgiMessage, Receive, Scope, Send

from .errors import (ConfigError, DimensionMismatch, EmbedderError, EmbedderUnavailable, InvalidInput, MemshelfError,
                     NotFound, StoreError, StoreUnavailable, UnknownSource)
from .model import (MAX_CONTENT_CHARS, MAX_FACT_KEY_CHARS, MAX_FACT_VALUE_CHARS, MAX_TOPIC_CHARS, Owner)
from .shelf import Shelf
from .stores.base import ApiKey, Erased

if TYPE_CHECKING:
    from .mcp import McpEndpoint

log = logging.getLogger("memshelf.server")

MAX_BODY_BYTES = 1 << 20
"""Largest request body (1 MiB). Larger ones get 413; split a big batch into several requests."""
MAX_IMPORT_BYTES = 64 << 20
"""Largest body of POST .../import (64 MiB of JSON Lines). Split bigger exports: importing is idempotent."""
MAX_SEARCH_LIMIT = 100
MAX_LIST_LIMIT = 1_000
MAX_BATCH = 1_000
USER_HEADER = "X-Memshelf-User"
_PROTECTED = ("/v1/", "/mcp")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_KEY_HINT = "create one with `memshelf keys create --tenant NAME` and send it as `Authorization: Bearer <key>`"

T = TypeVar("T")
_UNSET: Any = object()

# ---------------------------------------------------------------------------------------------- errors at the edge

_STATUS_OF: tuple[tuple[type[MemshelfError], int, str], ...] = (
    (UnknownSource, 422, "unknown_source"),
    (InvalidInput, 422, "invalid_input"),
    (DimensionMismatch, 422, "dimension_mismatch"),
    (NotFound, 404, "not_found"),
    (ConfigError, 400, "not_configured"),
    (StoreUnavailable, 503, "store_unavailable"),
    (StoreError, 500, "store_error"),
    (EmbedderUnavailable, 503, "embedder_unavailable"),
    (EmbedderError, 502, "embedder_error"),
    (MemshelfError, 400, "error"),
)


class ApiError(Exception):
    """An HTTP answer decided at the edge (401, 403, 413, ...), in the one error shape."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def error_response(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


def memshelf_error_response(exc: MemshelfError) -> JSONResponse:
    status, kind = next((s, k) for cls, s, k in _STATUS_OF if isinstance(exc, cls))
    if status >= 500:
        log.warning("%s: %s", type(exc).__name__, exc)
    return error_response(status, kind, str(exc), {"Retry-After": "1"} if status == 503 else None)


def _validation_message(errors: Sequence[dict[str, Any]]) -> str:
    parts = []
    for error in errors[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more + ". Fix the request; the schema of every endpoint is at /docs"


def validation_error_response(exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    if any(error.get("type") == "json_invalid" for error in errors):
        return error_response(400, "malformed_json", "the request body is not valid JSON: send a JSON object "
                                                     "with Content-Type: application/json (see /docs)")
    return error_response(422, "validation_error", _validation_message(errors))


def http_error_response(exc: StarletteHTTPException) -> JSONResponse:
    kinds = {404: "not_found", 405: "method_not_allowed"}
    messages = {404: "no such endpoint: the API is described at /docs",
                405: "this endpoint does not accept that HTTP method: see /docs"}
    message = messages.get(exc.status_code, str(exc.detail))
    return error_response(exc.status_code, kinds.get(exc.status_code, "http_error"), message,
                          dict(exc.headers) if exc.headers else None)


def internal_error_response(exc: Exception) -> JSONResponse:
    log.exception("unexpected error while serving a request", exc_info=exc)
    return error_response(500, "internal_error", "the server failed unexpectedly; the details are in the server "
                                                 "log. Retry, and report it if it keeps happening")


def _install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.kind, exc.message)

    async def on_memshelf_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, MemshelfError)
        return memshelf_error_response(exc)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_error_response(exc)

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return http_error_response(exc)

    async def on_anything_else(_: Request, exc: Exception) -> JSONResponse:
        return internal_error_response(exc)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(MemshelfError, on_memshelf_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_anything_else)


# ---------------------------------------------------------------------------------------------- ASGI middleware

def bearer_secret(headers: Headers) -> str | None:
    """The API key of a request: `Authorization: Bearer <key>`, else `X-API-Key: <key>`."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return headers.get("x-api-key", "").strip() or None


class ApiKeyAuth:
    """Authenticates every request under /v1/ and /mcp before anything reads its body.

    The live key is put in the request state (`request.state.memshelf_key`); routes decide what it may do.
    """

    def __init__(self, app: ASGIApp, shelf: Shelf) -> None:
        self.app, self.shelf = app, shelf

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(_PROTECTED):
            await self.app(scope, receive, send)
            return
        secret = bearer_secret(Headers(scope=scope))
        if secret is None:
            await error_response(401, "unauthorized", f"missing API key: {_KEY_HINT}")(scope, receive, send)
            return
        try:
            key = await anyio.to_thread.run_sync(self.shelf.authenticate, secret)
        except MemshelfError as exc:
            await memshelf_error_response(exc)(scope, receive, send)
            return
        if key is None:
            await error_response(401, "unauthorized", "wrong or revoked API key: check the key you send, or "
                                                      + _KEY_HINT)(scope, receive, send)
            return
        scope.setdefault("state", {})["memshelf_key"] = key
        await self.app(scope, receive, send)


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
                                  "requests (e.g. several batches)", {"Connection": "close"})
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
    return MAX_IMPORT_BYTES if path.endswith("/import") else MAX_BODY_BYTES


# ---------------------------------------------------------------------------------------------- request/response models

class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


Text = Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS)]
Topic = Annotated[str, Field(min_length=1, max_length=MAX_TOPIC_CHARS, examples=["network"])]
SourceName = Annotated[str, Field(min_length=1, max_length=64, examples=["stated"],
                                  description="provenance: stated (1.0), mined (0.6), inferred (0.4) or one the "
                                              "server declares")]
Seconds = Annotated[float, Field(gt=0, le=100 * 365 * 86400, description="time to live, in seconds")]
Mode = Literal["auto", "keyword", "semantic", "hybrid"]
SearchLimit = Annotated[int, Field(ge=1, le=MAX_SEARCH_LIMIT)]
ListLimit = Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT, description=f"page size, 1..{MAX_LIST_LIMIT}")]
Cursor = Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page, unchanged")]
UserPath = Annotated[str, Path(min_length=1, max_length=200, description="the user inside your key's tenant")]


class MemoryIn(Strict):
    topic: Topic
    content: Text
    source: SourceName = "stated"
    ttl: Seconds | None = None
    expires_at: datetime | None = Field(None, description="an ISO 8601 instant with a time zone; or use ttl")


class BatchIn(Strict):
    memories: list[MemoryIn] = Field(min_length=1, max_length=MAX_BATCH)


class Out(BaseModel):
    """A response model filled from a memshelf record's attributes of the same names: `Out.of(record)`."""

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def of(cls, record: object) -> Self:
        return cls.model_validate(record)


class MemoryOut(Out):
    id: str
    topic: str
    content: str
    source: str
    confidence: float
    created_at: datetime
    expires_at: datetime | None
    last_seen: datetime | None
    observations: int
    embed_model: str | None



class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(description="pass as `cursor` to get the next page; null on the last page")


class SearchIn(Strict):
    question: Text
    mode: Mode = "auto"
    limit: SearchLimit = 5
    floor: float | None = Field(None, ge=-1.0, le=1.0, description="lowest cosine for meaning search")


class HitOut(Out):
    memory: MemoryOut
    score: float
    retriever: str
    details: dict[str, float]



class SearchOut(BaseModel):
    mode: str
    degraded: bool = Field(description="true when meaning search was wanted but the embedder was unreachable")
    reason: str | None
    hits: list[HitOut]


class ContextIn(Strict):
    question: Text
    mode: Mode = "auto"
    limit: SearchLimit = 3


class ContextOut(BaseModel):
    context: str = Field(description="the `Relevant knowledge` block, or empty when nothing matches")


class PromptIn(Strict):
    base_prompt: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
    user_text: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
    mode: Mode = "auto"
    limit: SearchLimit = 3


class PromptOut(BaseModel):
    prompt: str


class FactIn(Strict):
    value: Annotated[str, Field(min_length=1, max_length=MAX_FACT_VALUE_CHARS)]
    source: SourceName = "stated"


class FactOut(Out):
    key: str
    value: str
    source: str
    updated_at: datetime
    note: str | None = Field(default=None, description="set when the value given was kept in history only: the "
                             "current value comes from a stronger source")



class FactChangeOut(Out):
    key: str
    value: str
    source: str
    set_at: datetime



class MessageIn(Strict):
    thread: Topic
    role: Annotated[str, Field(min_length=1, max_length=64, examples=["user"])]
    content: Text
    ttl: Seconds | None = Field(None, description="seconds to keep it; default: the server's message retention")


class MessageOut(Out):
    id: str
    thread: str
    role: str
    content: str
    created_at: datetime
    expires_at: datetime | None



SCRUB_PENDING_HEADER = "X-Memshelf-Scrub-Pending"
"""Sent with a 204 erasure when the erased text may still be in the database's files for a while (README)."""


def _erased_response(erased: Erased) -> Response:
    headers = {SCRUB_PENDING_HEADER: "true"} if erased.scrub_pending else None
    return Response(status_code=204, headers=headers)


class ErasedOut(BaseModel):
    memories: int
    facts: int
    fact_changes: int
    messages: int
    scrub_pending: bool = False  # erased text may still be in the database's files for a while (README, Erasure)

    @classmethod
    def of(cls, erased: Erased) -> ErasedOut:
        return cls.model_validate(erased.as_dict())


class ImportOut(BaseModel):
    memories: int
    facts: int
    messages: int


class KeyIn(Strict):
    tenant: Annotated[str | None, Field(max_length=200, description="the tenant the key is bound to; "
                                                                    "null makes an admin key")]
    name: Annotated[str, Field(max_length=MAX_TOPIC_CHARS)] = ""


class KeyOut(Out):
    id: str
    tenant: str | None
    name: str
    created_at: datetime
    revoked_at: datetime | None



class NewKeyOut(BaseModel):
    key: KeyOut
    secret: str = Field(description="shown this once; only its hash is stored")


class ErrorBody(BaseModel):
    type: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody


# ---------------------------------------------------------------------------------------------- paging helpers

def offset_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode().rstrip("=")


def read_offset_cursor(cursor: str | None) -> int:
    if cursor is None:
        return 0
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, _, number = text.partition(":")
        if kind == "offset" and number.isdigit():
            return int(number)
    except (ValueError, UnicodeDecodeError):
        pass
    raise InvalidInput(f"cursor {cursor[:40]!r} is not one this server gave out: pass next_cursor unchanged")


def page_of(items: Sequence[T], limit: int, cursor: str | None) -> tuple[list[T], str | None]:
    """Page through a list that is already in memory (facts, their history, keys)."""
    start = read_offset_cursor(cursor)
    chunk = list(items[start:start + limit])
    return chunk, offset_cursor(start + limit) if start + limit < len(items) else None


# ---------------------------------------------------------------------------------------------- dependencies

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <key>")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="the key, as an alternative header")


async def shelf_of(request: Request) -> Shelf:
    return request.app.state.shelf  # type: ignore[no-any-return]


async def caller_key(request: Request, _bearer_doc: Any = Security(_bearer),
               _header_doc: Any = Security(_api_key_header)) -> ApiKey:
    """The key ApiKeyAuth checked (the Security parameters only document the two headers in OpenAPI)."""
    key = getattr(request.state, "memshelf_key", None)
    if key is None:
        raise ApiError(401, "unauthorized", f"missing API key: {_KEY_HINT}")
    return key  # type: ignore[no-any-return]


async def user_owner(user: UserPath, key: ApiKey = Depends(caller_key)) -> Owner:
    """The owner of a user route: the tenant always comes from the key, the user from the path."""
    if key.tenant is None:
        raise ApiError(403, "forbidden", "admin keys only manage keys and tenants (/v1/admin): use a key bound "
                                         "to a tenant for user data")
    return Owner(key.tenant, user)


async def admin_key(key: ApiKey = Depends(caller_key)) -> ApiKey:
    if key.tenant is not None:
        raise ApiError(403, "forbidden", "this endpoint needs an admin key: create one with "
                                         "`memshelf keys create --admin`")
    return key


# The dependencies are async because they never block: a sync one would cost a trip to the thread pool.
ShelfDep = Annotated[Shelf, Depends(shelf_of)]
OwnerDep = Annotated[Owner, Depends(user_owner)]
AdminDep = Annotated[ApiKey, Depends(admin_key)]

# ---------------------------------------------------------------------------------------------- routes

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": text} for status, text in (
        (400, "malformed JSON or a setting the server lacks"), (401, "missing, wrong or revoked API key"),
        (403, "the key may not do this"), (404, "no such record for this owner"), (413, "body over the limit"),
        (422, "invalid input"), (500, "the storage failed (not a lock)"),
        (503, "storage busy or out of reach, retry"))}


def _memory_routes(app: FastAPI) -> None:
    @app.post("/v1/users/{user}/memories", status_code=201, tags=["memories"])
    def remember(owner: OwnerDep, shelf: ShelfDep, body: MemoryIn) -> MemoryOut:
        """Remember one statement. Repeating the same topic and content counts another observation."""
        return MemoryOut.of(shelf.remember_many(owner, [body.model_dump(exclude_none=True)])[0])

    @app.post("/v1/users/{user}/memories/batch", status_code=201, tags=["memories"])
    def remember_batch(owner: OwnerDep, shelf: ShelfDep, body: BatchIn) -> list[MemoryOut]:
        """Remember up to 1000 statements in one transaction: all are stored, or none."""
        items = [item.model_dump(exclude_none=True) for item in body.memories]
        return [MemoryOut.of(m) for m in shelf.remember_many(owner, items)]

    @app.get("/v1/users/{user}/memories", tags=["memories"])
    def list_memories(owner: OwnerDep, shelf: ShelfDep, limit: ListLimit = 50,
                      cursor: Cursor = None) -> Page[MemoryOut]:
        """The user's live memories, newest first, one page at a time."""
        memories, next_cursor = shelf.list_memories(owner, limit=limit, cursor=cursor)
        return Page[MemoryOut](items=[MemoryOut.of(m) for m in memories], next_cursor=next_cursor)

    @app.get("/v1/users/{user}/memories/{memory_id}", tags=["memories"])
    def get_memory(owner: OwnerDep, shelf: ShelfDep, memory_id: Annotated[str, Path(max_length=200)]) -> MemoryOut:
        return MemoryOut.of(shelf.get(owner, memory_id))

    @app.delete("/v1/users/{user}/memories/{memory_id}", status_code=204, tags=["memories"])
    def forget(owner: OwnerDep, shelf: ShelfDep, memory_id: Annotated[str, Path(max_length=200)]) -> Response:
        """Erase one memory, with its vector and index entries."""
        return _erased_response(shelf.forget(owner, memory_id))


def _retrieval_routes(app: FastAPI) -> None:
    @app.post("/v1/users/{user}/search", tags=["retrieval"])
    def search(owner: OwnerDep, shelf: ShelfDep, body: SearchIn) -> SearchOut:
        """Find the user's memories for a question; each hit says which retriever found it and its score."""
        result = shelf.search(owner, body.question, mode=body.mode, limit=body.limit, floor=body.floor)
        return SearchOut(mode=result.mode, degraded=result.degraded, reason=result.reason,
                         hits=[HitOut.of(hit) for hit in result])

    @app.post("/v1/users/{user}/context", tags=["retrieval"])
    def context(owner: OwnerDep, shelf: ShelfDep, body: ContextIn) -> ContextOut:
        """The `Relevant knowledge` block for a question, ready to put in a prompt."""
        return ContextOut(context=shelf.context(owner, body.question, limit=body.limit, mode=body.mode))

    @app.post("/v1/users/{user}/prompt", tags=["retrieval"])
    def build_prompt(owner: OwnerDep, shelf: ShelfDep, body: PromptIn) -> PromptOut:
        """The base prompt, then the user's facts, then relevant knowledge (only when something matches)."""
        return PromptOut(prompt=shelf.build_prompt(body.base_prompt, owner, body.user_text, limit=body.limit,
                                                   mode=body.mode))


FactKey = Annotated[str, Path(min_length=1, max_length=MAX_FACT_KEY_CHARS)]


def _fact_routes(app: FastAPI) -> None:
    @app.get("/v1/users/{user}/facts", tags=["facts"])
    def list_facts(owner: OwnerDep, shelf: ShelfDep, limit: ListLimit = 100, cursor: Cursor = None) -> Page[FactOut]:
        """The user's current facts, most recently set first."""
        items, next_cursor = page_of(shelf.facts(owner), limit, cursor)
        return Page[FactOut](items=[FactOut.of(f) for f in items], next_cursor=next_cursor)

    @app.get("/v1/users/{user}/facts/{key}", tags=["facts"])
    def get_fact(owner: OwnerDep, shelf: ShelfDep, key: FactKey) -> FactOut:
        return FactOut.of(shelf.get_fact(owner, key))

    @app.put("/v1/users/{user}/facts/{key}", tags=["facts"])
    def set_fact(owner: OwnerDep, shelf: ShelfDep, key: FactKey, body: FactIn) -> FactOut:
        """Set the one current value of a fact; the old value stays in its history."""
        return FactOut.of(shelf.set_fact(owner, key, body.value, body.source))

    @app.delete("/v1/users/{user}/facts/{key}", status_code=204, tags=["facts"])
    def forget_fact(owner: OwnerDep, shelf: ShelfDep, key: FactKey) -> Response:
        return _erased_response(shelf.forget_fact(owner, key))

    @app.get("/v1/users/{user}/facts/{key}/history", tags=["facts"])
    def fact_history(owner: OwnerDep, shelf: ShelfDep, key: FactKey, limit: ListLimit = 100,
                     cursor: Cursor = None) -> Page[FactChangeOut]:
        """Every value the fact had, oldest first."""
        items, next_cursor = page_of(shelf.fact_history(owner, key), limit, cursor)
        return Page[FactChangeOut](items=[FactChangeOut.of(c) for c in items], next_cursor=next_cursor)


def _message_routes(app: FastAPI) -> None:
    @app.post("/v1/users/{user}/messages", status_code=201, tags=["messages"])
    def log_message(owner: OwnerDep, shelf: ShelfDep, body: MessageIn) -> MessageOut:
        """Append one conversation turn to a thread. Messages are history, never returned as knowledge."""
        ttl = {} if body.ttl is None else {"ttl": body.ttl}
        return MessageOut.of(shelf.log_message(owner, body.thread, body.role, body.content, **ttl))

    @app.get("/v1/users/{user}/messages", tags=["messages"])
    def list_messages(owner: OwnerDep, shelf: ShelfDep, limit: ListLimit = 50, cursor: Cursor = None,
                      thread: Annotated[str | None, Query(min_length=1, max_length=MAX_TOPIC_CHARS)] = None
                      ) -> Page[MessageOut]:
        """The user's messages (of one thread, or all), newest first, one page at a time."""
        items, next_cursor = shelf.list_messages(owner, thread, limit=limit, cursor=cursor)
        return Page[MessageOut](items=[MessageOut.of(m) for m in items], next_cursor=next_cursor)


def _owner_routes(app: FastAPI) -> None:
    @app.delete("/v1/users/{user}", tags=["users"])
    def forget_user(owner: OwnerDep, shelf: ShelfDep) -> ErasedOut:
        """Erase every trace of the user: memories, vectors, index entries, facts and history, messages."""
        return ErasedOut.of(shelf.forget_user(owner))

    @app.get("/v1/users/{user}/export", tags=["users"],
             responses={200: {"content": {"application/x-ndjson": {}}, "description": "JSON Lines"}})
    def export(owner: OwnerDep, shelf: ShelfDep) -> StreamingResponse:
        """Every live record of the user as JSON Lines, expired ones left out (feed it back to import)."""
        lines = (json.dumps(record, ensure_ascii=False) + "\n" for record in shelf.export(owner))
        filename = f"memshelf-{owner.tenant}-{owner.user}.jsonl".encode("ascii", "replace").decode()
        return StreamingResponse(lines, media_type="application/x-ndjson",
                                 headers={"Content-Disposition": f'attachment; filename="{_safe(filename)}"'})

    @app.post("/v1/users/{user}/import", tags=["users"], openapi_extra={"requestBody": {
        "required": True, "description": f"JSON Lines made by export, up to {MAX_IMPORT_BYTES >> 20} MiB",
        "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}})
    async def import_(request: Request, owner: OwnerDep, shelf: ShelfDep) -> ImportOut:
        """Load an export into this user, all or nothing; records the user already has are skipped."""
        records = parse_json_lines(await request.body())
        counts = await run_in_threadpool(shelf.import_, owner, records)
        return ImportOut(**counts)


def _safe(filename: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in filename)


def parse_json_lines(body: bytes) -> list[dict[str, Any]]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput("the import body is not UTF-8: send the export file unchanged") from exc
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InvalidInput(f"line {number} of the import is not JSON ({exc}): send the export file "
                               "unchanged, one JSON object per line") from exc
        except RecursionError:
            raise InvalidInput(f"line {number} of the import is nested too deeply to be a memshelf record: send "
                               "the export file unchanged") from None
        if not isinstance(record, dict):
            raise InvalidInput(f"line {number} of the import is not a JSON object: each line is one record")
        records.append(record)
    if not records:
        raise InvalidInput("the import body is empty: send the JSON Lines that GET .../export produced")
    return records


def _admin_routes(app: FastAPI) -> None:
    @app.post("/v1/admin/keys", status_code=201, tags=["admin"])
    def create_key(_: AdminDep, shelf: ShelfDep, body: KeyIn) -> NewKeyOut:
        """Make a key bound to a tenant (or, with tenant null, an admin key). The secret is shown once."""
        key, secret = shelf.create_key(body.tenant, body.name)
        return NewKeyOut(key=KeyOut.of(key), secret=secret)

    @app.get("/v1/admin/keys", tags=["admin"])
    def list_keys(_: AdminDep, shelf: ShelfDep, limit: ListLimit = 100, cursor: Cursor = None,
                  tenant: Annotated[str | None, Query(max_length=200)] = None) -> Page[KeyOut]:
        items, next_cursor = page_of(shelf.list_keys(tenant), limit, cursor)
        return Page[KeyOut](items=[KeyOut.of(k) for k in items], next_cursor=next_cursor)

    @app.delete("/v1/admin/keys/{key_id}", status_code=204, tags=["admin"])
    def revoke_key(_: AdminDep, shelf: ShelfDep, key_id: Annotated[str, Path(max_length=200)]) -> Response:
        shelf.revoke_key(key_id)
        return Response(status_code=204)

    @app.delete("/v1/admin/tenants/{tenant}", tags=["admin"])
    def forget_tenant(_: AdminDep, shelf: ShelfDep, tenant: Annotated[str, Path(max_length=200)]) -> ErasedOut:
        """Erase every user of a tenant."""
        return ErasedOut.of(shelf.forget_tenant(tenant))

    @app.post("/v1/admin/purge", tags=["admin"])
    def purge(_: AdminDep, shelf: ShelfDep) -> ErasedOut:
        """Delete, for good, every memory and message whose expiry has passed."""
        return ErasedOut.of(shelf.purge_expired())

    @app.get("/v1/admin/stats", tags=["admin"])
    def stats(_: AdminDep, shelf: ShelfDep) -> dict[str, Any]:
        return shelf.stats()


def _page_routes(app: FastAPI) -> None:
    @app.get("/health", tags=["health"])
    def health() -> dict[str, str]:
        """Liveness; needs no key."""
        return {"status": "ok"}

    @app.get("/", include_in_schema=False)
    def web_page() -> HTMLResponse:
        html = resources.files("memshelf").joinpath("web/index.html").read_text(encoding="utf-8")
        return HTMLResponse(html, headers={
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                                       "style-src 'unsafe-inline'; connect-src 'self'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})


# ---------------------------------------------------------------------------------------------- the app

DESCRIPTION = f"""
memshelf's HTTP API. Every `/v1` request carries an API key (`Authorization: Bearer <key>` or `X-API-Key`);
the tenant always comes from the key, the user from the path. Admin keys (no tenant) only reach `/v1/admin`.

Errors are `{{"error": {{"type": ..., "message": ...}}}}`. Limits: bodies up to {MAX_BODY_BYTES >> 20} MiB
(imports {MAX_IMPORT_BYTES >> 20} MiB), search `limit` 1..{MAX_SEARCH_LIMIT}, list `limit` 1..{MAX_LIST_LIMIT},
batches up to {MAX_BATCH} memories. Lists are paged: pass `next_cursor` back as `cursor`.

MCP (streamable HTTP) is at `/mcp`: the same key, and the user in the `{USER_HEADER}` header (or `?user=`).
"""


def create_app(shelf: Shelf | Callable[[], Shelf] | None = None, *, target: str | None = None,
               embedder: Any = _UNSET, mcp: bool = True) -> FastAPI:
    """The FastAPI app. `shelf` is a Shelf (the caller closes it) or a factory; without one, the app opens
    `Shelf.open(target, embedder=embedder)` with Shelf.open's defaults for what is not given (MEMSHELF_DATABASE_URL
    or MEMSHELF_DB, MEMSHELF_EMBEDDER) and closes it at shutdown."""
    owned = not isinstance(shelf, Shelf)
    opened = shelf if isinstance(shelf, Shelf) else (shelf or _opener(target, embedder))()
    mcp_endpoint = _mcp_endpoint(opened) if mcp else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if mcp_endpoint is not None:
                await stack.enter_async_context(mcp_endpoint.running())
            try:
                yield
            finally:
                if owned:
                    opened.close()

    app = FastAPI(title="memshelf", version=_version(), description=DESCRIPTION, lifespan=lifespan,
                  responses=_ERRORS)
    app.state.shelf = opened
    _install_error_handlers(app)
    for add_routes in (_page_routes, _memory_routes, _retrieval_routes, _fact_routes, _message_routes,
                       _owner_routes, _admin_routes):
        add_routes(app)
    if mcp_endpoint is not None:
        app.router.routes.append(Route("/mcp", mcp_endpoint, include_in_schema=False))  # an ASGI app: any method
    app.add_middleware(BodyLimit, limit_for=body_limit_for)
    app.add_middleware(ApiKeyAuth, shelf=opened)
    return app


def _opener(target: str | None, embedder: Any) -> Callable[[], Shelf]:
    if embedder is _UNSET:
        return lambda: Shelf.open(target)
    return lambda: Shelf.open(target, embedder=embedder)


def _version() -> str:
    from . import __version__

    return __version__


def _mcp_endpoint(shelf: Shelf) -> McpEndpoint:
    from .mcp import McpEndpoint

    return McpEndpoint(shelf)


def app_from_env() -> FastAPI:
    """The app each `memshelf serve` worker process builds for itself, configured by MEMSHELF_* variables
    (MEMSHELF_DATABASE_URL or MEMSHELF_DB; MEMSHELF_EMBEDDER), which Shelf.open reads."""
    return create_app()


def serve(host: str = "127.0.0.1", port: int = 8000, workers: int = 1, db: str | None = None,
          embedder: str | None = None, log_level: str | None = None, access_log: bool | None = None) -> None:
    """Run the HTTP server (blocks). With several workers each process opens its own Shelf on the same database
    (SQLite in WAL mode, or PostgreSQL). log_level and access_log default to MEMSHELF_LOG_LEVEL (info) and
    MEMSHELF_ACCESS_LOG (1; 0 turns the per-request log lines off). The caller's os.environ is left as it was."""
    import uvicorn

    if workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    level = log_level or os.environ.get("MEMSHELF_LOG_LEVEL", "info")
    if access_log is None:
        access_log = os.environ.get("MEMSHELF_ACCESS_LOG", "1").strip().lower() not in ("0", "false", "no", "off")
    options: dict[str, Any] = {"host": host, "port": port, "log_level": level.lower(), "access_log": access_log,
                               "proxy_headers": False}
    if workers == 1:  # one process: the app is built here and given its settings directly
        uvicorn.run(create_app(target=db, embedder=_UNSET if embedder is None else embedder), **options)
        return
    with _environ(_worker_settings(db, embedder)):  # other processes learn the settings from the environment
        uvicorn.run("memshelf.server:app_from_env", factory=True, workers=workers, **options)


def _worker_settings(db: str | None, embedder: str | None) -> dict[str, str | None]:
    """The MEMSHELF_* variables that tell each worker process what serve() was told (None: unset it)."""
    settings: dict[str, str | None] = {}
    if db is not None:
        url = "://" in db
        settings |= {"MEMSHELF_DATABASE_URL": db if url else None, "MEMSHELF_DB": None if url else db}
    if embedder is not None:
        settings["MEMSHELF_EMBEDDER"] = embedder
    return settings


@contextlib.contextmanager
def _environ(settings: dict[str, str | None]) -> Iterator[None]:
    """os.environ with `settings` applied while the block runs, then exactly as it was before."""
    saved = {name: os.environ.get(name) for name in settings}
    try:
        for name, value in settings.items():
            _set_env(name, value)
        yield
    finally:
        for name, value in saved.items():
            _set_env(name, value)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
