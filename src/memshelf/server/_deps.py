"""What the routes share: the dependencies that find the shelf, the caller's key and the owner, and paging
(`limit`, opaque `cursor`s)."""

from __future__ import annotations

import base64
import functools
import inspect
from typing import Annotated, Any, TypeVar
from collections.abc import Callable, Sequence
from urllib.parse import unquote

from fastapi import Depends, Path, Query, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match
from starlette.types import Scope

from ..errors import InvalidInput
from ..model import Owner
from ..shelf import Shelf
from ..stores.base import ApiKey
from ._errors import KEY_HINT, ApiError
from ._middleware import SEGMENTS_KEPT
from ._schemas import IDENTIFIER

__all__ = ["KEY_SECURITY", "MAX_LIST_LIMIT", "AdminDep", "Cursor", "ListLimit", "OwnerDep", "ShelfDep", "TenantDep",
           "UserPath", "WorkerRoute",
           "admin_key", "caller_key", "checked_key", "key_tenant", "offset_cursor", "page_of", "read_offset_cursor",
           "shelf_of", "tenant_of", "user_owner"]

MAX_LIST_LIMIT = 1_000

T = TypeVar("T")

ListLimit = Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT, description=f"page size, 1..{MAX_LIST_LIMIT}")]
Cursor = Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page, unchanged")]
UserPath = Annotated[str, Path(min_length=1, max_length=200, json_schema_extra=IDENTIFIER, description=(
    "the user inside your key's tenant: printable text (no control characters), not only spaces"))]


# ---------------------------------------------------------------------------------------------- routes

class WorkerRoute(APIRoute):
    """A route whose plain `def` endpoint (the Shelf's calls block) runs in a worker thread in one hop.

    FastAPI runs a plain endpoint in a worker thread, then checks what it returned against the response model in
    a second worker-thread hop. Made a coroutine that awaits the worker, the endpoint's answer is checked on the
    event loop instead (microseconds of work), so a request makes one hop, not two: 15% more keyword searches
    and 30% more health checks per second on one worker (BENCHMARKS.md, "HTTP: one worker-thread hop")."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **options: Any) -> None:
        if not inspect.iscoroutinefunction(endpoint):
            endpoint = _in_worker(endpoint)
        super().__init__(path, endpoint, **options)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """As APIRoute's; when EncodedSlashes kept a segment's "/" encoded, the parameters are decoded here."""
        match, child = super().matches(scope)
        if match != Match.NONE and scope.get(SEGMENTS_KEPT) and "path_params" in child:
            child["path_params"] = {name: unquote(value) if isinstance(value, str) else value
                                    for name, value in child["path_params"].items()}
        return match, child


def _in_worker(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(endpoint)  # FastAPI reads the parameters and the response model through __wrapped__
    async def awaited(*args: Any, **kwargs: Any) -> Any:
        return await run_in_threadpool(endpoint, *args, **kwargs)

    return awaited


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
KEY_SECURITY: list[dict[str, list[str]]] = [{scheme.scheme_name: []} for scheme in (_bearer, _api_key_header)]
"""The two key schemes as an OpenAPI `security` list, for a route that takes no key dependency."""


async def shelf_of(request: Request) -> Shelf:
    return request.app.state.shelf  # type: ignore[no-any-return]


async def caller_key(request: Request, _bearer_doc: Any = Security(_bearer),
               _header_doc: Any = Security(_api_key_header)) -> ApiKey:
    """The key ApiKeyAuth checked (the Security parameters only document the two headers in OpenAPI)."""
    return checked_key(request)


def checked_key(request: Request) -> ApiKey:
    """The key ApiKeyAuth checked and put in the request's state."""
    key = getattr(request.state, "memshelf_key", None)
    if key is None:
        raise ApiError(401, "unauthorized", f"missing API key: {KEY_HINT}")
    return key  # type: ignore[no-any-return]


async def key_tenant(key: ApiKey = Depends(caller_key)) -> str:
    """The tenant of a route that reads a tenant's data: always the key's; an admin key has none."""
    return tenant_of(key)


def tenant_of(key: ApiKey) -> str:
    if key.tenant is None:
        raise ApiError(403, "forbidden", "admin keys only manage keys and tenants (/v1/admin): use a key bound "
                                         "to a tenant for user data")
    return key.tenant


async def user_owner(user: UserPath, tenant: str = Depends(key_tenant)) -> Owner:
    """The owner of a user route: the tenant always comes from the key, the user from the path."""
    return Owner(tenant, user)


async def admin_key(key: ApiKey = Depends(caller_key)) -> ApiKey:
    if key.tenant is not None:
        raise ApiError(403, "forbidden", "this endpoint needs an admin key: create one with "
                                         "`memshelf keys create --admin`")
    return key


# The dependencies are async because they never block: a sync one would cost a trip to the thread pool.
ShelfDep = Annotated[Shelf, Depends(shelf_of)]
OwnerDep = Annotated[Owner, Depends(user_owner)]
TenantDep = Annotated[str, Depends(key_tenant)]
AdminDep = Annotated[ApiKey, Depends(admin_key)]
