"""The HTTP edge's errors: memshelf's exceptions become statuses here, and every error body has one shape:

    {"error": {"type": "invalid_input", "message": "what is wrong, and what to do"}}

At /mcp the same body is also a JSON-RPC error (`"jsonrpc": "2.0", "id": null` and a `code` beside `type` and
`message`): MCP clients report the message of a JSON-RPC error body, and only "Server returned an error response"
for any other.

A leaf: it imports nothing of memshelf but its exceptions, so the MCP endpoint answers in the same shape without
importing the rest of the server.
"""

from __future__ import annotations

import logging
from typing import Any
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from ..errors import (ConfigError, Conflict, DimensionMismatch, EmbedderError, EmbedderUnavailable, ExtractorError,
                      ExtractorUnavailable, InvalidInput, MemshelfError, NotFound, StoreError, StoreUnavailable,
                      UnknownSource)

__all__ = ["ERROR_RESPONSES", "KEY_HINT", "UNAUTHORIZED", "ApiError", "ErrorBody", "ErrorOut", "error_response",
           "http_error_response", "install_error_handlers", "internal_error_response", "memshelf_error_response",
           "problem", "text_header", "validation_error_response"]

log = logging.getLogger("memshelf.server")

ADVICE = {
    "memory_id": "list the user's memory ids with GET /v1/users/{user}/memories",
    "message_id": "list the user's messages with GET /v1/users/{user}/messages",
    "fact_key": "list the user's facts with GET /v1/users/{user}/facts",
    "key_id": "list the keys with GET /v1/admin/keys",
    "source": "use a declared source; a new one is declared where the server is started, e.g. "
              "MEMSHELF_SOURCES={subject}=0.8",
    "embedder": "this server has no embedder: send \"mode\": \"keyword\", or have the server started with "
                "MEMSHELF_EMBEDDER=local",
}
"""What to do about an error, in the HTTP API's terms, by the error's `fix` (memshelf.errors)."""

KEY_HINT = "create one with `memshelf keys create --tenant NAME` and send it as `Authorization: Bearer <key>`"
"""What a request without a usable API key should do next."""
UNAUTHORIZED = 'Bearer realm="memshelf"'
"""The WWW-Authenticate challenge of a 401 (RFC 6750): the key goes in `Authorization: Bearer <key>`."""
_RPC_AUTH_ERROR, _RPC_INVALID_REQUEST, _RPC_INTERNAL_ERROR = -32001, -32600, -32603
"""JSON-RPC codes at /mcp: a refused key (JSON-RPC leaves -32000..-32099 to servers), a request refused otherwise,
the server's own failure."""

_STATUS_OF: tuple[tuple[type[MemshelfError], int, str], ...] = (
    (UnknownSource, 422, "unknown_source"),
    (Conflict, 409, "conflict"),
    (InvalidInput, 422, "invalid_input"),
    (DimensionMismatch, 422, "dimension_mismatch"),
    (NotFound, 404, "not_found"),
    (ConfigError, 400, "not_configured"),
    (StoreUnavailable, 503, "store_unavailable"),
    (StoreError, 500, "store_error"),
    (EmbedderUnavailable, 503, "embedder_unavailable"),
    (EmbedderError, 502, "embedder_error"),
    (ExtractorUnavailable, 503, "extractor_unavailable"),  # the model service is down or busy: retry later
    (ExtractorError, 502, "extractor_error"),  # an extractor named in a request is resolved first: a bad name is 422
    (MemshelfError, 400, "error"),
)


class ApiError(Exception):
    """An HTTP answer decided at the edge (401, 403, 413, ...), in the one error shape."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class ErrorBody(BaseModel):
    type: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": text} for status, text in (
        (400, "malformed JSON or a setting the server lacks"), (401, "missing, wrong or revoked API key"),
        (403, "the key may not do this"), (404, "no such record for this owner"),
        (409, "the record's state does not allow this (e.g. confirming a superseded memory)"),
        (413, "body over the limit"),
        (422, "invalid input"), (500, "the storage failed (not a lock)"),
        (503, "storage busy or out of reach, retry"))}
"""The error answers every route may give, as OpenAPI documents them."""


def error_response(status: int, kind: str, message: str, headers: dict[str, str] | None = None, *,
                   rpc: bool = False) -> JSONResponse:
    """The one error body; with rpc (answers at /mcp) also a JSON-RPC error an MCP client reports."""
    error = {"type": kind, "message": message}
    if not rpc:
        return JSONResponse({"error": error}, status_code=status, headers=headers)
    code = (_RPC_AUTH_ERROR if status in (401, 403) else _RPC_INTERNAL_ERROR if status >= 500
            else _RPC_INVALID_REQUEST)
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": code, **error}}, status_code=status,
                        headers=headers)


def memshelf_error_response(exc: MemshelfError, user: str | None = None, *, rpc: bool = False) -> JSONResponse:
    """The error's answer, its advice in the API's terms; `user` is the path's, for the routes advice names."""
    status, kind = next((s, k) for cls, s, k in _STATUS_OF if isinstance(exc, cls))
    if status >= 500:
        log.warning("%s: %s", type(exc).__name__, exc)
    message = exc.in_terms(ADVICE, user="{user}" if user is None else quote(user, safe=""))
    return error_response(status, kind, message, {"Retry-After": "1"} if status == 503 else None, rpc=rpc)


def problem(where: str, error: Mapping[str, Any]) -> str:
    """One of pydantic's validation errors as a plain sentence (no link): what is wrong with which field."""
    if error["type"] == "missing":
        return f"{where} is missing"
    if error["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    message = str(error.get("msg", "invalid"))
    return f"{where}: {message[:1].lower()}{message[1:]}"


def _validation_message(errors: Sequence[dict[str, Any]]) -> str:
    parts = [problem(".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body", error)
             for error in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more + ". Fix the request; the schema of every endpoint is at /docs"


_MALFORMED = ("the request body is not valid JSON: send a JSON object in UTF-8 with Content-Type: "
              "application/json (see /docs)")
_UNPARSED = "There was an error parsing the body"
"""FastAPI's detail when the JSON parser itself fails (bytes that are not UTF-8, a number of thousands of digits,
nesting too deep): the same mistake as any other malformed body, answered the same way."""


_NOT_AN_OBJECT = ("the request body is not a JSON object: send the endpoint's fields as one JSON object with "
                  "Content-Type: application/json (a body of another type is not read as JSON; the fields are at "
                  "/docs)")
_OBJECT_EXPECTED = frozenset({"model_attributes_type", "model_type", "dict_type"})


def validation_error_response(exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    if any(error.get("type") == "json_invalid" for error in errors):
        return error_response(400, "malformed_json", _MALFORMED)
    if errors and all(tuple(error.get("loc", ())) == ("body",) and error.get("type") in _OBJECT_EXPECTED
                      for error in errors):
        # The whole body is not an object: a JSON array or string, or a body sent as text/plain or a form.
        return error_response(422, "validation_error", _NOT_AN_OBJECT)
    return error_response(422, "validation_error", _validation_message(errors))


def http_error_response(exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400 and exc.detail == _UNPARSED:
        return error_response(400, "malformed_json", _MALFORMED)
    message = "no such endpoint: the API is described at /docs" if exc.status_code == 404 else str(exc.detail)
    return error_response(exc.status_code, "not_found" if exc.status_code == 404 else "http_error", message,
                          dict(exc.headers) if exc.headers else None)


def internal_error_response(exc: Exception) -> JSONResponse:
    log.exception("unexpected error while serving a request", exc_info=exc)
    return error_response(500, "internal_error", "the server failed unexpectedly; the details are in the server "
                                                 "log. Retry, and report it if it keeps happening")


def install_error_handlers(app: FastAPI, allowed_methods: Callable[[Scope], set[str]]) -> None:
    """allowed_methods: the methods the routes at a request's path take, for the Allow header of a 405."""
    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.kind, exc.message)

    async def on_memshelf_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, MemshelfError)
        return memshelf_error_response(exc, request.path_params.get("user"))

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 405:  # Starlette's Allow names the methods of one route; a path may have several
            allow = ", ".join(sorted(allowed_methods(request.scope)))
            return error_response(405, "method_not_allowed", f"this endpoint takes {allow}, not {request.method}: "
                                                             "see /docs", {"Allow": allow})
        return http_error_response(exc)

    async def on_anything_else(_: Request, exc: Exception) -> JSONResponse:
        return internal_error_response(exc)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(MemshelfError, on_memshelf_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_anything_else)


def text_header(headers: Headers, name: str) -> str | None:
    """A header's value as the text the client meant: HTTP carries bytes, which the server reads as Latin-1, so a
    user "Zoë" sent as UTF-8 arrived as "ZoÃ«" and wrote to another user. Read as UTF-8; bytes that are not UTF-8
    are refused (InvalidInput) rather than guessed."""
    value = headers.get(name)
    if value is None or value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise InvalidInput(f"the {name} header is not UTF-8 text: send it encoded as UTF-8, or pass the value in "
                           "the query or the body instead") from None
