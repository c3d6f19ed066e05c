"""/v1/users/{user}/learn: learn facts and memories from a conversation (turns given, or a logged thread)."""

from __future__ import annotations

from fastapi import APIRouter

from ...errors import ConfigError, ExtractorError, InvalidInput
from ...learning.base import Extractor, resolve_extractor
from .._deps import OwnerDep, ShelfDep, WorkerRoute
from .._errors import ErrorOut
from .._schemas import LearnIn, PlanOut

__all__ = ["router"]

router = APIRouter(tags=["learning"], route_class=WorkerRoute)


@router.post("/v1/users/{user}/learn", responses={
    502: {"model": ErrorOut, "description": "the extractor failed (its model service was unreachable or answered "
                                            "with something unusable): nothing was written, retry later"},
    409: {"model": ErrorOut, "description": "what the learn read kept changing while it decided (other learns of "
                                            "the thread, erasures): nothing was written, learn again once they are "
                                            "done"}})
def learn(owner: OwnerDep, shelf: ShelfDep, body: LearnIn) -> PlanOut:
    """Learn from a conversation: the extractor proposes, memshelf decides and (unless dry_run) applies the plan
    in one transaction. Every proposal comes back with the decision taken on it and why."""
    messages = None if body.messages is None else [turn.model_dump(exclude_none=True) for turn in body.messages]
    plan = shelf.learn(owner, messages, thread=body.thread, extractor=_extractor(body.extractor),
                       dry_run=body.dry_run)
    return PlanOut.of(plan)


def _extractor(name: str | None) -> Extractor:
    """The extractor the body names (or the server's default), resolved before learning so that a name that
    cannot be used is the caller's error (422) or the server's setting (400), and an ExtractorError after this is
    the extractor failing (502)."""
    try:
        return resolve_extractor(name)
    except ExtractorError as exc:
        if name is None:
            raise ConfigError(f"the server's extractor (MEMSHELF_EXTRACTOR) cannot be used: {exc}") from exc
        raise InvalidInput(f"extractor: {exc}") from exc
