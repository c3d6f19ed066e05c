"""/v1/users/{user}/memories: remember, list, get and forget a user's memories."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from .._deps import Cursor, ListLimit, OwnerDep, ShelfDep
from .._schemas import NOT_BLANK, BatchIn, MemoryIn, MemoryOut, Page, erased_response

__all__ = ["router"]

router = APIRouter(tags=["memories"])

MemoryId = Annotated[str, Path(max_length=200, json_schema_extra=NOT_BLANK)]


@router.post("/v1/users/{user}/memories", status_code=201)
def remember(owner: OwnerDep, shelf: ShelfDep, body: MemoryIn) -> MemoryOut:
    """Remember one statement. Repeating the same topic and content counts another observation."""
    return MemoryOut.of(shelf.remember_many(owner, [body.model_dump(exclude_none=True)])[0])


@router.post("/v1/users/{user}/memories/batch", status_code=201)
def remember_batch(owner: OwnerDep, shelf: ShelfDep, body: BatchIn) -> list[MemoryOut]:
    """Remember up to 1000 statements in one transaction: all are stored, or none."""
    items = [item.model_dump(exclude_none=True) for item in body.memories]
    return [MemoryOut.of(m) for m in shelf.remember_many(owner, items)]


@router.get("/v1/users/{user}/memories")
def list_memories(owner: OwnerDep, shelf: ShelfDep, limit: ListLimit = 50, cursor: Cursor = None) -> Page[MemoryOut]:
    """The user's live memories, newest first, one page at a time."""
    memories, next_cursor = shelf.list_memories(owner, limit=limit, cursor=cursor)
    return Page[MemoryOut](items=[MemoryOut.of(m) for m in memories], next_cursor=next_cursor)


@router.get("/v1/users/{user}/memories/{memory_id}")
def get_memory(owner: OwnerDep, shelf: ShelfDep, memory_id: MemoryId) -> MemoryOut:
    return MemoryOut.of(shelf.get(owner, memory_id))


@router.delete("/v1/users/{user}/memories/{memory_id}", status_code=204)
def forget(owner: OwnerDep, shelf: ShelfDep, memory_id: MemoryId) -> Response:
    """Erase one memory, with its vector and index entries."""
    return erased_response(shelf.forget(owner, memory_id))
