"""Shelf: the one facade that the CLI, the HTTP server and the MCP server all call."""

from __future__ import annotations

import base64
import binascii
import hashlib
import inspect
import json
import logging
import os
import secrets
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from . import context as ctx
from . import exports
from .embedders.base import (Embedder, default_embedder_spec, embedded, embedding_deadline, known_dimensions, pieces_of,
                              resolve_embedder, search_timeout, write_timeout)
from .errors import Conflict, ConfigError, DimensionMismatch, EmbedderUnavailable, InvalidInput, NotFound
from ._ids import is_id, new_id
from .keywords import search_terms
from .learning import _decide as learning_decide
from .learning.base import Plan, Turn
from .model import (LATEST, MAX_FACT_KEY_CHARS, MAX_FACT_VALUE_CHARS, MAX_TOPIC_CHARS, MODES, Fact, FactChange, Hit,
                    Memory, Message, NewMemory, Owner, SearchResult, Sources, UserSummary, addressable,
                    check_encodable, check_filter, check_identifier, check_name, check_role, check_tenant, check_text,
                    check_topic, check_ttl, check_when, counted, missing_changes, resolve_expiry, sources_from_text,
                    utcnow)
from ._retrieval import Candidate, both_sides, fuse, order
from .stores.base import ApiKey, Erased, Evidence, Listing, Position, Store, View, open_store
from .stores.tables import exported_kinds
from ._vectors import pack

log = logging.getLogger("memshelf")

_DEFAULT = object()
MAX_LIMIT = 1_000
MAX_QUERY_TERMS = 12
DEFAULT_FLOOR = 0.20
"""Cosine below which a semantic candidate is noise (all-MiniLM-L6-v2; see README for how it was chosen)."""
CANDIDATES = 50
"""How many candidates each retriever contributes to a hybrid search."""
DEFAULT_MESSAGE_TTL = timedelta(days=30)
DEFAULT_DB = "memshelf.db"
IMPORT_BATCH = 64
MAX_BACKFILL_BATCH = 10_000
MEMORY_ID_ADVICE = "check the id: list_memories() and search() return them"
FACT_KEY_ADVICE = "list the keys with facts()"
ORDERS = ("newest", "confident")
"""How list_memories orders: newest first, or most confident first (then newest)."""


def _check_owner(owner: object) -> Owner:
    if not isinstance(owner, Owner):
        raise InvalidInput(f"owner must be memshelf.Owner(tenant, user), got {type(owner).__name__}")
    return owner


def _check_floor(floor: object) -> float:
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not -1.0 <= floor <= 1.0:
        raise InvalidInput(f"floor must be a cosine from -1 to 1 (e.g. 0.2), got {floor!r}")
    return float(floor)


def _check_limit(limit: object, name: str = "limit") -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"{name} must be a whole number from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def _check_records(kind: str, records: object) -> Iterable[Any]:
    """A batch of records must be a list (or any iterable) of mappings; a lone mapping or a string is a mistake."""
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Iterable):
        raise InvalidInput(f"{kind} must be a list of mappings, got {type(records).__name__}: "
                           f"pass e.g. [{{...}}, {{...}}]")
    return records


def _turn_of(number: int, turn: object) -> tuple[str, str]:
    """A turn of log_messages as (role, content), checked as log_message checks its arguments."""
    if not isinstance(turn, Mapping) or set(turn) != {"role", "content"}:
        got = sorted(turn) if isinstance(turn, Mapping) else type(turn).__name__
        raise InvalidInput(f"turn {number} must be a mapping with role and content, got {got}: pass e.g. "
                           "{'role': 'user', 'content': 'I moved to Lisbon.'}; nothing was logged")
    try:
        return check_role(turn["role"]), check_text("content", turn["content"])
    except InvalidInput as exc:
        raise exc.within(f"turn {number}: ", "; nothing was logged") from exc


def _check_message_id(message_id: object) -> str:
    if not isinstance(message_id, str) or not is_id("msg", message_id):
        raise InvalidInput(f"message id must look like 'msg_3f9c0a1b2d4e5f60', got {message_id!r}",
                           "list_messages() returns them", fix="message_id")
    return message_id


def _open_target(target: object) -> str:
    """Where Shelf.open should look: an explicit target, else MEMSHELF_DATABASE_URL, MEMSHELF_DB, ./memshelf.db."""
    if target is None:
        target = os.environ.get("MEMSHELF_DATABASE_URL") or os.environ.get("MEMSHELF_DB") or DEFAULT_DB
    if not isinstance(target, (str, os.PathLike)) or not isinstance(path := os.fspath(target), str):
        raise ConfigError(f"target must be a file path or a URL such as postgresql://..., got "
                          f"{type(target).__name__}: pass e.g. 'memshelf.db'")
    if not path.strip():
        raise ConfigError("target is empty: pass a file path such as 'memshelf.db' or a postgresql:// URL")
    try:
        return check_encodable("target", path)
    except InvalidInput as exc:
        raise ConfigError(f"{exc}; a path that is not valid UTF-8 cannot be opened: rename the file") from None


def _open_floor(floor: object) -> float:
    where = ""
    if floor is None:
        where = " (from MEMSHELF_FLOOR)"
        try:
            floor = float(os.environ.get("MEMSHELF_FLOOR", DEFAULT_FLOOR))
        except ValueError as exc:
            raise ConfigError(f"MEMSHELF_FLOOR must be a number such as 0.3: {exc}") from exc
    try:
        return _check_floor(floor)
    except InvalidInput as exc:
        raise ConfigError(f"{exc}{where}") from None


def _open_sources(sources: Mapping[str, float] | None) -> Mapping[str, float] | None:
    if sources is None and os.environ.get("MEMSHELF_SOURCES", "").strip():
        return sources_from_text(os.environ["MEMSHELF_SOURCES"], "MEMSHELF_SOURCES")
    return sources


def _open_message_ttl(message_ttl: object) -> timedelta | None:
    if message_ttl is _DEFAULT:
        return DEFAULT_MESSAGE_TTL
    try:
        return None if message_ttl is None else check_ttl("message_ttl", message_ttl)
    except InvalidInput as exc:
        raise ConfigError(str(exc)) from None


def _view(as_of: object, include_superseded: object) -> View:
    """Which memories a read sees: current ones by default; as_of (an aware datetime) reads the past."""
    return View(None if as_of is None else check_when("as_of", as_of), bool(include_superseded))


def _facts_as_of(history: Sequence[FactChange], outranks: Callable[[str, str], bool], as_of: datetime) -> list[Fact]:
    """The facts current at `as_of`, replayed from their history (oldest first) with set_fact's rule: a value
    replaces the current one unless its source is weaker. Most recently set first, as facts() lists them."""
    current: dict[str, Fact] = {}
    for change in sorted(history, key=lambda c: c.set_at):  # by time: an import adds older changes after newer ones
        held = current.get(change.key)
        if change.set_at <= as_of and (held is None or outranks(change.source, held.source)):
            current[change.key] = Fact(change.key, change.value, change.source, change.set_at)
    return sorted(current.values(), key=lambda f: (-f.updated_at.timestamp(), f.key))


def _check_backfill(batch_size: object, progress: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BACKFILL_BATCH:
        raise InvalidInput(f"batch_size must be a whole number from 1 to {MAX_BACKFILL_BATCH:,}, got {batch_size!r}")
    if progress is not None and not callable(progress):
        raise InvalidInput(f"progress must be a function (done, total) or None, got {type(progress).__name__}")


CURSOR_PREFIX = "c1."
MAX_CURSOR_CHARS = 200
MAX_USERS_CURSOR_CHARS = 1_200
"""A cursor of users holds a user id: up to 200 characters of up to 4 bytes each, in base64."""


def _scope_check(*names: str) -> str:
    """A short tag of whose records a cursor pages through (an owner's, a tenant's users), so that a cursor given
    for one is refused for another."""
    return hashlib.sha256("\x00".join(names).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _owner_check(owner: Owner) -> str:
    return _scope_check(owner.tenant, owner.user)


def _cursor_of(fields: Sequence[str | None]) -> str:
    payload = json.dumps(list(fields), separators=(",", ":"), ensure_ascii=False)
    return CURSOR_PREFIX + base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def _cursor_fields(cursor: object, refused: InvalidInput, longest: int = MAX_CURSOR_CHARS) -> list[str]:
    """The fields of a cursor _cursor_of made; `refused` is raised for anything else."""
    if not isinstance(cursor, str) or not cursor.startswith(CURSOR_PREFIX) or len(cursor) > longest:
        raise refused
    body = cursor[len(CURSOR_PREFIX):]
    try:
        fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise refused from exc
    if not isinstance(fields, list) or not all(isinstance(field, str) for field in fields):
        raise refused
    return fields


def _refused(cursor: object, whose: str, start: str) -> InvalidInput:
    shown = repr(cursor[:40]) if isinstance(cursor, str) else f"of type {type(cursor).__name__}"
    return InvalidInput(f"cursor {shown} is not one this shelf gave out for {whose}: pass next_cursor unchanged, "
                        f"or leave cursor out to start from {start}")


def _next_cursor(owner: Owner, page: Sequence[Memory | Message], limit: int,
                 by_confidence: bool = False) -> str | None:
    """The opaque cursor of the page after this one (None when this page is the last): the last record's instant
    and id (and confidence, when ordered by it), owner-scoped and order-scoped, so it reveals nothing about other
    owners' records or how many there are, and a cursor of one order is refused for the other."""
    if len(page) < limit:
        return None
    last = page[-1]
    if by_confidence:
        assert isinstance(last, Memory)
        return _cursor_of([_scope_check(owner.tenant, owner.user, "confident"), exports.iso(last.created_at),
                           last.id, repr(last.confidence)])
    return _cursor_of([_owner_check(owner), exports.iso(last.created_at), last.id])


def _read_cursor(owner: Owner, kind: str, cursor: object, by_confidence: bool = False) -> Position | None:
    """Where the previous page ended, from the next_cursor a list_* call gave this owner (None: start at the first)."""
    if cursor is None:
        return None
    refused = (_refused(cursor, f"{owner} in order=confident", "the most confident") if by_confidence
               else _refused(cursor, str(owner), "the newest"))
    fields = _cursor_fields(cursor, refused)
    tag = _scope_check(owner.tenant, owner.user, "confident") if by_confidence else _owner_check(owner)
    if len(fields) != (4 if by_confidence else 3) or fields[0] != tag:
        raise refused
    try:
        created = datetime.fromisoformat(fields[1])
        confidence = float(fields[3]) if by_confidence else None
    except ValueError as exc:
        raise refused from exc
    if not is_id(kind, fields[2]) or created.tzinfo is None:
        raise refused
    return Position(created, fields[2], confidence)


def _next_users_cursor(tenant: str, page: Sequence[UserSummary], limit: int) -> str | None:
    """The cursor of the tenant's next page of users (None after the last): the last user id, tenant-scoped."""
    return None if len(page) < limit else _cursor_of([_scope_check(tenant), page[-1].user])


def _read_users_cursor(tenant: str, cursor: object) -> str | None:
    """The user id the previous page of the tenant's users ended with (None: start at the first)."""
    if cursor is None:
        return None
    refused = _refused(cursor, f"the users of tenant {tenant!r}", "the first user")
    fields = _cursor_fields(cursor, refused, MAX_USERS_CURSOR_CHARS)
    if len(fields) != 2 or fields[0] != _scope_check(tenant):
        raise refused
    try:
        return check_identifier("user", fields[1])  # one the store can take (a listed user may predate addressable)
    except InvalidInput as exc:
        raise refused from exc


class Shelf:
    """Durable, owned, searchable memory. Open one with `Shelf.open(path_or_url)`."""

    def __init__(self, store: Store, *, embedder: Embedder | None = None, sources: Sources | None = None,
                 floor: float = DEFAULT_FLOOR, budget: int = ctx.DEFAULT_BUDGET_CHARS,
                 message_ttl: timedelta | None = DEFAULT_MESSAGE_TTL,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.embedder = embedder
        self.sources = sources or Sources()
        self.floor = floor
        self.budget = budget
        self.message_ttl = message_ttl
        self._clock = clock

    @classmethod
    def open(cls, target: str | os.PathLike[str] | None = None, *, embedder: Any = _DEFAULT,
             sources: Mapping[str, float] | None = None, floor: float | None = None,
             budget: int | None = None, message_ttl: timedelta | float | None | object = _DEFAULT,
             clock: Callable[[], datetime] = utcnow) -> Shelf:
        """Open (creating if needed) a shelf.

        target: a SQLite file path, ":memory:", or a URL such as postgresql://...; default MEMSHELF_DATABASE_URL,
        then MEMSHELF_DB, then ./memshelf.db.
        embedder: "local", "ollama:<model>", "openai:<model>", an Embedder, or None for keyword search only;
        default MEMSHELF_EMBEDDER, else the offline local model when installed.
        sources: extra provenance names and what each is worth, e.g. {"sensor": 0.8}; default MEMSHELF_SOURCES
        (e.g. "sensor=0.8,crm=0.5"), else only the built-in stated, mined and inferred.
        """
        path = _open_target(target)  # every setting is checked before anything is opened or created
        floor = _open_floor(floor)
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 100):
            raise ConfigError(f"budget must be a whole number of characters, at least 100, got {budget!r}")
        ttl = _open_message_ttl(message_ttl)
        declared = Sources(_open_sources(sources))
        resolved = resolve_embedder(default_embedder_spec() if embedder is _DEFAULT else embedder)
        store = open_store(path)
        return cls(store, embedder=resolved, sources=declared, floor=floor,
                   budget=budget or ctx.DEFAULT_BUDGET_CHARS, message_ttl=ttl, clock=clock)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Shelf:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now(self) -> datetime:
        return self._clock()

    # ---------------------------------------------------------------- knowledge
    def remember(self, owner: Owner, topic: str, content: str, source: str = "stated", *,
                 expires_at: datetime | None = None, ttl: float | timedelta | None = None) -> Memory:
        """Store a statement. A repeat of the same (topic, content) counts as another observation."""
        return self.remember_many(owner, [{"topic": topic, "content": content, "source": source,
                                           "expires_at": expires_at, "ttl": ttl}])[0]

    def remember_many(self, owner: Owner, items: Iterable[Mapping[str, Any]]) -> list[Memory]:
        """Store several statements in one transaction, embedding them in one batch.

        Each item has topic and content, and optionally source, expires_at, ttl, and a pre-computed `vector`
        from the configured embedder's model. Nothing is written unless every item is valid.
        """
        owner = _check_owner(owner)
        now = self.now()
        batch = [self._new_memory(item, now) for item in _check_records("memories", items)]
        if not batch:
            return []
        self._embed_new(owner, batch)
        with self.store.atomic():
            stored = self.store.add_memories(owner, batch, now)
            self._now_the_callers(owner, stored)
        return stored

    def _now_the_callers(self, owner: Owner, stored: Sequence[Memory]) -> None:
        """A learned memory the caller writes again is the caller's from then on: its evidence goes, so that no
        forget_thread cascade takes what the caller said (as one the caller wrote first stays the caller's when
        learning sees it again)."""
        again = list(dict.fromkeys(m.id for m in stored if m.observations > 1))
        if again:  # one statement per 500 repeats, whether or not they were learned
            self.store.drop_evidence(owner, "memory", again)

    def _new_memory(self, item: Mapping[str, Any], now: datetime) -> NewMemory:
        if not isinstance(item, Mapping):
            raise InvalidInput(f"each memory must be a mapping with topic and content, got {type(item).__name__}")
        unknown = set(item) - {"topic", "content", "source", "expires_at", "ttl", "vector"}
        if unknown:
            raise InvalidInput(f"unknown memory fields {sorted(unknown)}: use topic, content, source, expires_at, ttl")
        topic = check_topic(item.get("topic"))
        content = check_text("content", item.get("content"))
        source = "stated" if item.get("source") is None else item["source"]
        confidence = self.sources.confidence(source)
        expires = resolve_expiry(item.get("expires_at"), item.get("ttl"), now)
        new = NewMemory(topic, content, source, confidence, expires, created_at=now)
        if item.get("vector") is not None:
            new.vector, new.embed_model = self._check_vector(item["vector"])
        return new

    def _check_vector(self, vector: object) -> tuple[bytes, str]:
        """A precomputed vector as a stored blob, stamped with the configured model. Its length is checked with the
        whole batch, in `_embed_new`, without asking the embedding service."""
        if self.embedder is None:
            raise InvalidInput("a vector was given but no embedder is configured: open the shelf with the "
                               "embedder whose model made the vector")
        try:
            array = np.asarray(vector, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidInput("vector must be a list of numbers") from exc
        if array.ndim != 1 or array.size == 0:
            raise InvalidInput(f"vector must be a flat, non-empty list of numbers, got shape {array.shape}")
        if not np.isfinite(array.sum(dtype=np.float64)):  # float32s cannot overflow a float64 sum: exact
            raise InvalidInput("vector contains NaN or infinity: pass finite numbers")
        return pack(array), self.embedder.model

    def _embed_new(self, owner: Owner, batch: Sequence[NewMemory]) -> None:
        """Embed what has no vector yet, and check the length of the vectors that came with the batch.

        Writes never wait for the embedding service: it gets MEMSHELF_EMBED_WRITE_TIMEOUT seconds in all, and when
        it is down, hung or slow the memories are stored anyway, keyword searchable, and the next backfill gives
        them vectors: nothing is lost."""
        if self.embedder is None:
            return
        todo = [m for m in batch if m.vector is None]
        vectors = self._embed_for_write(todo) if todo else None
        self._check_dimensions(owner, [m for m in batch if m.vector is not None],
                               None if vectors is None else int(vectors[0].shape[1]))
        for memory, pieces in zip(todo, () if vectors is None else vectors):
            (memory.vector, memory.pieces), memory.embed_model = _packed(pieces), self.embedder.model

    def _embed_for_write(self, todo: Sequence[NewMemory]) -> list[np.ndarray] | None:
        """The vectors of these memories (_embed_in_pieces), or None when the service did not make them within the
        write deadline."""
        assert self.embedder is not None
        try:
            with embedding_deadline(write_timeout()):
                return self._embed_in_pieces([m.content for m in todo])
        except EmbedderUnavailable as exc:
            log.warning("embedder unavailable, storing %s without vectors (run backfill later): %s",
                        counted(len(todo), "memories"), exc)
            return None

    def _embed_in_pieces(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's vectors, one row per piece (README, "Long memories"), embedded in one batch: the first row is
        the memory's own vector, the others its later pieces'. A text that fits the model's window has one row."""
        assert self.embedder is not None
        split = pieces_of(self.embedder, texts)
        flat = embedded(self.embedder, [piece for pieces in split for piece in pieces])
        return np.split(flat, np.cumsum([len(pieces) for pieces in split])[:-1])

    def _check_dimensions(self, owner: Owner, given: Sequence[NewMemory], fresh: int | None) -> None:
        """Refuse precomputed vectors whose length is not the model's. The length is known without asking the
        service: from vectors it just made, from the embedder, or from this owner's stored vectors of the model.
        When nothing is known, the first vector of the batch sets it (and once stored, the store knows it)."""
        if not given:
            return
        assert self.embedder is not None
        model = self.embedder.model
        expected, basis = fresh, "as the embedder reports"
        if expected is None:
            expected = known_dimensions(self.embedder)
        if expected is None:
            expected, basis = self.store.vector_dimensions(owner, model), f"as the vectors {owner} has stored show"
        if expected is None:
            expected, basis = len(given[0].vector or b"") // 4, "as the first vector of this batch says"
        for memory in given:
            length = len(memory.vector or b"") // 4
            if length != expected:
                raise DimensionMismatch(
                    f"a given vector has {length} dimensions but {model} makes {expected}-d vectors ({basis}): "
                    f"the vector comes from another model than {model}. Nothing was stored; embed the text with "
                    f"{model}, or open the shelf with the embedder of the model that made the vector")

    def get(self, owner: Owner, memory_id: str) -> Memory:
        found = self.store.get_memory(_check_owner(owner), self._check_id(memory_id), self.now())
        if found is None:
            raise NotFound(f"no memory {memory_id!r} for {owner}", MEMORY_ID_ADVICE, fix="memory_id")
        return found

    def list_memories(self, owner: Owner, *, limit: int = 50, cursor: str | None = None, topic: str | None = None,
                      source: str | None = None, contains: str | None = None, order: str = "newest",
                      include_superseded: bool = False) -> tuple[list[Memory], str | None]:
        """One page of the owner's live memories and the cursor of the next page (None at the end).

        topic, source: only memories of this topic, of this source (exactly; None or blank: no filter); contains:
        only those whose topic or content holds this text, ASCII letters in either case (None or blank: no
        filter). order: "newest" first, or "confident" first (then newest). include_superseded: superseded
        memories too (superseded_by names what replaced each). A cursor goes with the order it was given for; give
        the same filters with it."""
        owner = _check_owner(owner)
        if order not in ORDERS:
            raise InvalidInput(f"unknown order {order!r}: use one of {', '.join(ORDERS)}")
        by_confidence = order == "confident"
        after = _read_cursor(owner, "m", cursor, by_confidence)
        limit = _check_limit(limit)
        blank = isinstance(topic, str) and not topic.strip()
        topic = None if topic is None or blank else check_topic(topic)
        if isinstance(source, str) and not source.strip():
            source = None  # a blank filter is no filter, as for topic and contains
        if source is not None:
            self.sources.confidence(source)  # an undeclared source is a mistake, not an empty page
        listing = Listing(topic, source, check_filter("contains", contains, MAX_TOPIC_CHARS), by_confidence,
                          bool(include_superseded))
        page = self.store.page_memories(owner, after, limit, self.now(), listing)
        return page, _next_cursor(owner, page, limit, by_confidence)

    def list_users(self, tenant: str, *, limit: int = 50, cursor: str | None = None,
                   contains: str | None = None) -> tuple[list[UserSummary], str | None]:
        """One page of the tenant's users by user id, each with how many live memories (current ones), facts and
        messages they have, and the cursor of the next page (None at the end). A user is listed while an export of
        them would hold a record. contains: only users whose id contains this text, ASCII letters in either case
        (None or empty: every user)."""
        check_tenant(tenant)
        after = _read_users_cursor(tenant, cursor)
        limit = _check_limit(limit)
        contains = check_filter("contains", contains)
        page = self.store.page_users(tenant, after, limit, contains, self.now())
        return page, _next_users_cursor(tenant, page, limit)

    def confirm(self, owner: Owner, memory_id: str) -> Memory:
        """The user vouches for a memory: a mined or inferred one becomes stated, with stated's confidence, and
        records when (confirmed_at) and the source it had (confirmed_from). A memory already as confident as
        stated is returned unchanged. A superseded memory cannot be confirmed (Conflict): remember its text again
        if the user still holds it."""
        owner = _check_owner(owner)
        memory = self.get(owner, memory_id)
        stated = self.sources["stated"]
        if memory.superseded_at is not None:
            raise Conflict(f"memory {memory.id!r} was superseded by {memory.superseded_by!r} on "
                           f"{exports.iso(memory.superseded_at)}",
                           "confirm the memory that replaced it, or remember this text again if it still holds")
        if memory.confidence >= stated:
            return memory
        confirmed = self.store.confirm_memory(owner, memory.id, "stated", stated, self.now())
        if confirmed is None:  # erased, expired or superseded between the read and the write
            return self.confirm(owner, memory_id)
        return confirmed

    def set_expiry(self, owner: Owner, memory_id: str, *, ttl: float | timedelta | None = None,
                   expires_at: datetime | None = None) -> Memory:
        """Change when a memory expires: ttl (seconds from now, or a timedelta) or expires_at (a future aware
        instant); neither makes it never expire. An expired memory is gone: remember it again instead."""
        owner = _check_owner(owner)
        memory_id = self._check_id(memory_id)
        now = self.now()
        when = resolve_expiry(expires_at, ttl, now)
        changed = self.store.set_memory_expiry(owner, memory_id, when, now)
        if changed is None:
            raise NotFound(f"no memory {memory_id!r} for {owner}", MEMORY_ID_ADVICE, fix="memory_id",
                           after="; no expiry was changed")
        return changed

    def forget(self, owner: Owner, memory_id: str) -> Erased:
        """Erase one memory of this owner, with its vector and index entries. Another owner's id is NotFound. A
        memory it had superseded takes its place: current again, or closed by what had closed the erased one."""
        if not self.store.delete_memory(_check_owner(owner), self._check_id(memory_id)):
            raise NotFound(f"no memory {memory_id!r} for {owner}", MEMORY_ID_ADVICE, fix="memory_id",
                           after="; nothing was deleted")
        return Erased(memories=1, scrub_pending=self.store.scrub_pending)

    @staticmethod
    def _check_id(memory_id: object) -> str:
        if not isinstance(memory_id, str) or not memory_id.strip() or len(memory_id) > 200:
            raise InvalidInput(f"memory id must be a non-empty string such as 'm_3f9c0a1b2d4e5f60', got {memory_id!r}")
        return check_encodable("memory id", memory_id)

    # ---------------------------------------------------------------- retrieval
    def search(self, owner: Owner, question: str, *, mode: str = "auto", limit: int = 5,
               floor: float | None = None, include_superseded: bool = False,
               as_of: datetime | None = None) -> SearchResult:
        """Find the owner's current memories for a question (a superseded memory is not current).

        keyword: full-text, ordered by confidence, then match quality, then newest (spec 000).
        semantic: cosine above `floor`, ordered by (score, confidence) (spec 002).
        hybrid: both, fused; relevance first, and confidence orders only among hits as relevant as the best
        (_retrieval.order). auto: hybrid with an embedder, else keyword.
        If the embedder is unreachable, semantic and hybrid fall back to keyword and the result is `degraded`.
        as_of: what was current at that instant (created by then, not yet superseded then); include_superseded:
        superseded memories too.
        """
        owner = _check_owner(owner)
        view = _view(as_of, include_superseded)
        if not isinstance(question, str):
            raise InvalidInput(f"question must be a string, got {type(question).__name__}")
        check_text("question", question)
        limit = _check_limit(limit)
        floor = self.floor if floor is None else _check_floor(floor)
        if mode not in MODES:
            raise InvalidInput(f"unknown search mode {mode!r}: use one of {', '.join(MODES)}")
        if mode == "auto":
            mode = "hybrid" if self.embedder is not None else "keyword"
        if mode != "keyword" and self.embedder is None:
            raise ConfigError(f"{mode} search needs an embedder", "open the shelf with embedder='local' "
                              "(or ollama:/openai:), or use mode='keyword'", fix="embedder", subject=mode)
        now = self.now()
        terms = search_terms(question, limit=MAX_QUERY_TERMS)
        if mode == "keyword":
            return self._keyword(owner, terms, limit, now, view)
        try:
            with embedding_deadline(search_timeout()):
                query = embedded(self.embedder, [question])[0]  # type: ignore[arg-type]
        except EmbedderUnavailable as exc:
            log.warning("embedder unavailable, searching by keywords only: %s", exc)
            result = self._keyword(owner, terms, limit, now, view)
            result.degraded, result.reason = True, str(exc)
            return result
        if mode == "semantic":
            return self._semantic(owner, query, limit, floor, now, view)
        return self._hybrid(owner, terms, query, limit, floor, now, view)

    def _keyword(self, owner: Owner, terms: list[str], limit: int, now: datetime, view: View) -> SearchResult:
        found = self.store.keyword_search(owner, terms, limit, now, by_confidence=True, view=view)
        return SearchResult([Hit(s.memory, s.score, "keyword", _details("keyword", rank, s.score))
                             for rank, s in enumerate(found, 1)], mode="keyword")

    def _semantic(self, owner: Owner, query: np.ndarray, limit: int, floor: float, now: datetime,
                  view: View) -> SearchResult:
        """Search by meaning alone. When it finds fewer than asked, it counts the memories it could not see (no
        vector of this model yet), so an empty answer can say to run backfill."""
        model = self.embedder.model  # type: ignore[union-attr]
        found = self.store.vector_search(owner, model, query, limit, floor, now, view)
        unembedded = self.store.count_unembedded(owner, model, now) if len(found) < limit else 0
        return SearchResult([Hit(s.memory, s.score, "semantic", _details("semantic", rank, s.score))
                             for rank, s in enumerate(found, 1)], mode="semantic", unembedded=unembedded)

    def _hybrid(self, owner: Owner, terms: list[str], query: np.ndarray, limit: int, floor: float,
                now: datetime, view: View) -> SearchResult:
        width = max(CANDIDATES, limit)
        model = self.embedder.model  # type: ignore[union-attr]
        by_words, by_meaning = both_sides(self.store, owner, model, terms, query, width, floor, now, view)
        fused: list[Candidate] = order(fuse(by_words, by_meaning))
        return SearchResult([Hit(c.memory, c.score, c.retriever, c.details) for c in fused[:limit]], mode="hybrid")

    def context(self, owner: Owner, question: str, *, limit: int = 3, mode: str = "auto",
                include_superseded: bool = False, as_of: datetime | None = None) -> str:
        """The `Relevant knowledge (...)` block for a question, or "" when nothing matches (as_of and
        include_superseded as for search)."""
        return ctx.knowledge_block(self.search(owner, question, mode=mode, limit=limit, as_of=as_of,
                                               include_superseded=include_superseded), self.budget)

    def build_prompt(self, base_prompt: str, owner: Owner, user_text: str, *, limit: int = 3,
                     mode: str = "auto", include_superseded: bool = False, as_of: datetime | None = None) -> str:
        """base prompt + `Memory context:` (facts, always) + relevant knowledge (only when something matches).
        With as_of, both are what was current then: the facts of that instant and the memories current then."""
        if not isinstance(base_prompt, str):
            raise InvalidInput(f"base_prompt must be a string, got {type(base_prompt).__name__}")
        if not isinstance(user_text, str):
            raise InvalidInput(f"user_text must be a string, got {type(user_text).__name__}")
        check_encodable("base_prompt", base_prompt)
        if user_text.strip():  # checked under its own name (search would call it the question)
            check_text("user_text", user_text)
        hits = self.search(owner, user_text, mode=mode, limit=limit, as_of=as_of,
                           include_superseded=include_superseded) if user_text.strip() else []
        return ctx.assemble(base_prompt, self.facts(owner, as_of=as_of), hits, self.budget,
                            confirmed=self._confirmed_sources())

    def _confirmed_sources(self) -> set[str]:
        """The sources worth as much as `stated`: a fact from any other (or undeclared) source is a guess."""
        return {name for name, worth in self.sources.items() if worth >= self.sources["stated"]}

    # ---------------------------------------------------------------- facts
    def set_fact(self, owner: Owner, key: str, value: str, source: str = "stated") -> Fact:
        """Set the one current value of a fact; the old value stays in fact_history.

        A value from a weaker source than the current one's (inferred over stated) never replaces it: it goes to
        fact_history only, and the returned Fact is the unchanged current one with `outranked` set to the value
        given (`note` says so in words). A source this shelf has not declared counts as the strongest."""
        owner = _check_owner(owner)
        key = check_name("fact key", key, MAX_FACT_KEY_CHARS)
        value = check_text("fact value", value, MAX_FACT_VALUE_CHARS)
        worth = self.sources.confidence(source)
        return self.store.set_fact(owner, key, value, source, self.now(),
                                   replaces=lambda current: worth >= self.sources.get(current, 1.0))

    def facts(self, owner: Owner, *, as_of: datetime | None = None) -> list[Fact]:
        """The owner's current facts, most recently set first; with as_of, the values they had at that instant
        (read from fact history; a fact erased with forget_fact has no past)."""
        owner = _check_owner(owner)
        if as_of is None:
            return self.store.facts(owner)
        return _facts_as_of(self.store.fact_history(owner, None), self._outranks, check_when("as_of", as_of))

    get_facts = facts

    def get_fact(self, owner: Owner, key: str) -> Fact:
        """The current value of one fact; NotFound when the owner has no such fact."""
        key = check_text("fact key", key, MAX_FACT_KEY_CHARS)
        for fact in self.facts(owner):
            if fact.key == key:
                return fact
        raise NotFound(f"no fact {key!r} for {owner}", FACT_KEY_ADVICE, fix="fact_key")

    def fact_history(self, owner: Owner, key: str | None = None) -> list[FactChange]:
        key = None if key is None else check_text("fact key", key, MAX_FACT_KEY_CHARS)
        return self.store.fact_history(_check_owner(owner), key)

    def forget_fact(self, owner: Owner, key: str) -> Erased:
        """Erase a fact with its whole history. Counts only the fact: the store does not say how many changes went."""
        if not self.store.delete_fact(_check_owner(owner), check_text("fact key", key, MAX_FACT_KEY_CHARS)):
            raise NotFound(f"no fact {key!r} for {owner}", FACT_KEY_ADVICE, fix="fact_key",
                           after="; nothing was deleted")
        return Erased(facts=1, scrub_pending=self.store.scrub_pending)

    # ---------------------------------------------------------------- messages
    def log_message(self, owner: Owner, thread: str, role: str, content: str, *,
                    ttl: float | timedelta | None | object = _DEFAULT) -> Message:
        """Append one conversation turn. Messages expire after the shelf's message_ttl unless ttl says otherwise;
        they are never returned as knowledge."""
        owner = _check_owner(owner)
        thread = check_name("thread", thread, MAX_TOPIC_CHARS)
        role = check_role(role)
        content = check_text("content", content)
        return self._log(owner, thread, [(role, content)], ttl)[0]

    def log_messages(self, owner: Owner, thread: str, turns: Iterable[Mapping[str, Any]], *,
                     ttl: float | timedelta | None | object = _DEFAULT) -> list[Message]:
        """Append several turns to a thread in one transaction, in order: all are kept, or none (a bad turn is
        refused before anything is written). Each turn is {"role": ..., "content": ...}; ttl as for log_message."""
        owner = _check_owner(owner)
        thread = check_name("thread", thread, MAX_TOPIC_CHARS)
        checked = [_turn_of(number, turn) for number, turn in enumerate(_check_records("turns", turns), 1)]
        return self._log(owner, thread, checked, ttl)

    def _log(self, owner: Owner, thread: str, checked: Sequence[tuple[str, str]],
             ttl: float | timedelta | None | object) -> list[Message]:
        """Store checked (role, content) turns in one transaction, stamped inside it once the write may start
        (SQLite: the file's write lock; PostgreSQL: the thread's lock against a learn's reading), so a learn's
        watermark (by time) never passes a turn still waiting to be stored."""
        with self.store.atomic():
            self.store.hold_thread(owner, thread)
            now = self.now()
            expires = self._message_expiry(ttl, now)
            return [self.store.add_message(owner, Message(new_id("msg"), thread, role, content, now, expires))
                    for role, content in checked]

    def _message_expiry(self, ttl: float | timedelta | None | object, now: datetime) -> datetime | None:
        """When a message logged now expires: after ttl, or the shelf's message_ttl when none was given."""
        ttl = self.message_ttl if ttl is _DEFAULT else ttl
        return resolve_expiry(None, ttl, now) if ttl is not None else None

    def messages(self, owner: Owner, thread: str | None = None, *, limit: int = 50) -> list[Message]:
        """The newest `limit` messages of a thread (or of all threads), oldest first."""
        thread = None if thread is None else check_text("thread", thread, MAX_TOPIC_CHARS)
        return self.store.messages(_check_owner(owner), thread, _check_limit(limit), self.now())

    def list_messages(self, owner: Owner, thread: str | None = None, *, limit: int = 50,
                      cursor: str | None = None) -> tuple[list[Message], str | None]:
        """One page of the owner's live messages (of a thread, or of all), newest first, and the cursor of the next
        page (None at the end): unlike messages(), paging reaches back to the first message."""
        owner = _check_owner(owner)
        after = _read_cursor(owner, "msg", cursor)
        limit = _check_limit(limit)
        thread = None if thread is None else check_text("thread", thread, MAX_TOPIC_CHARS)
        page = self.store.page_messages(owner, thread, after, limit, self.now())
        return page, _next_cursor(owner, page, limit)

    # ---------------------------------------------------------------- learning
    def learn(self, owner: Owner, messages: Sequence[Mapping[str, Any] | Turn] | None = None, *,
              thread: str | None = None, extractor: object = None, dry_run: bool = False) -> Plan:
        """Learn from a conversation: the extractor proposes, the Shelf decides, and (unless dry_run) applies the
        plan in one transaction.

        messages: turns given directly, like [{"role": "user", "content": "I moved to Lisbon.", "at": when}]; or
        thread: the name of a logged thread, whose messages after its watermark are read (at most 1,000; Plan.more
        says when more wait). The watermark moves with the plan's writes, never in a dry run or on a failure.
        extractor: "rules" (the default, or MEMSHELF_EXTRACTOR), "ollama:MODEL", "openai:MODEL", or an Extractor.
        The plan lists every proposal with the decision taken on it and why (see README, "Learning")."""
        owner = _check_owner(owner)
        thread = learning_decide.check_learn_args(messages, thread)
        return learning_decide.learn(self, owner, messages, thread, extractor, bool(dry_run))

    def evidence(self, owner: Owner, *, memory_id: str | None = None, key: str | None = None) -> list[Evidence]:
        """The messages a learned memory (memory_id) or fact (key) came from, oldest first: each with its thread and
        when it was said. Empty for a record the caller wrote. Give one of memory_id and key, or neither for the
        evidence of every record the owner's memory learned."""
        owner = _check_owner(owner)
        if memory_id is not None and key is not None:
            raise InvalidInput("evidence of what? give memory_id (a memory's id) or key (a fact's key), not both")
        if memory_id is None and key is None:
            return self.store.evidence(owner, None, None)
        if memory_id is not None:
            return self.store.evidence(owner, "memory", self._check_id(memory_id))
        return self.store.evidence(owner, "fact", check_text("fact key", key, MAX_FACT_KEY_CHARS))

    # ---------------------------------------------------------------- erasure
    def forget_message(self, owner: Owner, message_id: str) -> Erased:
        """Erase one message (and the evidence rows that cite it; what was learned from it stays). Another owner's
        id, or one already gone, is NotFound."""
        owner = _check_owner(owner)
        erased = self.store.delete_message(owner, _check_message_id(message_id))
        if not erased.messages:
            raise NotFound(f"no message {message_id!r} for {owner}", "check the id: list_messages() returns them",
                           fix="message_id", after="; nothing was deleted")
        return erased

    def forget_messages(self, owner: Owner, message_ids: Iterable[str]) -> Erased:
        """Erase several messages in one transaction, each with the evidence that cites it: all of them, or none
        when one is not the owner's (NotFound), as a turn logged in parts is erased."""
        owner = _check_owner(owner)
        if isinstance(message_ids, (str, bytes)) or not isinstance(message_ids, Iterable):
            raise InvalidInput(f"message_ids must be a list of message ids, got {type(message_ids).__name__}: "
                               "pass e.g. ['msg_3f9c0a1b2d4e5f60'], or use forget_message for one")
        erased = Erased()
        wanted = list(dict.fromkeys(_check_message_id(m) for m in message_ids))
        with self.store.atomic():
            self.store.lock_messages(owner, wanted)  # in one order (a learn's): two such never wait on each other
            for message_id in wanted:
                one = self.store.delete_message(owner, message_id)
                if not one.messages:
                    raise NotFound(f"no message {message_id!r} for {owner}", "check the ids: list_messages() "
                                   "returns them", fix="message_id", after="; nothing was deleted")
                erased += one
        return replace(erased, scrub_pending=erased.messages > 0 and self.store.scrub_pending)

    def forget_thread(self, owner: Owner, thread: str, *, cascade: bool = False) -> Erased:
        """Erase a thread: its messages and its learning watermark. With cascade, also what was learned only from
        it: memories whose every evidence message is in this thread, and fact values that only its evidence names
        (a value the caller set stays, and becomes current again if a taught one had replaced it; so does a memory
        that an erased one had superseded). A memory or value with evidence in another thread, or none (written by
        the caller), stays."""
        thread = check_text("thread", thread, MAX_TOPIC_CHARS)
        owner = _check_owner(owner)
        if "outranks" in inspect.signature(self.store.forget_thread).parameters:
            return self.store.forget_thread(owner, thread, bool(cascade), outranks=self._outranks)
        return self.store.forget_thread(owner, thread, bool(cascade))  # a store written before outranks

    def forget_user(self, owner: Owner) -> Erased:
        """Erase every trace of the owner: memories, vectors, index entries, facts and their history, messages."""
        return self.store.erase_user(_check_owner(owner))

    def forget_tenant(self, tenant: str) -> Erased:
        """Admin: erase every user of a tenant, and revoke its API keys first so no request acts for it after."""
        check_tenant(tenant)
        self.store.revoke_tenant_keys(tenant, self.now())
        return self.store.erase_tenant(tenant)

    def purge_expired(self) -> Erased:
        """Delete, for good, every memory and message whose expiry has passed (they are already invisible)."""
        return self.store.purge_expired(self.now())

    def scrub(self, *, full: bool | None = None) -> bool:
        """Finish now what erasures left for later (see Erased.scrub_pending): on SQLite the checkpoint a reader
        held up, tried again; on PostgreSQL the queued scrub (full=True: VACUUM FULL, see README). Returns whether a
        copy of erased text may still be on disk (True on SQLite while another connection keeps reading)."""
        return self.store.finish_scrub(full)

    # ---------------------------------------------------------------- vectors
    def backfill(self, *, batch_size: int = 64, progress: Callable[[int, int], None] | None = None) -> int:
        """Embed every memory whose vector is missing or from another model, batch by batch.

        Each batch is committed on its own, so an interrupted backfill resumes where it stopped.
        Returns how many memories were embedded.
        """
        _check_backfill(batch_size, progress)
        if self.embedder is None:
            raise ConfigError("backfill needs an embedder: open the shelf with embedder='local' (or ollama:/openai:)")
        model = self.embedder.model
        total = self.store.count_pending_vectors(model)
        done, after = 0, 0
        while True:
            pending = self.store.pending_vectors(model, after, batch_size)
            if not pending:
                break
            vectors = self._embed_in_pieces([p.text for p in pending])
            self.store.set_vectors(model, [(p.key, *_packed(v)) for p, v in zip(pending, vectors)])
            done += len(pending)
            after = pending[-1].key
            if progress is not None:
                progress(done, total)
        return done

    # ---------------------------------------------------------------- export / import
    def export(self, owner: Owner) -> Iterator[dict[str, Any]]:
        """Every live record of the owner as JSON-ready dicts (one per JSON Lines row); expired memories and
        messages are left out, as every other read leaves them out."""
        owner = _check_owner(owner)
        now = self.now()
        yield exports.header()
        for kind in exported_kinds():
            yield from exports.owner_records(self.store, owner, kind, now)

    def import_(self, owner: Owner, records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        """Load records made by export() into this owner, all or nothing. Records the owner already has are
        skipped, so importing twice adds nothing (fact history included).

        A record is checked as remember() checks its input, never trusted: a memory's confidence comes from its
        source as this shelf declares it (the record's `confidence` is ignored); ids must have the shape memshelf
        gives; times lie between 1970 and now (plus exports.MAX_CLOCK_SKEW); expiries are in the future;
        observations are 1 to exports.MAX_OBSERVATIONS. The first bad record stops the import with an InvalidInput
        naming its number and field. A vector is kept only when its length fits its model (see _settle_vectors)."""
        owner = _check_owner(owner)
        now = self.now()
        batch = exports.ImportBatch()
        for number, record in enumerate(_check_records("records", records), 1):
            try:
                exports.read_record(record, batch, now, self.sources)
            except RecursionError:
                raise InvalidInput(f"import record {number} is nested too deeply to read: nothing was imported; "
                                   "fix the record or re-export") from None
            except InvalidInput as exc:
                raise exc.within(f"import record {number}: ", "; nothing was imported (fix the record or "
                                 "re-export)") from exc
        memories, blobs, pieces = self._embed_imported(*self._settle_vectors(owner, batch.memories, batch.blobs))
        history = self.store.fact_history(owner, None)
        changes = missing_changes(batch.changes, history)
        evidence = missing_changes(batch.evidence, self.store.evidence(owner, None, None))
        marks = {t: m for t, m in batch.marks.items() if t not in self.store.learn_marks(owner)}
        winners = self._imported_winners(owner, history, changes)
        with self.store.atomic():
            counts = {"memories": self.store.import_memories(owner, memories, blobs, pieces),
                      "facts": self.store.import_facts(owner, batch.facts,
                                                       missing_changes(changes, winners)),
                      "messages": self.store.import_messages(owner, batch.messages)}
            for change in winners:  # its history row and the current value, as set_fact writes them
                self.store.set_fact(owner, change.key, change.value, change.source, change.set_at)
            self.store.add_evidence(owner, evidence)
            for thread, mark in marks.items():
                self.store.set_learn_mark(owner, thread, mark, now)
        # what learning keeps is counted only when the records carried some (older exports have none)
        return {**counts, **({"evidence": len(evidence)} if batch.evidence else {}),
                **({"learn_marks": len(marks)} if batch.marks else {})}

    def _imported_winners(self, owner: Owner, history: Sequence[FactChange], changes: Sequence[FactChange]
                          ) -> list[FactChange]:
        """The imported changes that become a fact's current value: replayed with the owner's history by set_fact's
        rule (by time; a weaker source never replaces a stronger one), an imported statement outranks a later
        guess the owner held, and facts(as_of=now) agrees with facts() after the import."""
        if not changes:
            return []
        held = {fact.key: fact for fact in self.store.facts(owner)}
        outranks = self._outranks
        replayed = _facts_as_of([*history, *changes], outranks, LATEST)
        brought = set(changes)
        winners = []
        for fact in replayed:
            current = held.get(fact.key)
            change = FactChange(fact.key, fact.value, fact.source, fact.updated_at)
            if current is not None and (current.value, current.source) != (fact.value, fact.source) \
                    and change in brought:
                winners.append(change)
        return winners

    def _outranks(self, new: str, held: str) -> bool:
        return self.sources.get(new, 1.0) >= self.sources.get(held, 1.0)

    def _settle_vectors(self, owner: Owner, memories: list[Memory], blobs: list[bytes | None]
                        ) -> tuple[list[Memory], list[bytes | None]]:
        """Drop each imported vector whose length does not fit its model, so that no stamp lies about a vector
        (backfill trusts stamps). A vector of the configured embedder's model must have its dimensions; a vector of
        another model must have the one length shared by every vector of that model in the import and already
        stored for the owner. A memory whose vector is dropped is embedded now, or by backfill if it cannot be."""
        widths = self._model_widths(owner, memories, blobs)
        settled: tuple[list[Memory], list[bytes | None]] = ([], [])
        for memory, blob in zip(memories, blobs):
            if blob is not None and widths.get(memory.embed_model or "") != len(blob) // 4:
                log.warning("import: dropping the %d-d vector of %s stamped %s (wrong length for that model); "
                            "it is embedded again", len(blob) // 4, memory.id, memory.embed_model)
                memory, blob = replace(memory, embed_model=None), None
            settled[0].append(memory)
            settled[1].append(blob)
        return settled

    def _model_widths(self, owner: Owner, memories: list[Memory], blobs: list[bytes | None]) -> dict[str, int]:
        """The one vector length each model stamped on the import may have; a model with no single length is left
        out (its vectors are all dropped)."""
        seen: dict[str, set[int]] = {}
        for memory, blob in zip(memories, blobs):
            if blob is not None and memory.embed_model:
                seen.setdefault(memory.embed_model, set()).add(len(blob) // 4)
        configured = self.embedder.model if self.embedder is not None else None
        if configured in seen:
            try:
                return {**self._stored_widths(owner, seen.keys() - {configured}, seen),
                        configured: self.embedder.dimensions}  # type: ignore[union-attr, dict-item]
            except EmbedderUnavailable:
                pass  # its length cannot be asked now: hold its vectors to the consistency rule
        return self._stored_widths(owner, set(seen), seen)

    def _stored_widths(self, owner: Owner, models: Iterable[str], seen: dict[str, set[int]]) -> dict[str, int]:
        wanted = set(models)
        widths = {m: set(seen[m]) for m in wanted}
        if wanted:
            for memory, blob in self.store.iter_memories(owner, None):
                if blob is not None and memory.embed_model in wanted:
                    widths[memory.embed_model].add(len(blob) // 4)
        return {model: next(iter(found)) for model, found in widths.items() if len(found) == 1}

    def _embed_imported(self, memories: list[Memory], blobs: list[bytes | None]
                        ) -> tuple[list[Memory], list[bytes | None], list[list[bytes]]]:
        """Give imported memories vectors of the current model, in batches, keeping the ones already stamped with
        it unless the text is longer than the model's window: an export carries one vector per memory, so a long
        memory is embedded again, in pieces. If the embedder is down they are imported without the vectors they
        need, and the next backfill embeds them. Returns the memories, their vectors and their later pieces'."""
        pieces: list[list[bytes]] = [[] for _ in memories]
        if self.embedder is None:
            return memories, blobs, pieces
        model = self.embedder.model
        kept = [i for i, m in enumerate(memories) if blobs[i] is not None and m.embed_model == model]
        long = {i for i, split in zip(kept, pieces_of(self.embedder, [memories[i].content for i in kept]))
                if len(split) > 1}
        todo = [i for i, m in enumerate(memories) if blobs[i] is None or m.embed_model != model or i in long]
        memories, blobs = list(memories), list(blobs)
        for i in long:
            memories[i], blobs[i] = replace(memories[i], embed_model=None), None
        try:
            for start in range(0, len(todo), IMPORT_BATCH):
                chunk = todo[start:start + IMPORT_BATCH]
                with embedding_deadline(write_timeout()):
                    vectors = self._embed_in_pieces([memories[i].content for i in chunk])
                for i, vector in zip(chunk, vectors):
                    memories[i] = replace(memories[i], embed_model=model)
                    blobs[i], pieces[i] = _packed(vector)
        except EmbedderUnavailable as exc:
            log.warning("embedder unavailable during import; run backfill later: %s", exc)
        return memories, blobs, pieces

    # ---------------------------------------------------------------- API keys (for `memshelf serve`)
    def create_key(self, tenant: str | None, name: str = "") -> tuple[ApiKey, str]:
        """Make an API key bound to `tenant` (None: an admin key). Returns the key and its secret, which is
        shown this once: only a hash of it is stored."""
        if tenant is not None:
            addressable("tenant", check_tenant(tenant))
        name = name or ("admin" if tenant is None else tenant)
        key = ApiKey(new_id("key"), tenant, check_text("key name", name, MAX_TOPIC_CHARS), self.now())
        secret = f"ms_{secrets.token_urlsafe(32)}"
        self.store.add_key(key, _hash_secret(secret))
        return key, secret

    def authenticate(self, secret: str) -> ApiKey | None:
        """The live key for this secret, or None for a wrong or revoked one."""
        if not isinstance(secret, str) or not secret.startswith("ms_") or len(secret) > 200 or not secret.isascii():
            return None
        return self.store.key_by_hash(_hash_secret(secret))

    def list_keys(self, tenant: str | None = None) -> list[ApiKey]:
        if tenant is not None:
            check_tenant(tenant)
        return self.store.list_keys(tenant)

    def revoke_key(self, key_id: str) -> None:
        if not self.store.revoke_key(self._check_id(key_id), self.now()):
            raise NotFound(f"no live key {key_id!r}", "list the keys with list_keys()", fix="key_id")

    def stats(self) -> dict[str, Any]:
        return {**self.store.stats(), "embedder": self.embedder.model if self.embedder else None}


def _details(retriever: str, rank: int, score: float) -> dict[str, float]:
    """A single retriever's working, in the keys fusion uses: its rank and raw score."""
    return {f"{retriever}_rank": rank, f"{retriever}_score": round(score, 6)}


def _packed(vectors: np.ndarray) -> tuple[bytes, list[bytes]]:
    """One memory's vectors as stored: its own (the first piece's) and its later pieces'."""
    return pack(vectors[0]), [pack(v) for v in vectors[1:]]


def _hash_secret(secret: str) -> str:
    # Secrets are 256 random bits, so a fast hash is safe here; a slow KDF would only slow every request.
    return hashlib.sha256(secret.encode()).hexdigest()
