"""What a storage backend provides. Business rules (validation, sources, fusion, formatting) live in the Shelf;
a store only keeps rows and finds them, always inside the owner's scope."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from ..errors import StoreError
from ..model import Fact, FactChange, Memory, Message, NewMemory, Owner, UserSummary


@dataclass(frozen=True, slots=True)
class Scored:
    """A memory and the raw score one retriever gave it (bm25 relevance or cosine similarity)."""

    memory: Memory
    score: float


@dataclass(frozen=True, slots=True)
class Observation:
    """What a repeat of an existing (topic, content) changes in the stored row."""

    source: str
    confidence: float
    expires_at: datetime | None
    replace_vector: bool
    reopen: bool = False
    """The row was superseded and the repeat makes it current again (superseded_at and superseded_by cleared)."""
    revived: bool = False
    """The row had expired: it is gone for every read, so its provenance starts again from the repeat's (source and
    confidence the repeat's, confirmed_at and confirmed_from cleared)."""


BACKFILL_ADVICE = "give the new model a distinct name, then run backfill to embed the memories with it"
"""What to do when one model name was used for two models (vectors of two lengths under one name)."""


def digest(topic: str, content: str) -> str:
    """Identity of a memory's text within an owner, for dedup: (topic, content) with surrounding whitespace
    stripped and every run of whitespace made one space, so "The sky is blue." and "The sky is blue. " are one
    memory. The text itself is stored as given (the first one wins)."""
    return hashlib.sha256(f"{' '.join(topic.split())}\x00{' '.join(content.split())}".encode()).hexdigest()


CONTEXT_TURNS = 2
"""How many earlier memories of the same owner and topic make a memory's conversation context: words the hybrid
search also ranks it by (BENCHMARKS.md, LoCoMo)."""


def observe_again(old: Memory, item: NewMemory, now: datetime, *, successor: Memory | None = None) -> Observation:
    """The dedup rule every backend applies: keep the stronger source, keep the later expiry (None is never),
    revive an expired row with the new expiry and the repeat's provenance (an expired statement repeated by a guess
    is a guess), and take the new vector only if it is of another model.

    A superseded row is made current again by a repeat at least as confident as the memory that superseded it
    (`successor`: the owner's memory named by old.superseded_by, None when there is no such memory any more): the
    text was said again, so it holds again. A weaker repeat leaves it closed, so a guess never undoes what replaced a
    statement."""
    revived = old.expires_at is not None and old.expires_at <= now
    stronger = revived or item.confidence > old.confidence
    if revived:
        expires = item.expires_at
    elif old.expires_at is None or item.expires_at is None:
        expires = None
    else:
        expires = max(old.expires_at, item.expires_at)
    reopen = old.superseded_at is not None and (successor is None or item.confidence >= successor.confidence)
    return Observation(item.source if stronger else old.source,
                       item.confidence if stronger else old.confidence, expires,
                       item.vector is not None and old.embed_model != item.embed_model, reopen, revived)


@dataclass(frozen=True, slots=True)
class Position:
    """Where a page of an owner's memories or messages ended: its last record's created_at and id. Pages are
    ordered newest first by (created_at, the backend's row key); the id finds that key within the owner."""

    created_at: datetime
    id: str
    confidence: float | None = None
    """The last record's confidence, when the pages are ordered most confident first (Listing.by_confidence)."""


@dataclass(frozen=True, slots=True)
class Listing:
    """Which of an owner's memories a page lists, and in what order. Every field narrows; the defaults list the
    live current memories, newest first."""

    topic: str | None = None  # this topic exactly
    source: str | None = None  # this source exactly
    contains: str | None = None  # topic or content contains this text, ASCII letters in either case
    by_confidence: bool = False  # most confident first, then newest; else newest first
    include_superseded: bool = False  # superseded memories too, in their place in the order


EVERY = Listing()


@dataclass(frozen=True, slots=True)
class Erased:
    """How many records an erase or purge removed, and whether their text may still sit in the database's files.

    scrub_pending: the records are gone from every read, but a copy of their text may remain on disk a while
    longer, until the backend's scrub has run (Shelf.scrub() runs it now). SQLite: another connection is reading
    an older snapshot, so the WAL cannot be emptied yet; the store's next write, erasure or close finishes the
    scrub. PostgreSQL: the scrub is queued and runs in the background MEMSHELF_PG_SCRUB_DELAY seconds later.
    """

    memories: int = 0
    facts: int = 0
    fact_changes: int = 0
    messages: int = 0
    scrub_pending: bool = False

    def __add__(self, other: Erased) -> Erased:
        return Erased(self.memories + other.memories, self.facts + other.facts,
                      self.fact_changes + other.fact_changes, self.messages + other.messages,
                      self.scrub_pending or other.scrub_pending)

    def as_dict(self) -> dict[str, int | bool]:
        return {"memories": self.memories, "facts": self.facts, "fact_changes": self.fact_changes,
                "messages": self.messages, "scrub_pending": self.scrub_pending}


@dataclass(frozen=True, slots=True)
class View:
    """Which memories a read sees. The default: the current ones (not superseded). as_of: those current at that
    instant (created by then and not yet superseded then). include_superseded: superseded ones too (with as_of:
    every one created by then). Expiry is always judged at the time of the read: an expired memory is gone."""

    as_of: datetime | None = None
    include_superseded: bool = False


CURRENT = View()


@dataclass(frozen=True, slots=True)
class Mark:
    """Where learning stopped in a thread (the watermark): the last learned message's id and when it was said."""

    message_id: str
    said_at: datetime


@dataclass(frozen=True, slots=True)
class Evidence:
    """One message a learned record came from: kind "memory" (record: its id) or "fact" (record: its key)."""

    kind: str
    record: str
    message_id: str
    thread: str | None
    said_at: datetime | None
    set_at: datetime | None = None
    """For a fact: the set_at of the history row holding the value this message taught, or said again when
    learning had taught it, so that forgetting the thread takes that value (once no other thread's evidence names
    it) and no other; None for a memory, and for evidence written before memshelf kept it."""


SAID_AGAIN = datetime(1970, 1, 1, tzinfo=UTC)
"""Evidence.set_at that older versions wrote for a message that said a fact's value again, naming no value (no
history row is that old: model.EARLIEST). Such rows are still read: in another thread, they keep every value."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key's public half: the secret itself is shown once and only its hash is kept."""

    id: str
    tenant: str | None  # None for an admin key
    name: str
    created_at: datetime
    revoked_at: datetime | None = None

    @property
    def admin(self) -> bool:
        return self.tenant is None


@dataclass(frozen=True, slots=True)
class Pending:
    """A memory waiting for a vector of the current model (backfill)."""

    key: int
    text: str


class MemoryStore(ABC):
    """The memory-and-search half of a backend: memories, their full-text and vector search, backfill. Each backend
    writes it its own way; every method takes the owner and filters by it in the query."""

    @abstractmethod
    def add_memories(self, owner: Owner, items: Sequence[NewMemory], now: datetime) -> list[Memory]:
        """Insert, or for an identical (topic, content) bump observations and last_seen. Returns each stored row.
        A memory's later pieces (NewMemory.pieces) are stored with its vector, and replaced with it."""

    @abstractmethod
    def import_memories(self, owner: Owner, items: Sequence[Memory], vectors: Sequence[bytes | None],
                        pieces: Sequence[Sequence[bytes]] = ()) -> int:
        """Insert exported memories as they were (ids, times, counts); skip ones the owner already has. pieces,
        when given, holds each memory's later pieces' vectors (kept only with a vector)."""

    def memory_pieces(self, owner: Owner, ids: Sequence[str]) -> dict[str, list[bytes]]:
        """The vectors of the later pieces of these memories (by id; the first piece's is the memory's own), of the
        memory's model, in order; memories with one piece are left out. A backend that keeps none returns {}."""
        return {}

    @abstractmethod
    def get_memory(self, owner: Owner, memory_id: str, now: datetime) -> Memory | None: ...

    @abstractmethod
    def delete_memory(self, owner: Owner, memory_id: str) -> bool:
        """Erase the owner's memory; False when it has none by that id. The memories it had superseded take its
        place (its superseded_at and superseded_by, so NULL when it was current), in the same transaction; so does
        forget_thread's cascade for the memories it erases."""

    @abstractmethod
    def supersede_memory(self, owner: Owner, old_id: str, new_id: str, now: datetime) -> bool:
        """Close the owner's current memory old_id as replaced by new_id at `now`, keeping its text; False when the
        owner has no such memory or it is already closed."""

    @abstractmethod
    def page_memories(self, owner: Owner, after: Position | None, limit: int, now: datetime,
                      listing: Listing = EVERY) -> list[Memory]:
        """Live memories the listing selects, newest first (created_at, then row key) or, by_confidence, by
        confidence and then so; starting after `after` (None: the first).

        If the record `after` names is gone, the page starts after its instant's newer rows only: records created
        in that same instant may be listed again, never skipped."""

    def confirm_memory(self, owner: Owner, memory_id: str, source: str, confidence: float,
                       now: datetime) -> Memory | None:
        """The user vouched for a live current memory: its source and confidence become these, and it records
        when (confirmed_at) and what source it had (confirmed_from). Returns the memory as stored now; None when
        the owner has no such live current memory."""
        raise StoreError(f"{type(self).__name__} cannot confirm memories: implement confirm_memory")

    def set_memory_expiry(self, owner: Owner, memory_id: str, expires_at: datetime | None,
                          now: datetime) -> Memory | None:
        """Give a live memory a new expiry (None: never). Returns the memory as stored now; None when the owner has
        no such live memory."""
        raise StoreError(f"{type(self).__name__} cannot change expiries: implement set_memory_expiry")

    @abstractmethod
    def iter_memories(self, owner: Owner, now: datetime | None) -> Iterator[tuple[Memory, bytes | None]]:
        """Every memory of the owner, oldest first, with its vector blob; expired ones too when now is None."""

    @abstractmethod
    def keyword_search(self, owner: Owner, terms: Sequence[str], limit: int, now: datetime,
                       by_confidence: bool, view: View = CURRENT) -> list[Scored]:
        """Full-text search over topic and content, terms OR-ed, among the memories `view` sees. Text is indexed as
        keywords.index_text makes it (CJK as pairs of characters), and a term matches as a prefix where
        keywords.is_prefix says so, else whole.

        Ordered by confidence, then relevance, then newest when by_confidence; else relevance, then newest.
        """

    @abstractmethod
    def vector_search(self, owner: Owner, model: str, query: np.ndarray, limit: int, floor: float,
                      now: datetime, view: View = CURRENT) -> list[Scored]:
        """Cosine against the owner's vectors stamped with `model`, at least `floor`, best first, among the
        memories `view` sees. A memory embedded in pieces scores as its best piece."""

    @abstractmethod
    def pending_vectors(self, model: str, after: int, limit: int) -> list[Pending]:
        """Memories (any owner) with no vector or one of another model, key > after, in key order."""

    @abstractmethod
    def count_pending_vectors(self, model: str) -> int: ...

    def vector_dimensions(self, owner: Owner, model: str) -> int | None:
        """The length of the owner's stored vectors of `model` (None when it has none): how a precomputed vector is
        checked while the embedding service is down. A backend that cannot tell returns None."""
        return None

    def count_unembedded(self, owner: Owner, model: str, now: datetime) -> int:
        """How many of the owner's live, current memories have no vector of `model` (search by meaning cannot find
        them until backfill): what an empty search by meaning tells the user. A backend that cannot tell says 0."""
        return 0

    @abstractmethod
    def set_vectors(self, model: str, rows: Iterable[tuple[int, bytes, Sequence[bytes]]]) -> None:
        """Store vectors by Pending.key (backfill): (key, the vector, the later pieces' vectors), replacing the
        memory's pieces."""


class RecordStore(ABC):
    """Facts with their history, messages, and API keys. SQL backends share one implementation (sql_records.py)."""

    @abstractmethod
    def set_fact(self, owner: Owner, key: str, value: str, source: str, now: datetime,
                 replaces: Callable[[str], bool] = lambda current_source: True) -> Fact:
        """Add the value to the fact's history, and make it current unless the fact has a current value whose
        source it may not replace (`replaces(current_source)` is False). Returns the current fact afterwards,
        with `outranked` set when the value given was kept in history only."""

    @abstractmethod
    def facts(self, owner: Owner) -> list[Fact]:
        """Current facts, most recently set first."""

    @abstractmethod
    def fact_history(self, owner: Owner, key: str | None) -> list[FactChange]:
        """Every value a fact (or all facts) had, oldest first."""

    @abstractmethod
    def delete_fact(self, owner: Owner, key: str) -> bool: ...

    @abstractmethod
    def import_facts(self, owner: Owner, facts: Sequence[Fact], changes: Sequence[FactChange]) -> int: ...

    # messages
    @abstractmethod
    def add_message(self, owner: Owner, message: Message) -> Message: ...

    @abstractmethod
    def page_messages(self, owner: Owner, thread: str | None, after: Position | None, limit: int,
                      now: datetime | None) -> list[Message]:
        """Messages of a thread (all threads when None) newest first (created_at, then row key), starting after
        `after` as page_memories does. Only the live ones at `now`; every one when `now` is None."""

    def messages(self, owner: Owner, thread: str | None, limit: int, now: datetime | None) -> list[Message]:
        """The newest `limit` messages of a thread (all threads when None), returned oldest first."""
        return list(reversed(self.page_messages(owner, thread, None, limit, now)))

    @abstractmethod
    def import_messages(self, owner: Owner, messages: Sequence[Message]) -> int: ...

    # learning: the watermark per (owner, thread), and the evidence of learned records
    @abstractmethod
    def learn_mark(self, owner: Owner, thread: str) -> Mark | None:
        """Where learning stopped in the thread (None: nothing learned from it yet)."""

    @abstractmethod
    def learn_marks(self, owner: Owner) -> dict[str, Mark]:
        """Every thread's watermark, by thread."""

    @abstractmethod
    def set_learn_mark(self, owner: Owner, thread: str, mark: Mark, now: datetime) -> None: ...

    def hold_thread(self, owner: Owner, thread: str) -> None:  # noqa: B027 - a no-op is the right default
        """Called in the transaction that logs turns to the thread, before they are stamped: a learn's reading of
        the thread (messages_after) waits for such transactions, and they for it, so no turn is stamped before the
        last one a learn read yet stored after it (behind the watermark). This default holds nothing: enough where
        atomic() holds the store's one write lock; PostgreSQL takes a shared advisory lock."""

    def lock_messages(self, owner: Owner, ids: Sequence[str]) -> int:
        """How many of the owner's messages `ids` exist, each held until the transaction ends, so that erasing them
        waits for it (learning calls it in its transaction before it writes what it learned from them, and drops its
        plan when one is gone). This default holds nothing and counts every id: a store whose erasures could run
        beside a learn's transaction overrides it (sql_records does)."""
        return len(ids)

    def move_learn_mark(self, owner: Owner, thread: str, was: Mark | None, mark: Mark, now: datetime) -> bool:
        """Move the thread's watermark to `mark` only if it is still `was` (None: the thread has none); whether it
        moved. Learning moves it last in its transaction, so that of two learns of a thread read from one
        watermark, one applies. This default reads, then writes: enough where atomic() holds the store's one write
        lock; a backend whose transactions run side by side compares in the write itself (sql_records does)."""
        if self.learn_mark(owner, thread) != was:
            return False
        self.set_learn_mark(owner, thread, mark, now)
        return True

    @abstractmethod
    def messages_after(self, owner: Owner, thread: str, mark: Mark | None, limit: int,
                       now: datetime) -> list[Message]:
        """The thread's live messages after `mark` (every one when None), oldest first, at most `limit`."""

    @abstractmethod
    def add_evidence(self, owner: Owner, rows: Sequence[Evidence]) -> None: ...

    @abstractmethod
    def evidence(self, owner: Owner, kind: str | None, record: str | None) -> list[Evidence]:
        """The evidence of one record (kind and record), or all of the owner's (both None), oldest first."""

    def drop_evidence(self, owner: Owner, kind: str, records: Sequence[str]) -> int:
        """Delete every evidence row of these records of the owner (a learned memory the caller has since written
        itself, which is the caller's from then on); returns how many rows went. Records without evidence are
        skipped: a store that does not implement this still takes repeats of what was never learned."""
        if not any(self.evidence(owner, kind, record) for record in records):
            return 0
        raise StoreError(f"{type(self).__name__} cannot drop evidence: implement drop_evidence")

    def delete_message(self, owner: Owner, message_id: str) -> Erased:
        """Erase one message of the owner, with the evidence rows that cite it (what was learned from it stays).
        Erased.messages is 0 when the owner has no such message."""
        raise StoreError(f"{type(self).__name__} cannot erase one message: implement delete_message")

    @abstractmethod
    def forget_thread(self, owner: Owner, thread: str, cascade: bool,
                      outranks: Callable[[str, str], bool] | None = None) -> Erased:
        """Erase the thread's messages, watermark and evidence; with cascade, also the memories whose every
        evidence row points into the thread, and of the facts whose every evidence row does, the values the thread
        taught (Evidence.set_at): a fact whose current value was taught goes back to what its remaining history
        gives, by time with outranks(new source, held source), or goes when nothing remains."""

    # API keys of the HTTP server (only their hashes are stored)
    @abstractmethod
    def add_key(self, key: ApiKey, secret_hash: str) -> None: ...

    @abstractmethod
    def key_by_hash(self, secret_hash: str) -> ApiKey | None:
        """The live (not revoked) key with this hash."""

    @abstractmethod
    def list_keys(self, tenant: str | None) -> list[ApiKey]: ...

    @abstractmethod
    def api_keys(self) -> list[tuple[ApiKey, str]]:
        """Every key, revoked ones too, with its secret hash: for copying keys between backends."""

    @abstractmethod
    def revoke_key(self, key_id: str, now: datetime) -> bool: ...

    @abstractmethod
    def revoke_tenant_keys(self, tenant: str, now: datetime) -> int:
        """Revoke every live key of the tenant (erasing a tenant); returns how many."""


class AdminStore(ABC):
    """What reads or erases across owners: erasure, purge, the owner list, counts. They cover every table of the
    registry (tables.py)."""

    @abstractmethod
    def erase_user(self, owner: Owner) -> Erased:
        """Remove every trace of the owner: memories, vectors, index entries, facts, history, messages."""

    @abstractmethod
    def erase_tenant(self, tenant: str) -> Erased: ...

    @abstractmethod
    def purge_expired(self, now: datetime) -> Erased: ...

    @abstractmethod
    def owners(self) -> list[Owner]:
        """Every owner with at least one record (for migration between backends)."""

    def page_users(self, tenant: str, after: str | None, limit: int, contains: str | None,
                   now: datetime) -> list[UserSummary]:
        """One page of the tenant's users, by user id ascending, starting after the user id `after` (None: the
        first): every user an export would hold a live record of (tables.listed_user_tables), with the counts
        UserSummary names. contains: only users whose id contains this text, ASCII letters matched in either case
        and every other character as it is (`%` and `_` are plain characters).

        Not abstract, so that a backend written before it still opens and serves everything else; such a backend
        says so here until it implements it."""
        raise StoreError(f"the {type(self).__name__} backend cannot list a tenant's users",
                         "implement Store.page_users in it (memshelf.testing's contract suite tests it), or use "
                         "the sqlite or postgres backend")

    def stats(self) -> dict[str, int]:
        return {}


class Store(MemoryStore, RecordStore, AdminStore):
    """A backend: the three halves above, in transactions. Every method that reads or writes records takes the
    owner and filters by it in the query."""

    @abstractmethod
    def atomic(self) -> AbstractContextManager[None]:
        """A transaction: commits on success, rolls back on any exception, nests with savepoints."""

    @abstractmethod
    def close(self) -> None: ...

    @property
    def scrub_pending(self) -> bool:
        """Whether the text of something erased may still sit in the backend's files (see Erased.scrub_pending)."""
        return False

    def finish_scrub(self, full: bool | None = None) -> bool:
        """Finish the clean-up of past erasures now, as far as the backend can; returns scrub_pending after it.
        full: the backend's thorough kind, where it has one (PostgreSQL: VACUUM FULL)."""
        return self.scrub_pending

    @property
    def quick_reads(self) -> bool:
        """Whether looking up an API key by its hash answers in microseconds, never waiting for a lock or the
        network, so the server may run it on its event loop instead of sending it to a worker thread (a hop that
        costs more than the lookup). False, the default, is always safe."""
        return False

    def reads_aside(self) -> bool:
        """Whether a hybrid search should run its meaning side on another thread beside its keyword side, now: only
        when a read there would see what this thread sees (outside a transaction) and the two reads wait on
        something other than this process's own CPU (a database server), so that running them together pays.
        False, the default, keeps them one after the other, always safe."""
        return False

    def bulk_load(self) -> AbstractContextManager[None]:
        """Wrap a large import (migrate, benchmarks): a backend may defer index builds to the end of the block
        and tidy up afterwards. Reads inside the block stay correct. The default does nothing special."""
        return nullcontext()


# Opening a target (the scheme table, register_store, open_store) lives in stores/registry.py; these names stay
# importable from here, where callers have always found them.
from .registry import StoreFactory, open_store, register_store  # noqa: E402, F401
