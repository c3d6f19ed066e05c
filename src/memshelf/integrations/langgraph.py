"""A LangGraph store whose items are memshelf memories (`pip install memshelf[langgraph]`).

    from langgraph.graph import StateGraph
    from memshelf import Shelf
    from memshelf.integrations.langgraph import ShelfStore

    store = ShelfStore(Shelf.open("memory.db"), index={"fields": ["content"]})
    store.put(("home", "kaleb", "food"), "likes", {"content": "Kaleb likes pizza."})
    store.search(("home", "kaleb"), query="what does Kaleb eat?")
    graph = StateGraph(...).compile(store=store)

Namespaces map to owners: (tenant, user, *path). The first two labels are the owner, so memshelf's owner
isolation, expiry, erasure (forget_user, forget_tenant) and export hold for every item; the rest is a path inside
the user's memories, possibly empty (LangMem's ("memories", "{langgraph_user_id}") is tenant "memories" and
that user). Every call names one owner: a namespace or prefix of fewer than two labels is refused, except that
list_namespaces may name only the tenant (it then lists that tenant's users).

An item is one memory of its owner. Its content is the item as JSON, {"p": path, "k": key, "v": value} (and "t",
its ttl, when it has one: one-letter names, which are no search terms, so they match no question), so memshelf's
keyword search reads the whole value; its topic is the path and key
joined with periods, which LangGraph forbids inside labels (shortened with a hash when that is no topic: past
200 characters, or with control characters). Its meaning is the text at the index fields (LangGraph's `index`
config, `fields` only: the shelf's own embedder embeds, so `embed` and `dims` are refused), embedded by the
shelf's embedder; "$" (the default) is the whole value. A put with `index=False` gets no vector of its fields,
and memshelf then embeds its JSON, as it does for any memory.

- put replaces the item: the new memory is written, then the old one is erased (put of the same value again
  counts as another observation of the same memory). created_at is the latest put's, as in InMemoryStore.
- search(query=...) is memshelf's search (keyword and meaning fused, relevance gated by the shelf's floor), so
  it returns what is relevant, up to `limit`, not every item ranked. Without a query, items come newest put first.
- filter compares value fields as LangGraph's stores do: equality, nested mappings, and $eq, $ne, $gt, $gte,
  $lt, $lte.
- TTL is in minutes, as LangGraph counts it; expired items are gone from every read at once. With refresh_ttl
  (the default), a get or search that returns an item starts its ttl again.
- The shelf may be a Shelf or a memshelf.Client. Through a Client the fields' vector is not made here (the client
  has no embedder): the server embeds the item's JSON, as it does any memory.
- Operations of a batch run in the order given. Unqueried search and list_namespaces read the owner's memories
  (in pages), so they cost time in proportion to how many the owner has.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from langgraph.store.base import (BaseStore, GetOp, IndexConfig, InvalidNamespaceError, Item, ListNamespacesOp,
                                  MatchCondition, Op, PutOp, Result, SearchItem, SearchOp, TTLConfig, get_text_at_path,
                                  tokenize_path)

from ..embedders.base import embedded, embedding_deadline, write_timeout
from ..errors import EmbedderUnavailable, InvalidInput, NotFound
from ..model import MAX_CONTENT_CHARS, MAX_TOPIC_CHARS, Memory, Owner

__all__ = ["ShelfStore"]

PAGE = 1_000
"""Memories read per page when a call reads all of an owner's items."""
MOST_HITS = 1_000
"""The most hits one search asks memshelf for (Shelf.search's own limit)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_OPERATORS = {"$eq": lambda a, b: a == b, "$ne": lambda a, b: a != b,
              "$gt": lambda a, b: float(a) > float(b), "$gte": lambda a, b: float(a) >= float(b),
              "$lt": lambda a, b: float(a) < float(b), "$lte": lambda a, b: float(a) <= float(b)}


@dataclass(frozen=True, slots=True)
class _Stored:
    """An item as its memory holds it."""

    memory: Memory
    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    ttl: float | None

    @property
    def updated_at(self) -> datetime:
        """When the item was last put (putting the same value again is another observation of its memory)."""
        return max(self.memory.created_at, self.memory.last_seen or self.memory.created_at)

    def item(self, score: float | None = None, searched: bool = False) -> Item:
        created, updated = self.memory.created_at, self.updated_at
        if searched:
            return SearchItem(self.namespace, self.key, self.value, created, updated, score)
        return Item(value=self.value, key=self.key, namespace=self.namespace, created_at=created, updated_at=updated)


class ShelfStore(BaseStore):
    """LangGraph's BaseStore over a memshelf Shelf: each namespace (tenant, user, *path) is that owner's."""

    supports_ttl = True

    def __init__(self, shelf: Any, *, index: IndexConfig | None = None, ttl: TTLConfig | None = None) -> None:
        self.shelf = shelf
        self.ttl_config = ttl
        config: dict[str, Any] = dict(index or {})
        refused = sorted(set(config) - {"fields"})
        if refused:
            raise InvalidInput(f"ShelfStore's index config takes only 'fields', not {refused}",
                               "leave out embed and dims: the shelf's embedder embeds (Shelf.open(..., embedder=...))")
        fields = config.get("fields") or ["$"]
        if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
            raise InvalidInput(f"index fields must be a list of paths such as ['content'], got {fields!r}")
        self.fields = list(fields)

    # ---------------------------------------------------------------- BaseStore
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        results: list[Result] = []
        for op in ops:
            _check_labels(op)
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            else:
                raise InvalidInput(f"unknown store operation {type(op).__name__}",
                                   "use GetOp, SearchOp, PutOp or ListNamespacesOp")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """batch in a worker thread, so the event loop never waits on the database."""
        return await asyncio.to_thread(self.batch, list(ops))

    # ---------------------------------------------------------------- operations
    def _get(self, op: GetOp) -> Item | None:
        owner, path = _owner_of(op.namespace)
        found = self._find(owner, path, op.key)
        if found is None:
            return None
        return self._refreshed(owner, found, op.refresh_ttl).item()

    def _put(self, op: PutOp) -> None:
        owner, path = _owner_of(op.namespace)
        old = self._all_of(owner, path, op.key)
        if op.value is None:
            for stored in old:
                self._erase(owner, stored.memory.id)
            return
        if not isinstance(op.value, Mapping):
            raise InvalidInput(f"an item's value must be a mapping (a JSON object), got {type(op.value).__name__}")
        value = dict(op.value)
        ttl = None if op.ttl is None else _check_ttl(op.ttl)
        envelope: dict[str, Any] = {"p": list(path), "k": op.key, "v": value}
        if ttl is not None:
            envelope["t"] = ttl
        try:
            content = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"an item's value must be JSON-serialisable: {exc}",
                               "store strings, numbers, booleans, None, lists and mappings") from None
        if len(content) > MAX_CONTENT_CHARS:
            raise InvalidInput(f"the item {op.key!r} is {len(content):,} characters as JSON (path and key included); "
                               f"a memory holds at most {MAX_CONTENT_CHARS:,}",
                               "split the value into several items, or keep large documents elsewhere and store a "
                               "summary with a reference")
        record: dict[str, Any] = {"topic": _topic_of(path, op.key), "content": content}
        if ttl is not None:
            record["ttl"] = timedelta(minutes=ttl)
        vector = self._vector_of(value, op.index)
        if vector is not None:
            record["vector"] = vector
        written = self.shelf.remember_many(owner, [record])[0]
        for stored in old:
            if stored.memory.id != written.id:
                self._erase(owner, stored.memory.id)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        owner, path = _owner_of(op.namespace_prefix, prefix=True)
        offset, limit = _check_window(op.offset, op.limit)
        wanted = offset + limit

        def keep(stored: _Stored) -> bool:
            return stored.namespace[2:][:len(path)] == path and _matches(stored.value, op.filter or {})

        if op.query:
            most = getattr(self.shelf, "max_search_limit", MOST_HITS)  # a Client's server takes fewer
            if wanted > most:  # it could only answer fewer than asked, and would not say so
                raise InvalidInput(f"a search with a query reaches at most {most} items here, and offset + limit is "
                                   f"{wanted}: ask for fewer, or page without a query")
            asked = min(most, max(50, 4 * wanted))
            while True:
                hits = self.shelf.search(owner, op.query, limit=asked)
                found = [(stored, hit.score) for hit in hits
                         if (stored := _decode(hit.memory, owner)) is not None and keep(stored)]
                if len(found) >= wanted or len(hits) < asked or asked == most:
                    break
                asked = min(most, asked * 4)
            chosen = found[offset:wanted]
        else:
            items = sorted((s for s in self._owner_items(owner) if keep(s)),
                           key=lambda s: (s.updated_at, s.memory.created_at), reverse=True)
            chosen = [(stored, None) for stored in items[offset:wanted]]
        return [self._refreshed(owner, stored, op.refresh_ttl).item(score, searched=True)  # type: ignore[misc]
                for stored, score in chosen]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        offset, limit = _check_window(op.offset, op.limit)
        if op.max_depth is not None and (isinstance(op.max_depth, bool) or not isinstance(op.max_depth, int)
                                         or op.max_depth < 1):
            raise InvalidInput(f"max_depth must be a whole number of at least 1, got {op.max_depth!r}")
        conditions = list(op.match_conditions or ())
        namespaces = {stored.namespace for owner in self._owners_in(conditions)
                      for stored in self._owner_items(owner)}
        matching = [ns for ns in namespaces if all(_namespace_matches(c, ns) for c in conditions)]
        if op.max_depth is not None:
            matching = [ns[:op.max_depth] for ns in matching]
        return sorted(set(matching))[offset:offset + limit]

    # ---------------------------------------------------------------- helpers
    def _find(self, owner: Owner, path: tuple[str, ...], key: str) -> _Stored | None:
        """The item at (path, key): the newest memory of it (two exist only if a put stopped half-way)."""
        found = self._all_of(owner, path, key)
        return max(found, key=lambda s: s.memory.created_at) if found else None

    def _all_of(self, owner: Owner, path: tuple[str, ...], key: str) -> list[_Stored]:
        if not isinstance(key, str) or not key:
            raise InvalidInput(f"an item's key must be a non-empty string, got {key!r}")
        topic = _topic_of(path, key)
        return [stored for memory in self._memories(owner, topic)
                if (stored := _decode(memory, owner)) is not None and stored.namespace[2:] == path
                and stored.key == key]

    def _owner_items(self, owner: Owner) -> Iterator[_Stored]:
        for memory in self._memories(owner, None):
            if (stored := _decode(memory, owner)) is not None:
                yield stored

    def _memories(self, owner: Owner, topic: str | None) -> Iterator[Memory]:
        cursor: str | None = None
        while True:
            page, cursor = self.shelf.list_memories(owner, limit=PAGE, cursor=cursor, topic=topic)
            yield from page
            if cursor is None:
                return

    def _owners_in(self, conditions: Sequence[MatchCondition]) -> list[Owner]:
        """The owners a namespace listing may name: those its first prefix condition fixes (a tenant, or a tenant
        and a user)."""
        prefix = next((tuple(c.path) for c in conditions if c.match_type == "prefix"), ())
        if not prefix or prefix[0] == "*":
            raise InvalidInput("list_namespaces names no tenant: memshelf lists one tenant's namespaces at a time",
                               "pass prefix=(tenant,) or prefix=(tenant, user, ...)")
        tenant = prefix[0]
        if len(prefix) > 1 and prefix[1] != "*":
            return [Owner(tenant, prefix[1])]
        owners, cursor = [], None
        while True:
            page, cursor = self.shelf.list_users(tenant, limit=PAGE, cursor=cursor)
            owners += [Owner.stored(tenant, summary.user) for summary in page]
            if cursor is None:
                return owners

    def _refreshed(self, owner: Owner, stored: _Stored, refresh: bool) -> _Stored:
        """The item with its ttl started again, when it has one and the read asked for that."""
        if not refresh or stored.ttl is None:
            return stored
        try:
            memory = self.shelf.set_expiry(owner, stored.memory.id, ttl=timedelta(minutes=stored.ttl))
        except NotFound:  # erased or expired since it was read: the read still returns what it saw
            return stored
        return _Stored(memory, stored.namespace, stored.key, stored.value, stored.ttl)

    def _erase(self, owner: Owner, memory_id: str) -> None:
        try:
            self.shelf.forget(owner, memory_id)
        except NotFound:  # erased or expired meanwhile: the end is the same
            pass

    def _vector_of(self, value: dict[str, Any], index: Any) -> list[float] | None:
        """The vector of the value's index fields, made by the shelf's embedder; None when there is no embedder,
        no text at the fields, index=False, or the embedder is unavailable (the memory is then embedded by
        memshelf later, as any memory written while the service is down)."""
        embedder = getattr(self.shelf, "embedder", None)
        if embedder is None or index is False:
            return None
        if index is not None and (isinstance(index, str) or not all(isinstance(f, str) for f in index)):
            raise InvalidInput(f"index must be False, None or a list of field paths, got {index!r}")
        texts = [text for field in (self.fields if index is None else index)
                 for text in get_text_at_path(value, "$" if field == "$" else tokenize_path(field))]
        text = "\n".join(t for t in texts if t.strip())
        if not text:
            return None
        try:
            with embedding_deadline(write_timeout()):
                return [float(x) for x in embedded(embedder, [text])[0]]
        except EmbedderUnavailable:
            return None


def _owner_of(namespace: Sequence[str], prefix: bool = False) -> tuple[Owner, tuple[str, ...]]:
    """The owner a namespace names (its first two labels) and the path inside that owner's memories."""
    namespace = tuple(namespace)
    if len(namespace) < 2 or "*" in namespace[:2] and prefix:
        which = "namespace_prefix" if prefix else "namespace"
        raise InvalidInput(f"{which} {namespace!r} names no user: memshelf keeps each item for one owner",
                           "begin the namespace with the tenant and the user, e.g. ('acme', 'kaleb', 'notes')")
    return Owner(namespace[0], namespace[1]), namespace[2:]


def _check_labels(op: Op) -> None:
    """LangGraph's rules for labels, also for ops given to batch directly (BaseStore's methods check before)."""
    if isinstance(op, (GetOp, PutOp)):
        labels: Sequence[str] = op.namespace
    elif isinstance(op, SearchOp):
        labels = op.namespace_prefix
    elif isinstance(op, ListNamespacesOp):
        labels = [label for condition in op.match_conditions or () for label in condition.path]
    else:
        return
    for label in labels:
        if not isinstance(label, str) or not label or "." in label or "\x00" in label:
            raise InvalidNamespaceError(f"namespace label {label!r} is not allowed: labels are non-empty strings "
                                        "without periods or NUL characters")


def _topic_of(path: tuple[str, ...], key: str) -> str:
    """The topic an item's memory is filed under: path and key joined with periods, or, where that is no topic,
    a shortened form ending in a hash of both (the JSON content, not the topic, says which item it is)."""
    topic = ".".join((*path, key))
    if topic.strip() and len(topic) <= MAX_TOPIC_CHARS and not _CONTROL.search(topic):
        return topic
    digest = hashlib.sha256(json.dumps([*path, key], ensure_ascii=False).encode("utf-8", "surrogatepass"))
    readable = _CONTROL.sub("", ".".join(path))[:MAX_TOPIC_CHARS - 34]
    return f"{readable}~{digest.hexdigest()[:32]}" if readable.strip() else f"item~{digest.hexdigest()[:32]}"


def _decode(memory: Memory, owner: Owner) -> _Stored | None:
    """The item a memory holds, or None when the memory was not written by a ShelfStore."""
    if not memory.content.startswith('{"p":'):
        return None
    try:
        envelope = json.loads(memory.content)
    except ValueError:
        return None
    path, key, value = envelope.get("p"), envelope.get("k"), envelope.get("v")
    if not (isinstance(path, list) and all(isinstance(p, str) for p in path) and isinstance(key, str)
            and isinstance(value, dict)):
        return None
    ttl = envelope.get("t")
    return _Stored(memory, (owner.tenant, owner.user, *path), key, value,
                   float(ttl) if isinstance(ttl, (int, float)) else None)


def _check_ttl(ttl: object) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise InvalidInput(f"ttl must be a positive number of minutes, got {ttl!r}",
                           "pass ttl=None (or leave it out) for an item that never expires")
    return float(ttl)


def _check_window(offset: object, limit: object) -> tuple[int, int]:
    for name, number, least in (("offset", offset, 0), ("limit", limit, 1)):
        if isinstance(number, bool) or not isinstance(number, int) or number < least:
            raise InvalidInput(f"{name} must be a whole number of at least {least}, got {number!r}")
    return offset, limit  # type: ignore[return-value]


def _matches(value: Any, wanted: Mapping[str, Any]) -> bool:
    """Whether a value has every field of a filter, compared as LangGraph's stores compare JSON."""
    return all(_equal(value.get(field) if isinstance(value, dict) else None, expected)
               for field, expected in wanted.items())


def _equal(actual: Any, expected: Any) -> bool:
    if isinstance(expected, dict):
        if any(k.startswith("$") for k in expected):
            return all(_compare(actual, operator, operand) for operator, operand in expected.items())
        return isinstance(actual, dict) and _matches(actual, expected)
    if isinstance(expected, (list, tuple)):
        return (isinstance(actual, (list, tuple)) and len(actual) == len(expected)
                and all(_equal(a, e) for a, e in zip(actual, expected)))
    return bool(actual == expected)


def _compare(actual: Any, operator: str, operand: Any) -> bool:
    if operator not in _OPERATORS:
        raise InvalidInput(f"unknown filter operator {operator!r}: use one of {', '.join(_OPERATORS)}")
    try:
        return bool(_OPERATORS[operator](actual, operand))
    except (TypeError, ValueError):  # a field that is missing or not a number is not greater than anything
        return False


def _namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path))
    else:
        raise InvalidInput(f"unknown match type {condition.match_type!r}: use 'prefix' or 'suffix'")
    return all(want == "*" or have == want for have, want in pairs)

