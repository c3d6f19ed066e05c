"""/v1/users/{user}/memories: remember, list, get, confirm, re-date and forget a user's memories; and the evidence
of what learning wrote."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Response

from ...model import MAX_FACT_KEY_CHARS, MAX_TOPIC_CHARS
from .._deps import Cursor, ListLimit, OwnerDep, ShelfDep, WorkerRoute
from .._schemas import (FILTER, NOT_BLANK, TEXT, BatchIn, EvidenceOut, ExpiryIn, MemoryIn, MemoryOut, Page,
                        erased_response)

__all__ = ["router"]

router = APIRouter(tags=["memories"], route_class=WorkerRoute)

MemoryId = Annotated[str, Path(max_length=200, json_schema_extra=NOT_BLANK)]
TopicFilter = Annotated[str | None, Query(max_length=MAX_TOPIC_CHARS, description="only memories of this topic")]
SourceFilter = Annotated[str | None, Query(max_length=64, description="only memories of this source")]
ContainsFilter = Annotated[str | None, Query(max_length=MAX_TOPIC_CHARS, json_schema_extra=FILTER, description=(
    "only memories whose topic or content contains this text: ASCII letters in either case, % and _ as themselves"))]
Order = Annotated[Literal["newest", "confident"], Query(description=(
    "newest first, or most confident first (then newest); a cursor goes with the order it was given for"))]
Superseded = Annotated[bool, Query(description="superseded memories too; superseded_by names what replaced each")]


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
def list_memories(owner: OwnerDep, shelf: ShelfDep, limit: ListLimit = 50, cursor: Cursor = None,
                  topic: TopicFilter = None, source: SourceFilter = None, contains: ContainsFilter = None,
                  order: Order = "newest", include_superseded: Superseded = False) -> Page[MemoryOut]:
    """The user's live memories, newest (or most confident) first, one page at a time; filtered by topic, source
    and text. Give the same filters with each page's cursor."""
    memories, next_cursor = shelf.list_memories(owner, limit=limit, cursor=cursor, topic=topic, source=source,
                                                contains=contains, order=order,
                                                include_superseded=include_superseded)
    return Page[MemoryOut](items=[MemoryOut.of(m) for m in memories], next_cursor=next_cursor)


@router.get("/v1/users/{user}/memories/{memory_id}")
def get_memory(owner: OwnerDep, shelf: ShelfDep, memory_id: MemoryId) -> MemoryOut:
    return MemoryOut.of(shelf.get(owner, memory_id))


@router.delete("/v1/users/{user}/memories/{memory_id}", status_code=204)
def forget(owner: OwnerDep, shelf: ShelfDep, memory_id: MemoryId) -> Response:
    """Erase one memory, with its vector and index entries."""
    return erased_response(shelf.forget(owner, memory_id))


@router.post("/v1/users/{user}/memories/{memory_id}/confirm", responses={
    409: {"description": "the memory was superseded: confirm the one that replaced it"}})
def confirm(owner: OwnerDep, shelf: ShelfDep, memory_id: MemoryId) -> MemoryOut:
    """The user vouches for a mined or inferred memory: it becomes stated, and confirmed_at and confirmed_from
    record when and what it was. A memory already stated comes back unchanged."""
    return MemoryOut.of(shelf.confirm(owner, memory_id))


@router.patch("/v1/users/{user}/memories/{memory_id}")
def set_expiry(owner: OwnerDep, shelf: ShelfDep, memory_id: MemoryId, body: ExpiryIn) -> MemoryOut:
    """Change when a memory expires: {"ttl": seconds}, {"expires_at": instant}, or {"expires_at": null} to keep it."""
    return MemoryOut.of(shelf.set_expiry(owner, memory_id, **body.model_dump(exclude_unset=True)))


EvidenceKey = Annotated[str | None, Query(max_length=MAX_FACT_KEY_CHARS, json_schema_extra=TEXT,
                                          description="the evidence of this fact (its key)")]


@router.get("/v1/users/{user}/evidence", tags=["learning"])
def evidence(owner: OwnerDep, shelf: ShelfDep,
             memory_id: Annotated[str | None, Query(max_length=200, json_schema_extra=NOT_BLANK,
                                                    description="the evidence of this memory")] = None,
             key: EvidenceKey = None) -> list[EvidenceOut]:
    """The messages learning took a memory (memory_id) or a fact (key) from, oldest first; with neither, the
    evidence of everything the user's memory learned. Empty for what a caller wrote."""
    return [EvidenceOut.of(e) for e in shelf.evidence(owner, memory_id=memory_id, key=key)]
