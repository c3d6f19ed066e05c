"""The export record format: one JSON object per line, written by Shelf.export, read back by Shelf.import_, and
hashed by `memshelf migrate` to verify a copy (migrate.owner_lines).

A stream starts with a header {"kind": "memshelf-export", "format": EXPORT_FORMAT}, then one record per row of the
owner's tables, kind by kind in the registry's order (stores/tables.py): memory (its vector as base64
little-endian float32; superseded_at and superseded_by only when it was superseded, confirmed_at and
confirmed_from only when the user confirmed it), fact, fact_change, message,
evidence (a message a learned memory or fact came from), learn_mark (where learning stopped in a thread). Times
are ISO 8601 with microseconds and the offset (`iso`). Reading a record
back checks it as remember() checks its input, never trusting it (read_record).
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime, timedelta
from typing import Any, TypeVar
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from .errors import InvalidInput
from ._ids import is_id, new_id
from .model import (EARLIEST, MAX_FACT_KEY_CHARS, MAX_FACT_VALUE_CHARS, MAX_TOPIC_CHARS, Fact, FactChange, Memory,
                    Message, Owner, Sources, check_identifier, check_text, check_topic, check_when, resolve_expiry)
from .stores.base import Evidence, Mark, Store

EXPORT_FORMAT = 1
HEADER_KIND = "memshelf-export"
EVERYTHING = 2**62
MAX_CLOCK_SKEW = timedelta(minutes=5)
"""How far in the future an imported record's time may be (clocks of two machines disagree a little)."""
MAX_OBSERVATIONS = 2**31 - 1


def json_lines(text: str, source: str) -> list[tuple[int, Any]]:
    """The values of JSON Lines `text` with their line numbers (blank lines skipped, but counted), or an
    InvalidInput naming the line of `source` ("the import", a file's name) that is not JSON."""
    values = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except ValueError as exc:
            raise InvalidInput(f"line {number} of {source} is not JSON ({exc}): use the export unchanged, one JSON "
                               "object per line") from exc
        except RecursionError:
            raise InvalidInput(f"line {number} of {source} is nested too deeply to be a memshelf record: use the "
                               "export unchanged") from None
    return values


def iso(when: datetime | None) -> str | None:
    """A time as records write it: ISO 8601 with microseconds and the offset."""
    return None if when is None else when.isoformat(timespec="microseconds")


# ---------------------------------------------------------------- writing
def header() -> dict[str, Any]:
    return {"kind": HEADER_KIND, "format": EXPORT_FORMAT}


def memory_record(memory: Memory, blob: bytes | None) -> dict[str, Any]:
    """A memory's record; the supersession and confirmation fields only when set, so a memory's line (and migrate's
    checksum of it) is what it was before memories could be superseded or confirmed."""
    closed = {} if memory.superseded_at is None else {"superseded_at": iso(memory.superseded_at),
                                                      "superseded_by": memory.superseded_by}
    confirmed = {} if memory.confirmed_at is None else {"confirmed_at": iso(memory.confirmed_at),
                                                        "confirmed_from": memory.confirmed_from}
    return {**_memory_fields(memory, blob), **closed, **confirmed}


def _memory_fields(memory: Memory, blob: bytes | None) -> dict[str, Any]:
    return {"kind": "memory", "id": memory.id, "topic": memory.topic, "content": memory.content,
            "source": memory.source, "confidence": memory.confidence, "created_at": iso(memory.created_at),
            "last_seen": iso(memory.last_seen), "observations": memory.observations,
            "expires_at": iso(memory.expires_at),
            "embed_model": memory.embed_model if blob is not None else None,
            "embedding": base64.b64encode(blob).decode() if blob is not None else None}


def fact_record(fact: Fact) -> dict[str, Any]:
    return {"kind": "fact", "key": fact.key, "value": fact.value, "source": fact.source,
            "updated_at": iso(fact.updated_at)}


def fact_change_record(change: FactChange) -> dict[str, Any]:
    return {"kind": "fact_change", "key": change.key, "value": change.value, "source": change.source,
            "set_at": iso(change.set_at)}


def message_record(message: Message) -> dict[str, Any]:
    return {"kind": "message", "id": message.id, "thread": message.thread, "role": message.role,
            "content": message.content, "created_at": iso(message.created_at), "expires_at": iso(message.expires_at)}


def evidence_record(evidence: Evidence) -> dict[str, Any]:
    record = {"kind": "evidence", "of": evidence.kind, "record": evidence.record, "message_id": evidence.message_id,
              "thread": evidence.thread, "said_at": iso(evidence.said_at)}
    if evidence.set_at is not None:  # the fact value it taught (older exports have none)
        record["set_at"] = iso(evidence.set_at)
    return record


def learn_mark_record(thread: str, mark: Mark) -> dict[str, Any]:
    return {"kind": "learn_mark", "thread": thread, "message_id": mark.message_id, "said_at": iso(mark.said_at)}


def _memories(store: Store, owner: Owner, now: datetime | None) -> Iterator[dict[str, Any]]:
    return (memory_record(memory, blob) for memory, blob in store.iter_memories(owner, now))


def _facts(store: Store, owner: Owner, now: datetime | None) -> Iterator[dict[str, Any]]:
    return (fact_record(fact) for fact in reversed(store.facts(owner)))  # oldest first: imported in that order


def _fact_changes(store: Store, owner: Owner, now: datetime | None) -> Iterator[dict[str, Any]]:
    return (fact_change_record(change) for change in store.fact_history(owner, None))


def _messages(store: Store, owner: Owner, now: datetime | None) -> Iterator[dict[str, Any]]:
    return (message_record(message) for message in store.messages(owner, None, EVERYTHING, now))


def _evidence(store: Store, owner: Owner, now: datetime | None) -> Iterator[dict[str, Any]]:
    return (evidence_record(row) for row in store.evidence(owner, None, None))


def _learn_marks(store: Store, owner: Owner, now: datetime | None) -> Iterator[dict[str, Any]]:
    return (learn_mark_record(thread, mark) for thread, mark in sorted(store.learn_marks(owner).items()))


WRITERS: dict[str, Callable[[Store, Owner, datetime | None], Iterator[dict[str, Any]]]] = {
    "memory": _memories, "fact": _facts, "fact_change": _fact_changes, "message": _messages,
    "evidence": _evidence, "learn_mark": _learn_marks}
"""The records of each kind of the registry (tables.py), read from a store; each kind's table is in the registry."""


def owner_records(store: Store, owner: Owner, kind: str, now: datetime | None) -> Iterator[dict[str, Any]]:
    """The owner's records of one kind: the live ones at `now`, or every one, expired too, when now is None."""
    return WRITERS[kind](store, owner, now)


def canonical_line(record: Mapping[str, Any]) -> str:
    """A record as one JSON line that does not depend on how it was written: what migrate hashes and compares.
    A memory's fields sorted by name, any other record's values in their order (the form migrate has always used,
    so checksums stay comparable across versions)."""
    fields = {name: value for name, value in record.items() if name != "kind"}
    if record.get("kind") == "memory":
        return json.dumps(fields, sort_keys=True)
    return json.dumps(list(fields.values()))


# ---------------------------------------------------------------- reading
class ImportBatch:
    """The records of one import, checked, waiting to be written together."""

    def __init__(self) -> None:
        self.memories: list[Memory] = []
        self.blobs: list[bytes | None] = []
        self.facts: list[Fact] = []
        self.changes: list[FactChange] = []
        self.messages: list[Message] = []
        self.evidence: list[Evidence] = []
        self.marks: dict[str, Mark] = {}


def read_record(record: object, batch: ImportBatch, now: datetime, sources: Sources) -> None:
    """Check one record and add it to the batch. Sources must be declared on the reading shelf; a memory's
    confidence comes from its source as declared there (the record's own is ignored)."""
    if not isinstance(record, Mapping):
        raise InvalidInput(f"it is a {type(record).__name__}, not a JSON object")
    kind = record.get("kind")
    if kind is None:
        raise InvalidInput("field 'kind' is missing: every line of an export names its kind (memory, fact, ...)")
    if kind == HEADER_KIND:
        if record.get("format") != EXPORT_FORMAT:
            raise InvalidInput(f"the export format is not {EXPORT_FORMAT}: upgrade memshelf to read it")
    elif kind == "memory":
        memory, blob = _memory_from_record(record, now, sources)
        batch.memories.append(memory)
        batch.blobs.append(blob)
    elif kind == "fact":
        key, value, source = _fact_fields(record, sources)
        batch.facts.append(Fact(key, value, source, _field(record, "updated_at", _past(now))))
    elif kind == "fact_change":
        key, value, source = _fact_fields(record, sources)
        batch.changes.append(FactChange(key, value, source, _field(record, "set_at", _past(now))))
    elif kind == "message":
        batch.messages.append(Message(
            _field(record, "id", _record_id("msg")),
            _field(record, "thread", lambda v: check_text("thread", v, MAX_TOPIC_CHARS)),
            _field(record, "role", lambda v: check_text("role", v, 64)),
            _field(record, "content", lambda v: check_text("content", v)),
            _field(record, "created_at", _past(now)),
            _optional(record, "expires_at", _future(now))))
    elif kind == "evidence":
        batch.evidence.append(_evidence_from_record(record, now))
    elif kind == "learn_mark":
        thread = _field(record, "thread", lambda v: check_text("thread", v, MAX_TOPIC_CHARS))
        batch.marks[thread] = Mark(_field(record, "message_id", _record_id("msg")),
                                   _field(record, "said_at", _past(now)))
    else:
        shown = repr(kind[:40]) if isinstance(kind, str) else f"of type {type(kind).__name__}"
        raise InvalidInput(f"unknown record kind {shown}: use memory, fact, fact_change, message, evidence or "
                           "learn_mark")


def _evidence_from_record(record: Mapping[str, Any], now: datetime) -> Evidence:
    of = _field(record, "of", _one_of("memory", "fact"))
    check = _record_id("m") if of == "memory" else (lambda v: check_text("fact key", v, MAX_FACT_KEY_CHARS))
    # a logged message's id, or the id the caller gave a turn passed to learn() directly
    message_id = _field(record, "message_id", lambda v: check_identifier("message id", v))
    return Evidence(of, _field(record, "record", check), message_id,
                    _optional(record, "thread", lambda v: check_text("thread", v, MAX_TOPIC_CHARS)),
                    _optional(record, "said_at", _past(now)), _optional(record, "set_at", _past(now)))


def _one_of(*allowed: str) -> Callable[[object], str]:
    def check(value: object) -> str:
        if value not in allowed:
            raise InvalidInput(f"must be one of {', '.join(allowed)}")
        return value  # type: ignore[return-value]
    return check


def _known_source(sources: Sources) -> Callable[[object], str]:
    def check(source: object) -> str:
        sources.confidence(source)
        return source  # type: ignore[return-value]
    return check


def _fact_fields(record: Mapping[str, Any], sources: Sources) -> tuple[str, str, str]:
    return (_field(record, "key", lambda v: check_text("fact key", v, MAX_FACT_KEY_CHARS)),
            _field(record, "value", lambda v: check_text("fact value", v, MAX_FACT_VALUE_CHARS)),
            _field(record, "source", _known_source(sources)))


def _memory_from_record(record: Mapping[str, Any], now: datetime, sources: Sources) -> tuple[Memory, bytes | None]:
    source = _field(record, "source", _known_source(sources))
    created = _field(record, "created_at", _past(now))
    last_seen = _optional(record, "last_seen", _past(now)) or created
    if last_seen < created:
        raise InvalidInput("field 'last_seen' is before created_at: a memory is seen again only after it is made")
    blob = _optional(record, "embedding", _vector_blob)
    model = _optional(record, "embed_model", lambda v: check_text("embed_model", v, MAX_TOPIC_CHARS))
    if blob is not None and model is None:
        raise InvalidInput("field 'embedding' has no embed_model: a vector needs the name of the model that made "
                           "it (or drop the embedding and the memory is embedded again)")
    memory = Memory(id=_field(record, "id", _record_id("m")), topic=_field(record, "topic", check_topic),
                    content=_field(record, "content", lambda v: check_text("content", v)), source=source,
                    confidence=sources.confidence(source), created_at=created,
                    expires_at=_optional(record, "expires_at", _future(now)), last_seen=last_seen,
                    observations=_optional(record, "observations", _observations) or 1,
                    embed_model=model if blob is not None else None,
                    superseded_at=_optional(record, "superseded_at", _past(now)),
                    superseded_by=_optional(record, "superseded_by", _record_id("m")),
                    confirmed_at=_optional(record, "confirmed_at", _past(now)),
                    confirmed_from=_optional(record, "confirmed_from",
                                             lambda v: check_text("confirmed_from", v, MAX_TOPIC_CHARS)))
    for first, second in (("superseded_at", "superseded_by"), ("confirmed_at", "confirmed_from")):
        if (getattr(memory, first) is None) != (getattr(memory, second) is None):
            raise InvalidInput(f"fields {first!r} and {second!r} go together: give both or neither")
    return memory, blob


_T = TypeVar("_T")


def _field(record: Mapping[str, Any], name: str, check: Callable[[Any], _T]) -> _T:
    """A required field of an import record, checked; errors name the field."""
    value = _optional(record, name, check)
    if value is None:
        raise InvalidInput(f"field {name!r} is missing")
    return value


def _optional(record: Mapping[str, Any], name: str, check: Callable[[Any], _T]) -> _T | None:
    value = record.get(name)
    if value is None:
        return None
    try:
        return check(value)
    except InvalidInput as exc:
        raise exc.within(f"field {name!r}: ") from exc


def _record_id(kind: str) -> Callable[[object], str]:
    def check(value: object) -> str:
        if not is_id(kind, value):
            raise InvalidInput(f"not an id memshelf makes (like {new_id(kind)})")
        return value  # type: ignore[return-value]
    return check


def _time(value: object) -> datetime:
    if not isinstance(value, str):
        raise InvalidInput(f"must be an ISO 8601 time string, got {type(value).__name__}")
    try:
        when = datetime.fromisoformat(value)
    except (ValueError, OverflowError) as exc:
        raise InvalidInput(f"{value[:40]!r} is not an ISO 8601 time with an offset, e.g. "
                           "2026-01-01T12:00:00+00:00") from exc
    return check_when("the time", when)  # its own message: a naive time, or one out of range


def _past(now: datetime) -> Callable[[object], datetime]:
    """A record's creation or change time: from 1970 up to now (plus a small clock skew)."""
    def check(value: object) -> datetime:
        when = _time(value)
        if not EARLIEST <= when <= now + MAX_CLOCK_SKEW:
            raise InvalidInput(f"{when.isoformat()} is not between 1970 and now ({now.isoformat()}): "
                               "a record cannot be made before 1970 or in the future")
        return when
    return check


def _future(now: datetime) -> Callable[[object], datetime | None]:
    """A record's expiry: the same rules as remember's expires_at (so never one that has already passed)."""
    return lambda value: resolve_expiry(_time(value), None, now)


def _observations(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OBSERVATIONS:
        raise InvalidInput(f"must be a whole number from 1 to {MAX_OBSERVATIONS:,}")
    return value


def _vector_blob(value: object) -> bytes:
    """A base64 float32 vector of finite numbers."""
    if not isinstance(value, str):
        raise InvalidInput(f"must be base64 text, got {type(value).__name__}")
    try:
        blob = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput("is not valid base64") from exc
    if not blob or len(blob) % 4:
        raise InvalidInput("must hold float32 numbers (a multiple of 4 bytes)")
    if not np.all(np.isfinite(np.frombuffer(blob, dtype="<f4"))):
        raise InvalidInput("contains NaN or infinity: re-export it, or drop embedding and embed_model so the "
                           "memory is embedded again")
    return blob
