"""/v1/users: the key's tenant's users; /v1/users/{user}: erase a user, and move a user's records out and in as
JSON Lines."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from ...errors import InvalidInput
from ...exports import json_lines
from ...model import MAX_ID_CHARS
from ...shelf import MAX_USERS_CURSOR_CHARS
from .._deps import ListLimit, OwnerDep, ShelfDep, TenantDep, WorkerRoute
from .._middleware import MAX_IMPORT_BYTES
from .._schemas import FILTER, ErasedOut, ImportOut, Page, UserOut

__all__ = ["parse_json_lines", "router"]

router = APIRouter(tags=["users"], route_class=WorkerRoute)


UsersCursor = Annotated[str | None, Query(max_length=MAX_USERS_CURSOR_CHARS,
                                          description="next_cursor of the previous page, unchanged")]
Contains = Annotated[str | None, Query(max_length=MAX_ID_CHARS, json_schema_extra=FILTER, description=(
    "only users whose id contains this text: ASCII letters in either case, % and _ as themselves"))]


@router.get("/v1/users")
def list_users(tenant: TenantDep, shelf: ShelfDep, limit: ListLimit = 50, cursor: UsersCursor = None,
               contains: Contains = None) -> Page[UserOut]:
    """The users of the key's tenant by user id, each with how many live memories, facts and messages they have."""
    users, next_cursor = shelf.list_users(tenant, limit=limit, cursor=cursor, contains=contains)
    return Page[UserOut](items=[UserOut.of(u) for u in users], next_cursor=next_cursor)


@router.delete("/v1/users/{user}")
def forget_user(owner: OwnerDep, shelf: ShelfDep) -> ErasedOut:
    """Erase every trace of the user: memories, vectors, index entries, facts and history, messages."""
    return ErasedOut.of(shelf.forget_user(owner))


@router.get("/v1/users/{user}/export",
            responses={200: {"content": {"application/x-ndjson": {}}, "description": "JSON Lines"}})
def export(owner: OwnerDep, shelf: ShelfDep) -> StreamingResponse:
    """Every live record of the user as JSON Lines, expired ones left out (feed it back to import)."""
    lines = (json.dumps(record, ensure_ascii=False) + "\n" for record in shelf.export(owner))
    filename = f"memshelf-{owner.tenant}-{owner.user}.jsonl".encode("ascii", "replace").decode()
    return StreamingResponse(lines, media_type="application/x-ndjson",
                             headers={"Content-Disposition": f'attachment; filename="{_safe(filename)}"'})


@router.post("/v1/users/{user}/import", response_model_exclude_none=True, openapi_extra={"requestBody": {
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
    for number, record in json_lines(text, "the import"):
        if not isinstance(record, dict):
            raise InvalidInput(f"line {number} of the import is not a JSON object: each line is one record")
        records.append(record)
    if not records:
        raise InvalidInput("the import body is empty: send the JSON Lines that GET .../export produced")
    return records
