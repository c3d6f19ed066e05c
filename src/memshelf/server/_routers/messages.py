"""/v1/users/{user}/messages and /threads: a user's conversation turns, by thread, and erasing a thread."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from ...model import MAX_TOPIC_CHARS
from .._deps import Cursor, ListLimit, OwnerDep, ShelfDep, WorkerRoute
from .._schemas import (NOT_BLANK, TEXT, ErasedOut, MessageIdsIn, MessageIn, MessageOut, MessagesIn, Page,
                        erased_response)

__all__ = ["router"]

router = APIRouter(tags=["messages"], route_class=WorkerRoute)

ThreadQuery = Annotated[str | None, Query(min_length=1, max_length=MAX_TOPIC_CHARS, json_schema_extra=TEXT)]
ThreadPath = Annotated[str, Path(min_length=1, max_length=MAX_TOPIC_CHARS, json_schema_extra=TEXT)]


@router.post("/v1/users/{user}/messages", status_code=201)
def log_message(owner: OwnerDep, shelf: ShelfDep, body: MessageIn) -> MessageOut:
    """Append one conversation turn to a thread. Messages are history, never returned as knowledge."""
    ttl = {} if body.ttl is None else {"ttl": body.ttl}
    return MessageOut.of(shelf.log_message(owner, body.thread, body.role, body.content, **ttl))


@router.post("/v1/users/{user}/messages/batch", status_code=201)
def log_messages(owner: OwnerDep, shelf: ShelfDep, body: MessagesIn) -> list[MessageOut]:
    """Append up to 1000 turns to a thread, in order, in one transaction: all are kept, or none."""
    ttl = {} if body.ttl is None else {"ttl": body.ttl}
    turns = [turn.model_dump() for turn in body.messages]
    return [MessageOut.of(m) for m in shelf.log_messages(owner, body.thread, turns, **ttl)]


@router.get("/v1/users/{user}/messages")
def list_messages(owner: OwnerDep, shelf: ShelfDep, limit: ListLimit = 50, cursor: Cursor = None,
                  thread: ThreadQuery = None) -> Page[MessageOut]:
    """The user's messages (of one thread, or all), newest first, one page at a time."""
    items, next_cursor = shelf.list_messages(owner, thread, limit=limit, cursor=cursor)
    return Page[MessageOut](items=[MessageOut.of(m) for m in items], next_cursor=next_cursor)


@router.delete("/v1/users/{user}/messages/{message_id}", status_code=204)
def forget_message(owner: OwnerDep, shelf: ShelfDep,
                   message_id: Annotated[str, Path(max_length=200, json_schema_extra=NOT_BLANK)]) -> Response:
    """Erase one message, with the evidence that cites it (what was learned from it stays)."""
    return erased_response(shelf.forget_message(owner, message_id))


@router.post("/v1/users/{user}/messages/forget")
def forget_messages(owner: OwnerDep, shelf: ShelfDep, body: MessageIdsIn) -> ErasedOut:
    """Erase up to 1000 messages in one transaction, each with the evidence that cites it: all of them, or none
    when one is not the user's (404)."""
    return ErasedOut.of(shelf.forget_messages(owner, body.ids))


@router.delete("/v1/users/{user}/threads/{thread}")
def forget_thread(owner: OwnerDep, shelf: ShelfDep, thread: ThreadPath,
                  cascade: Annotated[bool, Query(description="also erase the memories and facts learned only from "
                                                             "this thread")] = False) -> ErasedOut:
    """Erase a thread: its messages and its learning watermark; with cascade, also what was learned only from it
    (a record with evidence in another thread, or written by the caller, stays)."""
    return ErasedOut.of(shelf.forget_thread(owner, thread, cascade=cascade))
