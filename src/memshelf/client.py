"""A client for `memshelf serve` with the Shelf's verbs, return types and exceptions: moving an application from
the embedded memshelf to a served one is `Shelf.open(path)` becoming `Client(url, key)`.

    from memshelf import Client, Owner
    memory = Client("http://127.0.0.1:8077", key)          # a tenant key: `memshelf keys create --tenant home`
    memory.remember(Owner("home", "kaleb"), "network", "The office printer is on 192.168.1.40.")

What differs, because the server decides: the tenant of every owner must be the key's (another is InvalidInput,
checked before anything is sent); a server's clock, embedder, sources and extractor are its own; `remember_many`
sends batches of MAX_BATCH, each all or nothing; a server busy or out of reach (503) is retried after its
Retry-After, up to `retries` times, then StoreUnavailable. Lists come page by page with a cursor, as from the Shelf,
or whole through the iterators (`memories`, `export`). AsyncClient runs the same calls in a worker thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from .errors import (ConfigError, Conflict, DimensionMismatch, EmbedderError, EmbedderUnavailable, ExtractorError,
                     ExtractorUnavailable, InvalidInput, MemshelfError, NotFound, StoreError, StoreUnavailable,
                     UnknownSource)
from .learning.base import Plan, Turn
from .model import (MAX_CONTENT_CHARS, MAX_SEARCH_LIMIT, Fact, FactChange, Hit, Memory, Message, Owner, SearchResult,
                    UserSummary)
from .stores.base import ApiKey, Erased, Evidence

__all__ = ["MAX_BATCH", "AsyncClient", "Client"]

MAX_BATCH = 1_000
"""The most memories (or messages) one request of remember_many (or log_messages) carries (the server's batch
limit)."""
REQUEST_BYTES = 1 << 20
"""The largest request body the server takes (1 MiB): a batch is sent in requests under it."""
PAGE = 1_000
"""How many records an iterator asks for at a time."""
SCRUB_PENDING_HEADER = "X-Memshelf-Scrub-Pending"
"""What the server sends with a 204 erasure whose text may linger on disk (server.SCRUB_PENDING_HEADER; not
imported, so a client needs no server extra)."""

_ERRORS: dict[str, type[MemshelfError]] = {
    "unknown_source": UnknownSource, "invalid_input": InvalidInput, "validation_error": InvalidInput,
    "invalid_json": InvalidInput, "conflict": Conflict, "dimension_mismatch": DimensionMismatch,
    "not_found": NotFound, "not_configured": ConfigError, "store_unavailable": StoreUnavailable,
    "store_error": StoreError, "embedder_unavailable": EmbedderUnavailable, "embedder_error": EmbedderError,
    "extractor_unavailable": ExtractorUnavailable, "extractor_error": ExtractorError,
    "unauthorized": ConfigError, "forbidden": ConfigError, "too_large": InvalidInput,
}
"""The exception each error type of the HTTP API is, so a caller catches what it would catch from a Shelf."""

T = TypeVar("T")


def decode(kind: Any, value: Any) -> Any:
    """A JSON value as the type `kind` (a record dataclass, list/tuple of one, X | None, datetime, a plain type)."""
    if value is None:
        return None
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return decode(next(arg for arg in typing.get_args(kind) if arg is not type(None)), value)
    if origin in (list, tuple, Sequence):
        item = typing.get_args(kind)[0]
        items = [decode(item, v) for v in value]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        return dict(value)
    if kind is datetime:
        return datetime.fromisoformat(value)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        known = {f.name for f in dataclasses.fields(kind) if f.init}
        return kind(**{name: decode(hints[name], v) for name, v in value.items() if name in known})
    return value


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def _mapping(kind: str, item: object) -> Mapping[str, Any]:
    if not isinstance(item, Mapping):
        raise InvalidInput(f"each {kind} must be a mapping, got {type(item).__name__}: nothing of it was sent")
    return item


_ROOM = REQUEST_BYTES - 4_096
"""What a batch's items may take of a request: the rest is room for the body's other fields."""


def _batches(kind: str, items: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """items in consecutive batches of at most MAX_BATCH whose JSON stays under REQUEST_BYTES. Every item is made
    and measured before the first request is sent, so an item that is not a mapping (_mapping) or one that no
    request could carry is refused with nothing sent. The size is counted as ASCII-escaped JSON, which is never
    shorter than what is sent."""
    measured = []
    for number, item in enumerate(items, 1):
        length = _json_size(item)
        if length > _ROOM:
            raise InvalidInput(f"{kind} {number} is {length:,} bytes as JSON, more than one request carries "
                               f"({_ROOM:,}) and than the server takes (content is at most {MAX_CONTENT_CHARS:,} "
                               "characters): split its text into several; nothing was sent")
        measured.append(([item], length))
    return _packed(measured)


def whole_groups(groups: Iterable[Sequence[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Consecutive groups of records (an Agents item's messages) packed into lists that each fit one request of
    remember_many or log_messages, so no group is split between two requests; a group too big for one request is a
    list of its own, which the Client then sends in several."""
    return _packed((list(group), sum(map(_json_size, group))) for group in groups)


def _json_size(record: dict[str, Any]) -> int:
    """A record's bytes in a request's list: its ASCII-escaped JSON, never shorter than what is sent, and a comma."""
    return len(json.dumps(record)) + 2


def _packed(groups: Iterable[tuple[list[dict[str, Any]], int]]) -> list[list[dict[str, Any]]]:
    """Groups of records, each with its size as JSON, packed in order into lists of at most MAX_BATCH records and
    _ROOM bytes (a group over either alone is a list of its own)."""
    packed: list[list[dict[str, Any]]] = []
    chunk: list[dict[str, Any]] = []
    size = 0
    for group, length in groups:
        if chunk and (len(chunk) + len(group) > MAX_BATCH or size + length > _ROOM):
            packed.append(chunk)
            chunk, size = [], 0
        chunk += group
        size += length
    if chunk:
        packed.append(chunk)
    return packed


def _segment(value: str) -> str:
    """An id as one path segment: percent-encoded, and a segment of only dots with its dots encoded too, which HTTP
    clients (httpx here) otherwise resolve as "this" or "the parent" folder: forget_thread(owner, "..") was sent as
    DELETE /v1/users/{user}, which erased the whole user, and a user "." read the path's next segment's records."""
    encoded = quote(value, safe="")
    return encoded.replace(".", "%2E") if encoded in (".", "..") else encoded


def _seconds(ttl: float | timedelta | None) -> float | None:
    return ttl.total_seconds() if isinstance(ttl, timedelta) else ttl


class Client:
    """memshelf's HTTP API as a Shelf. `key` is a tenant key; `transport` is for tests (an httpx transport)."""

    max_search_limit = MAX_SEARCH_LIMIT
    """The most hits one search may ask the server for (a Shelf's own search takes up to 1,000)."""

    def __init__(self, url: str, key: str, *, timeout: float = 60.0, retries: int = 3,
                 transport: httpx.BaseTransport | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"the server's URL must start with http:// or https://, got {url!r}: pass where "
                              "`memshelf serve` listens, e.g. http://127.0.0.1:8077")
        self.url = url.rstrip("/")
        self.retries = retries
        self._http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport,
                                  headers={"Authorization": f"Bearer {key}"})
        self._key: ApiKey | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------ transport
    def _request(self, method: str, path: str, *, json_body: Any = None, params: Mapping[str, Any] | None = None,
                 content: bytes | None = None) -> httpx.Response:
        """One call; a 503 is retried after its Retry-After (or a doubling wait), then raised as the error it is."""
        wait = 0.5
        query = {k: v for k, v in (params or {}).items() if v is not None}
        for attempt in range(self.retries + 1):
            try:
                answer = self._http.request(method, path, json=json_body, params=query, content=content)
            except httpx.HTTPError as exc:
                raise StoreUnavailable(f"the memshelf server at {self.url} could not be reached ({exc})",
                                       "check that `memshelf serve` is running there, then retry") from exc
            except UnicodeEncodeError as exc:  # a lone surrogate cannot be sent, as the Shelf cannot store it
                bad = exc.object[exc.start:exc.end]
                raise InvalidInput(f"the request holds text that is not valid Unicode ({bad!r} cannot be "
                                   "encoded): remove the lone surrogate") from None
            if answer.status_code != 503 or attempt == self.retries:
                break
            time.sleep(_retry_after(answer, wait))
            wait *= 2
        if answer.is_error:
            raise _error(answer)
        return answer

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    def _user(self, owner: Owner, rest: str = "") -> str:
        """The path of one of the owner's resources, once the owner's tenant is known to be the key's."""
        if not isinstance(owner, Owner):
            raise InvalidInput(f"owner must be an Owner(tenant, user), got {type(owner).__name__}")
        tenant = self.key().tenant
        if tenant is None:
            raise ConfigError("this client's key is an admin key, which reaches no user's records",
                              "use a key bound to the tenant (`memshelf keys create --tenant NAME`)")
        if owner.tenant != tenant:
            raise InvalidInput(f"this client's key is for tenant {tenant!r}, not {owner.tenant!r}: nothing was "
                               f"sent; use a key of tenant {owner.tenant!r} for its users")
        return f"/v1/users/{_segment(owner.user)}{rest}"

    def _erase(self, path: str, counted: str) -> Erased:
        """DELETE one record (answered 204): one of `counted` erased, and whether its text may linger on disk."""
        answer = self._request("DELETE", path)
        return Erased(**{counted: 1}, scrub_pending=SCRUB_PENDING_HEADER in answer.headers)

    def key(self) -> ApiKey:
        """The key this client sends (asked of the server once): its id, name and tenant."""
        if self._key is None:
            self._key = decode(ApiKey, self._json("GET", "/v1/key"))
        return self._key

    # ------------------------------------------------------------------------------------------------ memories
    def remember(self, owner: Owner, topic: str, content: str, source: str = "stated", *,
                 ttl: float | timedelta | None = None, expires_at: datetime | None = None) -> Memory:
        body = {"topic": topic, "content": content, "source": source, "ttl": _seconds(ttl),
                "expires_at": _iso(expires_at)}
        return decode(Memory, self._json("POST", self._user(owner, "/memories"),
                                          json_body={k: v for k, v in body.items() if v is not None}))

    def remember_many(self, owner: Owner, items: Iterable[Mapping[str, Any]]) -> list[Memory]:
        """Sent in requests of at most MAX_BATCH memories and REQUEST_BYTES, each stored whole or not at all; a
        later request's failure keeps the earlier ones."""
        def fields_of(item: Mapping[str, Any]) -> dict[str, Any]:
            fields = {k: v for k, v in _mapping("memory", item).items() if v is not None}
            if "ttl" in fields:
                fields["ttl"] = _seconds(fields["ttl"])
            if isinstance(fields.get("expires_at"), datetime):
                fields["expires_at"] = _iso(fields["expires_at"])
            return fields

        path, stored = self._user(owner, "/memories/batch"), []
        for batch in _batches("memory", [fields_of(item) for item in items]):
            stored += decode(list[Memory], self._json("POST", path, json_body={"memories": batch}))
        return stored

    def get(self, owner: Owner, memory_id: str) -> Memory:
        return decode(Memory, self._json("GET", self._user(owner, f"/memories/{_segment(memory_id)}")))

    def list_memories(self, owner: Owner, *, limit: int = 50, cursor: str | None = None, topic: str | None = None,
                      source: str | None = None, contains: str | None = None, order: str = "newest",
                      include_superseded: bool = False) -> tuple[list[Memory], str | None]:
        page = self._json("GET", self._user(owner, "/memories"), params={
            "limit": limit, "cursor": cursor, "topic": topic, "source": source, "contains": contains,
            "order": order, "include_superseded": "true" if include_superseded else None})
        return decode(list[Memory], page["items"]), page["next_cursor"]

    def memories(self, owner: Owner, **listing: Any) -> Iterator[Memory]:
        """Every memory list_memories would page through (same filters), fetched a page at a time."""
        cursor = None
        while True:
            page, cursor = self.list_memories(owner, limit=PAGE, cursor=cursor, **listing)
            yield from page
            if cursor is None:
                return

    def confirm(self, owner: Owner, memory_id: str) -> Memory:
        return decode(Memory, self._json("POST", self._user(owner, f"/memories/{_segment(memory_id)}/confirm")))

    def set_expiry(self, owner: Owner, memory_id: str, *, ttl: float | timedelta | None = None,
                   expires_at: datetime | None = None) -> Memory:
        if ttl is not None and expires_at is not None:
            raise InvalidInput("pass expires_at or ttl, not both")
        body = {"ttl": _seconds(ttl)} if ttl is not None else {"expires_at": _iso(expires_at)}
        return decode(Memory, self._json("PATCH", self._user(owner, f"/memories/{_segment(memory_id)}"),
                                          json_body=body))

    def forget(self, owner: Owner, memory_id: str) -> Erased:
        return self._erase(self._user(owner, f"/memories/{_segment(memory_id)}"), "memories")

    # ------------------------------------------------------------------------------------------------ retrieval
    def search(self, owner: Owner, question: str, *, mode: str = "auto", limit: int = 5,
               floor: float | None = None) -> SearchResult:
        body = {"question": question, "mode": mode, "limit": limit} | ({} if floor is None else {"floor": floor})
        found = self._json("POST", self._user(owner, "/search"), json_body=body)
        return SearchResult(decode(list[Hit], found["hits"]), mode=found["mode"], degraded=found["degraded"],
                            reason=found["reason"], unembedded=found.get("unembedded", 0))

    def context(self, owner: Owner, question: str, *, limit: int = 3, mode: str = "auto") -> str:
        body = {"question": question, "limit": limit, "mode": mode}
        return str(self._json("POST", self._user(owner, "/context"), json_body=body)["context"])

    def build_prompt(self, base_prompt: str, owner: Owner, user_text: str, *, limit: int = 3,
                     mode: str = "auto") -> str:
        body = {"base_prompt": base_prompt, "user_text": user_text, "limit": limit, "mode": mode}
        return str(self._json("POST", self._user(owner, "/prompt"), json_body=body)["prompt"])

    # ------------------------------------------------------------------------------------------------ facts
    def set_fact(self, owner: Owner, key: str, value: str, source: str = "stated") -> Fact:
        answer = self._json("PUT", self._user(owner, f"/facts/{_segment(key)}"),
                            json_body={"value": value, "source": source})
        fact: Fact = decode(Fact, answer)
        if answer.get("note"):  # the value given went to history only: say so as the Shelf does
            when = answer.get("outranked_at")
            fact = dataclasses.replace(fact, outranked=FactChange(
                key, value, source, fact.updated_at if when is None else datetime.fromisoformat(when)))
        return fact

    def facts(self, owner: Owner) -> list[Fact]:
        return list(self._pages(self._user(owner, "/facts"), Fact))

    def get_fact(self, owner: Owner, key: str) -> Fact:
        return decode(Fact, self._json("GET", self._user(owner, f"/facts/{_segment(key)}")))

    def fact_history(self, owner: Owner, key: str) -> list[FactChange]:
        """Every value the fact had, oldest first (over HTTP, one key at a time)."""
        return list(self._pages(self._user(owner, f"/facts/{_segment(key)}/history"), FactChange))

    def forget_fact(self, owner: Owner, key: str) -> Erased:
        return self._erase(self._user(owner, f"/facts/{_segment(key)}"), "facts")

    def _pages(self, path: str, kind: type[T], **params: Any) -> Iterator[T]:
        cursor = None
        while True:
            page = self._json("GET", path, params={"limit": PAGE, "cursor": cursor, **params})
            yield from decode(list[kind], page["items"])  # type: ignore[valid-type]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    # ------------------------------------------------------------------------------------------------ messages
    def log_message(self, owner: Owner, thread: str, role: str, content: str, *,
                    ttl: float | timedelta | None = None) -> Message:
        body = {"thread": thread, "role": role, "content": content} | ({} if ttl is None else {"ttl": _seconds(ttl)})
        return decode(Message, self._json("POST", self._user(owner, "/messages"), json_body=body))

    def log_messages(self, owner: Owner, thread: str, turns: Iterable[Mapping[str, Any]], *,
                     ttl: float | timedelta | None = None) -> list[Message]:
        """Sent as remember_many sends: requests of at most MAX_BATCH turns and REQUEST_BYTES, each kept whole or not
        at all, in order."""
        path, logged = self._user(owner, "/messages/batch"), []
        kept = {} if ttl is None else {"ttl": _seconds(ttl)}
        for batch in _batches("turn", [dict(_mapping("turn", turn)) for turn in turns]):
            logged += decode(list[Message], self._json("POST", path, json_body={"thread": thread, "messages": batch,
                                                                               **kept}))
        return logged

    def list_messages(self, owner: Owner, thread: str | None = None, *, limit: int = 50,
                      cursor: str | None = None) -> tuple[list[Message], str | None]:
        page = self._json("GET", self._user(owner, "/messages"),
                          params={"limit": limit, "cursor": cursor, "thread": thread})
        return decode(list[Message], page["items"]), page["next_cursor"]

    def messages(self, owner: Owner, thread: str | None = None, *, limit: int = 50) -> list[Message]:
        """The newest `limit` messages of a thread (or of all), oldest first, as for a prompt."""
        return list(reversed(self.list_messages(owner, thread, limit=limit)[0]))

    def learn(self, owner: Owner, messages: Sequence[Mapping[str, Any] | Turn] | None = None, *,
              thread: str | None = None, extractor: str | None = None, dry_run: bool = False) -> Plan:
        body: dict[str, Any] = {"dry_run": dry_run}
        if messages is not None:
            body["messages"] = [_turn(m) for m in messages]
        if thread is not None:
            body["thread"] = thread
        if extractor is not None:
            body["extractor"] = extractor
        return decode(Plan, self._json("POST", self._user(owner, "/learn"), json_body=body))

    def evidence(self, owner: Owner, *, memory_id: str | None = None, key: str | None = None) -> list[Evidence]:
        found = self._json("GET", self._user(owner, "/evidence"), params={"memory_id": memory_id, "key": key})
        return decode(list[Evidence], found)

    # ------------------------------------------------------------------------------------------------ erasure
    def forget_thread(self, owner: Owner, thread: str, *, cascade: bool = False) -> Erased:
        return decode(Erased, self._json("DELETE", self._user(owner, f"/threads/{_segment(thread)}"),
                                          params={"cascade": "true" if cascade else None}))

    def forget_message(self, owner: Owner, message_id: str) -> Erased:
        return self._erase(self._user(owner, f"/messages/{_segment(message_id)}"), "messages")

    def forget_messages(self, owner: Owner, message_ids: Iterable[str]) -> Erased:
        """One request, all or none (up to MAX_BATCH ids)."""
        if isinstance(message_ids, (str, bytes)):
            raise InvalidInput("message_ids must be a list of message ids, got a string: pass e.g. "
                               "['msg_3f9c0a1b2d4e5f60'], or use forget_message for one")
        ids = list(message_ids)
        if not ids:
            return Erased()  # as the Shelf answers (the endpoint takes one id at least)
        return decode(Erased, self._json("POST", self._user(owner, "/messages/forget"), json_body={"ids": ids}))

    def forget_user(self, owner: Owner) -> Erased:
        return decode(Erased, self._json("DELETE", self._user(owner)))

    def list_users(self, tenant: str, *, limit: int = 50, cursor: str | None = None,
                   contains: str | None = None) -> tuple[list[UserSummary], str | None]:
        self._user(Owner(tenant, "-"))  # the tenant must be the key's
        page = self._json("GET", "/v1/users", params={"limit": limit, "cursor": cursor, "contains": contains})
        return decode(list[UserSummary], page["items"]), page["next_cursor"]

    # ------------------------------------------------------------------------------------------------ export
    def export(self, owner: Owner) -> Iterator[dict[str, Any]]:
        """The owner's records as export() gives them (JSON Lines, read as they arrive)."""
        path = self._user(owner, "/export")
        with self._http.stream("GET", path) as answer:
            if answer.is_error:
                answer.read()
                raise _error(answer)
            for line in answer.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def import_(self, owner: Owner, records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        body = "".join(json.dumps(dict(record), ensure_ascii=False) + "\n" for record in records).encode()
        return dict(self._json("POST", self._user(owner, "/import"), content=body))


def _turn(message: Mapping[str, Any] | Turn) -> dict[str, Any]:
    turn = message if isinstance(message, Turn) else Turn.of(message)
    return {k: v for k, v in (("role", turn.role), ("content", turn.content), ("id", turn.id),
                              ("at", _iso(turn.at))) if v is not None}


def _retry_after(answer: httpx.Response, wait: float) -> float:
    try:
        return min(max(float(answer.headers.get("retry-after", wait)), 0.0), 30.0)
    except ValueError:
        return wait


def _error(answer: httpx.Response) -> MemshelfError:
    """The server's error as the exception a Shelf would raise, with the server's message (what to do included)."""
    try:
        error = answer.json()["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        kind, message = "", f"the server answered HTTP {answer.status_code}: {answer.text[:200]}"
    return _ERRORS.get(kind, StoreError if answer.status_code >= 500 else MemshelfError)(message)


class AsyncClient:
    """The Client's verbs as coroutines (each call runs in a worker thread; the iterators are read whole there).
    `async with AsyncClient(url, key) as memory: await memory.search(owner, "printer")`."""

    def __init__(self, url: str, key: str, **options: Any) -> None:
        self._client = Client(url, key, **options)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._client.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        verb = getattr(Client, name, None)
        if name.startswith("_") or not callable(verb):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

        async def call(*args: Any, **kwargs: Any) -> Any:
            def run() -> Any:
                result = getattr(self._client, name)(*args, **kwargs)
                return list(result) if isinstance(result, Iterator) else result
            return await asyncio.to_thread(run)

        call.__name__, call.__doc__ = name, verb.__doc__
        return call
