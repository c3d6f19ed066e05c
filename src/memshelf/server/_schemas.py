"""The bodies the HTTP API reads and writes. Requests are strict (an unknown field is an error); a response that
shows one of memshelf's records (model.py's Memory, Fact, ...) takes its fields from the record itself, so a field
added to a record appears in the API with no second edit."""

from __future__ import annotations

import dataclasses
import typing
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Self, TypeVar
from collections.abc import Callable, Collection, Mapping

from fastapi import Response
from pydantic import (AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, create_model,
                      model_validator)

from ..learning.base import Plan, Proposal, Usage
from ..model import (MAX_CONTENT_CHARS, MAX_FACT_VALUE_CHARS, MAX_SEARCH_LIMIT, MAX_TOPIC_CHARS, Fact, FactChange,
                     Hit, Memory, Message, Mode, ROLES, UserSummary)
from ..stores.base import ApiKey, Erased, Evidence

__all__ = ["DECLARED_SOURCES", "FILTER", "IDENTIFIER", "MAX_BATCH", "MAX_LEARN_TURNS", "MAX_SEARCH_LIMIT",
           "NOT_BLANK", "SCRUB_PENDING_HEADER", "TEXT", "BatchIn", "ContextIn", "ContextOut", "ErasedOut",
           "EvidenceOut", "ExpiryIn", "FactChangeOut", "FactIn", "FactOut", "HitOut", "ImportOut", "KeyIn", "KeyOut",
           "LearnIn", "LoggedTurn", "MemoryIn", "MemoryOut", "MessageIdsIn", "MessageIn", "MessageOut", "MessagesIn",
           "NewKeyOut", "Out", "Page", "PlanOut", "PromptIn", "PromptOut", "ProposalOut", "SearchIn", "SearchOut",
           "Strict", "TurnIn", "UsageOut", "UserOut", "erased_response", "fields_of"]

MAX_BATCH = 1_000
MAX_LEARN_TURNS = 1_000

T = TypeVar("T")
OutT = TypeVar("OutT", bound="Out")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The rules memshelf checks (model.py), spelled out for the schema so that it allows what the server accepts. They
# are documented, not enforced, here: memshelf's own check says what is wrong in plainer words than a regex.
_SPACE = r"\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
"""What str.strip() removes (str.isspace()); JSON Schema's \\s is ECMA-262's, another set."""
IDENTIFIER = {"pattern": rf"^(?!\.\.?$)[^{_SPACE}\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]*[^{_SPACE}\x00-\x1f\x7f])?$"}
"""A tenant or user: no control characters, no spaces at either end, not "." or ".." (model.addressable)."""
TEXT = {"pattern": rf"^[^\x00]*[^{_SPACE}\x00][^\x00]*$"}
"""Stored text (content, topic, thread, role, fact key and value): no NUL, not only spaces."""
NO_NUL = {"pattern": r"^[^\x00]*$"}
FILTER = {"pattern": r"^[^\x00-\x1f\x7f]*$"}
"""Text a filter looks for in identifiers: no control characters (no identifier has any)."""
NOT_BLANK = {"pattern": rf"[^{_SPACE}]"}
"""An id: anything but only spaces."""
DECLARED_SOURCES = "x-memshelf-declared-sources"
"""Marks a request's `source`: create_app puts the sources the server declares there, as the enum."""

Text = Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS, json_schema_extra=TEXT)]
Topic = Annotated[str, Field(min_length=1, max_length=MAX_TOPIC_CHARS, examples=["network"], json_schema_extra=TEXT)]
SourceName = Annotated[str, Field(min_length=1, max_length=64, examples=["stated"],
                                  json_schema_extra={DECLARED_SOURCES: True},
                                  description="provenance, one of the sources this server declares: stated (1.0), "
                                              "mined (0.6), inferred (0.4) and any it was told of; the source "
                                              "sets the confidence")]
ROLE = {"pattern": rf"^[{_SPACE}]*(?:{'|'.join(''.join(f'[{c.upper()}{c}]' for c in r) for r in ROLES)})[{_SPACE}]*$"}
"""One of the chat roles, in any case (JSON Schema's patterns have no flag for that), as check_role accepts it."""
Role = Annotated[str, Field(min_length=1, max_length=64, examples=["user"], json_schema_extra=ROLE,
                            description=f"who said it: {', '.join(ROLES)}")]
# Numbers and booleans as JSON sends them (strict): true is not 1 second, "10" is not a limit of 10.
Seconds = Annotated[float, Field(strict=True, gt=0, le=100 * 365 * 86400, description="time to live, in seconds")]
SearchLimit = Annotated[int, Field(strict=True, ge=1, le=MAX_SEARCH_LIMIT)]


class MemoryIn(Strict):
    topic: Topic
    content: Text
    source: SourceName = "stated"
    ttl: Seconds | None = None
    expires_at: AwareDatetime | None = Field(None, description="an ISO 8601 instant with a time zone; or use ttl")


class BatchIn(Strict):
    memories: list[MemoryIn] = Field(min_length=1, max_length=MAX_BATCH)


class Out(BaseModel):
    """A response model filled from a memshelf record's attributes of the same names: `Out.of(record)`."""

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def of(cls, record: object) -> Self:
        return cls.model_validate(record)


def fields_of(record: type, *, omit: Collection[str] = (), nested: Mapping[str, Any] | None = None,
              extra: Mapping[str, tuple[Any, Any]] | None = None) -> Callable[[type[OutT]], type[OutT]]:
    """A class decorator: the response model gets the fields of a record (a dataclass of model.py), in the
    record's order, each always present in the answer; the record's docstring describes it in OpenAPI.

    omit: fields the API does not show. nested: the response model of a field that is itself a record (or
    `list[Model]` for a tuple of records).
    extra: fields after the record's, as (type, default or Field(...)), e.g. a property of the record."""
    def derive(cls: type[OutT]) -> type[OutT]:
        hints = typing.get_type_hints(record)
        fields: dict[str, Any] = {field.name: ((nested or {}).get(field.name, hints[field.name]), ...)
                                  for field in dataclasses.fields(record) if field.name not in omit}
        fields |= extra or {}
        return create_model(cls.__name__, __base__=cls, __module__=cls.__module__, __doc__=record.__doc__, **fields)
    return derive


@fields_of(Memory)
class MemoryOut(Out):
    pass


class ExpiryIn(Strict):
    """A memory's new expiry: exactly one of ttl (seconds from now) and expires_at (null: never expires)."""

    ttl: Seconds | None = None
    expires_at: AwareDatetime | None = Field(None, description="an ISO 8601 instant with a time zone, or null "
                                                               "for a memory that never expires")

    @model_validator(mode="after")
    def _one_of(self) -> Self:
        given = self.model_fields_set & {"ttl", "expires_at"}
        if len(given) != 1 or given == {"ttl"} and self.ttl is None:
            raise ValueError('give exactly one of "ttl" (seconds from now) and "expires_at" (an instant, or null '
                             'for never), e.g. {"ttl": 86400}')
        return self


@fields_of(Evidence)
class EvidenceOut(Out):
    pass


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(description="pass as `cursor` to get the next page; null on the last page")


class SearchIn(Strict):
    question: Text
    mode: Mode = "auto"
    limit: SearchLimit = 5
    floor: float | None = Field(None, strict=True, ge=-1.0, le=1.0, description="lowest cosine for meaning search")


@fields_of(Hit, nested={"memory": MemoryOut})
class HitOut(Out):
    pass


class SearchOut(BaseModel):
    mode: str
    degraded: bool = Field(description="true when meaning search was wanted but the embedder was unreachable")
    reason: str | None
    unembedded: int = Field(0, description="in a search by meaning that found fewer than asked: how many of the "
                                           "user's memories it could not see, having no vector yet (the server's "
                                           "operator runs backfill to embed them)")
    hits: list[HitOut]


class ContextIn(Strict):
    question: Text
    mode: Mode = "auto"
    limit: SearchLimit = 3


class ContextOut(BaseModel):
    context: str = Field(description="the `Relevant knowledge` block, or empty when nothing matches")


class PromptIn(Strict):
    base_prompt: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
    user_text: Annotated[str, Field(max_length=MAX_CONTENT_CHARS, json_schema_extra=NO_NUL)]
    mode: Mode = "auto"
    limit: SearchLimit = 3


class PromptOut(BaseModel):
    prompt: str


class FactIn(Strict):
    value: Annotated[str, Field(min_length=1, max_length=MAX_FACT_VALUE_CHARS, json_schema_extra=TEXT)]
    source: SourceName = "stated"


@fields_of(Fact, omit={"outranked"}, extra={"note": (str | None, Field(default=None, description=(
    "set when the value given was kept in history only: the current value comes from a stronger source"))),
    "outranked_at": (datetime | None, Field(default=None, description=(
        "with note: when the value given was kept in history")))})
class FactOut(Out):
    @classmethod
    def of(cls, record: object) -> Self:
        answer = super().of(record)
        outranked = getattr(record, "outranked", None)
        return answer if outranked is None else answer.model_copy(update={"outranked_at": outranked.set_at})


@fields_of(FactChange)
class FactChangeOut(Out):
    pass


class MessageIn(Strict):
    thread: Topic
    role: Role
    content: Text
    ttl: Seconds | None = Field(None, description="seconds to keep it; default: the server's message retention")


class LoggedTurn(Strict):
    role: Role
    content: Text


class MessagesIn(Strict):
    thread: Topic
    messages: list[LoggedTurn] = Field(min_length=1, max_length=MAX_BATCH, description="the turns, oldest first")
    ttl: Seconds | None = Field(None, description="seconds to keep them; default: the server's message retention")


class MessageIdsIn(Strict):
    ids: list[Annotated[str, Field(min_length=1, max_length=200, json_schema_extra=NOT_BLANK)]] = Field(
        min_length=1, max_length=MAX_BATCH, description="the messages to erase, all or none")


@fields_of(Message)
class MessageOut(Out):
    pass


def _utc(at: datetime | None) -> datetime | None:
    """An instant with its time zone, in UTC; one that cannot be (year 1 at +05:00) is invalid input."""
    try:
        return None if at is None else at.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range once put in UTC") from None


class TurnIn(Strict):
    role: Annotated[Role, Field(description="only the user's own turns say anything about the user")]
    content: Text
    id: Annotated[str | None, Field(max_length=200, description="a message id; proposals cite it as evidence")] = None
    at: Annotated[AwareDatetime | None, AfterValidator(_utc),
                  Field(description="when it was said: an ISO 8601 instant with a time zone")] = None


class LearnIn(Strict):
    messages: list[TurnIn] | None = Field(None, min_length=1, max_length=MAX_LEARN_TURNS, description=(
        "the turns to learn from; or give thread instead"))
    thread: Topic | None = Field(None, description="learn from this logged thread's messages not learned yet")
    dry_run: bool = Field(False, strict=True, description="decide and answer the plan, write nothing")
    extractor: Annotated[str | None, Field(min_length=1, max_length=200, examples=["rules"], description=(
        "rules (offline), ollama:MODEL or openai:MODEL; default: the server's MEMSHELF_EXTRACTOR, else rules"))] = None


@fields_of(Proposal)
class ProposalOut(Out):
    pass


@fields_of(Usage)
class UsageOut(Out):
    pass


@fields_of(Plan, nested={"proposals": list[ProposalOut], "usage": UsageOut | None})
class PlanOut(Out):
    pass


SCRUB_PENDING_HEADER = "X-Memshelf-Scrub-Pending"
"""Sent with a 204 erasure when the erased text may still be in the database's files for a while (README)."""


def erased_response(erased: Erased) -> Response:
    headers = {SCRUB_PENDING_HEADER: "true"} if erased.scrub_pending else None
    return Response(status_code=204, headers=headers)


@fields_of(Erased)
class ErasedOut(Out):
    pass


class ScrubIn(Strict):
    full: Annotated[bool | None, Field(strict=True, description=(
        "PostgreSQL: VACUUM FULL (true) or the default scrub (false); null: as MEMSHELF_PG_SCRUB says"))] = None


class ScrubOut(BaseModel):
    scrub_pending: bool


@fields_of(UserSummary)
class UserOut(Out):
    pass


class ImportOut(BaseModel):
    memories: int
    facts: int
    messages: int
    evidence: int | None = Field(None, description="evidence rows added, when the records carried some")
    learn_marks: int | None = Field(None, description="thread watermarks added, when the records carried some")


class KeyIn(Strict):
    tenant: Annotated[str | None, Field(max_length=200, json_schema_extra=IDENTIFIER, description=(
        "the tenant the key is bound to; null makes an admin key"))]
    name: Annotated[str, Field(max_length=MAX_TOPIC_CHARS, json_schema_extra={
        "pattern": rf"^([^\x00]*[^{_SPACE}\x00][^\x00]*)?$"}, description="empty, or text that is not only "
                                                                        "spaces")] = ""


@fields_of(ApiKey)
class KeyOut(Out):
    pass


class NewKeyOut(BaseModel):
    key: KeyOut
    secret: str = Field(description="shown this once; only its hash is stored")
