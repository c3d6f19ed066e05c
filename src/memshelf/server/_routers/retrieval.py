"""Search, the `Relevant knowledge` block and the whole prompt, for a user's question."""

from __future__ import annotations

from fastapi import APIRouter

from .._deps import OwnerDep, ShelfDep, WorkerRoute
from .._schemas import ContextIn, ContextOut, HitOut, PromptIn, PromptOut, SearchIn, SearchOut

__all__ = ["router"]

router = APIRouter(tags=["retrieval"], route_class=WorkerRoute)


@router.post("/v1/users/{user}/search")
def search(owner: OwnerDep, shelf: ShelfDep, body: SearchIn) -> SearchOut:
    """Find the user's memories for a question; each hit says which retriever found it and its score."""
    result = shelf.search(owner, body.question, mode=body.mode, limit=body.limit, floor=body.floor)
    return SearchOut(mode=result.mode, degraded=result.degraded, reason=result.reason, unembedded=result.unembedded,
                     hits=[HitOut.of(hit) for hit in result])


@router.post("/v1/users/{user}/context")
def context(owner: OwnerDep, shelf: ShelfDep, body: ContextIn) -> ContextOut:
    """The `Relevant knowledge` block for a question, ready to put in a prompt."""
    return ContextOut(context=shelf.context(owner, body.question, limit=body.limit, mode=body.mode))


@router.post("/v1/users/{user}/prompt")
def build_prompt(owner: OwnerDep, shelf: ShelfDep, body: PromptIn) -> PromptOut:
    """The base prompt, then the user's facts, then relevant knowledge (only when something matches)."""
    return PromptOut(prompt=shelf.build_prompt(body.base_prompt, owner, body.user_text, limit=body.limit,
                                               mode=body.mode))
