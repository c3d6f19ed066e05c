"""/v1/users/{user}/facts: a user's keyed state, one current value per key, and each key's history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from ...model import MAX_FACT_KEY_CHARS
from .._deps import Cursor, ListLimit, OwnerDep, ShelfDep, WorkerRoute, page_of
from .._schemas import TEXT, FactChangeOut, FactIn, FactOut, Page, erased_response

__all__ = ["router"]

router = APIRouter(tags=["facts"], route_class=WorkerRoute)

FactKey = Annotated[str, Path(min_length=1, max_length=MAX_FACT_KEY_CHARS, json_schema_extra=TEXT)]


@router.get("/v1/users/{user}/facts")
def list_facts(owner: OwnerDep, shelf: ShelfDep, limit: ListLimit = 100, cursor: Cursor = None) -> Page[FactOut]:
    """The user's current facts, most recently set first."""
    items, next_cursor = page_of(shelf.facts(owner), limit, cursor)
    return Page[FactOut](items=[FactOut.of(f) for f in items], next_cursor=next_cursor)


@router.get("/v1/users/{user}/facts/{key}")
def get_fact(owner: OwnerDep, shelf: ShelfDep, key: FactKey) -> FactOut:
    return FactOut.of(shelf.get_fact(owner, key))


@router.put("/v1/users/{user}/facts/{key}")
def set_fact(owner: OwnerDep, shelf: ShelfDep, key: FactKey, body: FactIn) -> FactOut:
    """Set the one current value of a fact; the old value stays in its history."""
    return FactOut.of(shelf.set_fact(owner, key, body.value, body.source))


@router.delete("/v1/users/{user}/facts/{key}", status_code=204)
def forget_fact(owner: OwnerDep, shelf: ShelfDep, key: FactKey) -> Response:
    return erased_response(shelf.forget_fact(owner, key))


@router.get("/v1/users/{user}/facts/{key}/history")
def fact_history(owner: OwnerDep, shelf: ShelfDep, key: FactKey, limit: ListLimit = 100,
                 cursor: Cursor = None) -> Page[FactChangeOut]:
    """Every value the fact had, oldest first."""
    items, next_cursor = page_of(shelf.fact_history(owner, key), limit, cursor)
    return Page[FactChangeOut](items=[FactChangeOut.of(c) for c in items], next_cursor=next_cursor)
