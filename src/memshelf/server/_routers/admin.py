"""/v1/admin: API keys, erasing a tenant, purging expired records, finishing erasures' scrub and counting records
(admin keys only); and
/v1/key, the key a request is made with (any key)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response

from ...stores.base import ApiKey
from .._deps import AdminDep, Cursor, ListLimit, ShelfDep, WorkerRoute, caller_key, page_of
from .._schemas import IDENTIFIER, NOT_BLANK, ErasedOut, KeyIn, KeyOut, NewKeyOut, Page, ScrubIn, ScrubOut

__all__ = ["router"]

router = APIRouter(tags=["admin"], route_class=WorkerRoute)

KeyId = Annotated[str, Path(max_length=200, json_schema_extra=NOT_BLANK)]
TenantPath = Annotated[str, Path(max_length=200, json_schema_extra=IDENTIFIER)]
TenantQuery = Annotated[str | None, Query(max_length=200, json_schema_extra=IDENTIFIER)]


@router.get("/v1/key")
async def this_key(key: Annotated[ApiKey, Depends(caller_key)]) -> KeyOut:
    """The key this request was made with: its id, name, and tenant (null for an admin key), never its secret. A
    client checks with it whose records it reaches."""
    return KeyOut.of(key)


@router.post("/v1/admin/keys", status_code=201)
def create_key(_: AdminDep, shelf: ShelfDep, body: KeyIn) -> NewKeyOut:
    """Make a key bound to a tenant (or, with tenant null, an admin key). The secret is shown once."""
    key, secret = shelf.create_key(body.tenant, body.name)
    return NewKeyOut(key=KeyOut.of(key), secret=secret)


@router.get("/v1/admin/keys")
def list_keys(_: AdminDep, shelf: ShelfDep, limit: ListLimit = 100, cursor: Cursor = None,
              tenant: TenantQuery = None) -> Page[KeyOut]:
    items, next_cursor = page_of(shelf.list_keys(tenant), limit, cursor)
    return Page[KeyOut](items=[KeyOut.of(k) for k in items], next_cursor=next_cursor)


@router.delete("/v1/admin/keys/{key_id}", status_code=204)
def revoke_key(_: AdminDep, shelf: ShelfDep, key_id: KeyId) -> Response:
    shelf.revoke_key(key_id)
    return Response(status_code=204)


@router.delete("/v1/admin/tenants/{tenant}")
def forget_tenant(_: AdminDep, shelf: ShelfDep, tenant: TenantPath) -> ErasedOut:
    """Erase every user of a tenant."""
    return ErasedOut.of(shelf.forget_tenant(tenant))


@router.post("/v1/admin/purge")
def purge(_: AdminDep, shelf: ShelfDep) -> ErasedOut:
    """Delete, for good, every memory and message whose expiry has passed."""
    return ErasedOut.of(shelf.purge_expired())


@router.post("/v1/admin/scrub")
def scrub(_: AdminDep, shelf: ShelfDep, body: ScrubIn | None = None) -> ScrubOut:
    """Finish now what erasures left for later (an erasure that answered scrub_pending true, or the header
    X-Memshelf-Scrub-Pending): PostgreSQL's queued scrub (full: VACUUM FULL, which locks the tables while it
    rewrites them), SQLite's checkpoint a reader held up. scrub_pending: whether a copy may still be on disk."""
    return ScrubOut(scrub_pending=shelf.scrub(full=body.full if body is not None else None))


@router.get("/v1/admin/stats")
def stats(_: AdminDep, shelf: ShelfDep) -> dict[str, Any]:
    return shelf.stats()
