"""The records memshelf keeps: owners, memories, facts, messages, hits, and the sources that set confidence."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, UTC
from typing import Literal, TypeVar, get_args
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence

from .errors import ConfigError, InvalidInput, UnknownSource

# Provenance decides confidence; callers never pass a float (spec 000).
BUILTIN_SOURCES: Mapping[str, float] = {"stated": 1.0, "mined": 0.6, "inferred": 0.4}
MAX_CONFIDENCE = 1.0
"""The most any source can be worth: no memory is more confident than what the user said."""

MAX_CONTENT_CHARS = 16_000
"""Longest memory or message text accepted. Split longer documents into statements before remembering them."""
MAX_SEARCH_LIMIT = 100
"""The most hits one search over HTTP asks for (the server's bound, which memshelf.Client keeps too); a Shelf's own
search takes more."""
MAX_TOPIC_CHARS = 200
MAX_ID_CHARS = 200
MAX_FACT_KEY_CHARS = 200
MAX_FACT_VALUE_CHARS = 4_000

Mode = Literal["auto", "keyword", "semantic", "hybrid"]
"""How a search finds memories: by words, by meaning, by both fused, or auto (hybrid when an embedder is set)."""
MODES: tuple[Mode, ...] = get_args(Mode)

MAX_TTL = timedelta(days=100 * 365)
"""Longest ttl accepted (about 100 years). For a record that should never expire, pass no ttl."""
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""Instants outside [EARLIEST, LATEST] are refused: they overflow date arithmetic or do not sort as stored text."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""What no record's text can hold (check_text refuses it): a NUL, or a lone surrogate (no UTF-8 for it)."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def _check_identifier(kind: str, value: object, limit: int = MAX_ID_CHARS) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{kind} must be a string, got {type(value).__name__}: pass a text identifier")
    if not value.strip():
        raise InvalidInput(f"{kind} is empty: pass a non-empty identifier")
    if len(value) > limit:
        raise InvalidInput(f"{kind} is {len(value)} characters long; the limit is {limit}: use a shorter identifier")
    if _CONTROL.search(value):
        raise InvalidInput(f"{kind} contains control characters: use printable text")
    return check_encodable(kind, value)


def check_identifier(kind: str, value: object) -> str:
    """An id the caller chose (a conversation turn's, say): printable text, not blank, at most MAX_ID_CHARS."""
    return _check_identifier(kind, value)


def check_tenant(tenant: object) -> str:
    """A tenant alone (listing its users, erasing it, its keys), checked as an Owner checks its tenant."""
    return _check_identifier("tenant", tenant)


def addressable(kind: str, value: str) -> str:
    """A name that URLs carry as a path segment, or headers as a value (owners, threads, fact keys): no whitespace
    at either end, which HTTP headers and the inspector trim (so "bob " would be "bob" there), and not "." or "..",
    which URLs read as steps in the path (no browser can name such a record, and a request for it reaches the
    record above). Owners are refused when made; threads and fact keys when written."""
    if value != value.strip():
        raise InvalidInput(f"{kind} {value!r} begins or ends with whitespace, which HTTP headers and the inspector "
                           f"trim, so it would name another {kind} there",
                           f"use a name without, such as {value.strip()!r}, which is another {kind}{_stored(kind)}")
    if value in (".", ".."):
        raise InvalidInput(f"{kind} {value!r} is a step in a URL's path ('.' stays, '..' goes up), so no URL names it",
                           f"choose a name with another character in it{_stored(kind)}")
    return value


def _stored(kind: str) -> str:
    """How a name refused now is reached when an older memshelf stored it (said only when refusing: an Owner is
    made on every request)."""
    if kind in ("tenant", "user"):
        return (" (an owner an older memshelf stored so is reached through the Python library: Shelf.list_users, "
                "then Owner.stored(tenant, user))")
    return f" (a {kind} an older memshelf stored so is still read and erased by its name)"


def check_filter(kind: str, value: object, limit: int = MAX_ID_CHARS) -> str | None:
    """Text a filter looks for inside identifiers (None, empty or only spaces: no filter). What no identifier holds
    is refused as an identifier is: control characters, more characters than the longest identifier."""
    if value is None or isinstance(value, str) and not value.strip():
        return None
    return _check_identifier(kind, value, limit)


def check_encodable(kind: str, value: str) -> str:
    """The text itself, if it is valid Unicode: a lone surrogate ("\\ud800") cannot be stored or sent anywhere."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"{kind} contains a lone surrogate {value[exc.start]!r} at position {exc.start}, which is not valid "
            "Unicode: decode the input properly (e.g. bytes.decode('utf-8')) or remove that character"
        ) from None
    return value


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a record belongs to. Every read and write takes one; nothing crosses owners."""

    tenant: str
    user: str

    def __post_init__(self) -> None:
        addressable("tenant", _check_identifier("tenant", self.tenant))
        addressable("user", _check_identifier("user", self.user))

    @classmethod
    def stored(cls, tenant: str, user: str) -> Owner:
        """An owner read back from a store, unchecked: one written before `addressable`'s rules (a user "bob ")
        can still be listed, exported and erased by the Owner its listing returns."""
        owner = object.__new__(cls)
        object.__setattr__(owner, "tenant", tenant)
        object.__setattr__(owner, "user", user)
        return owner

    def __str__(self) -> str:
        return f"{self.tenant}/{self.user}"


class Sources(Mapping[str, float]):
    """The declared sources and the confidence each one is worth."""

    def __init__(self, extra: Mapping[str, float] | None = None) -> None:
        if extra is not None and not isinstance(extra, Mapping):
            raise InvalidInput(f"sources must be a mapping of source name to worth, e.g. {{'sensor': 0.8}}, "
                               f"got {type(extra).__name__}")
        table = dict(BUILTIN_SOURCES)
        for name, worth in (extra or {}).items():
            _check_identifier("source name", name, 64)
            if isinstance(worth, bool) or not isinstance(worth, (int, float)) \
                    or not 0.0 < float(worth) <= MAX_CONFIDENCE:
                raise InvalidInput(f"source {name!r} must be worth a number in (0, 1], got {worth!r}")
            table[name] = float(worth)
        self._table = table

    def confidence(self, source: object) -> float:
        if not isinstance(source, str) or source not in self._table:
            known = ", ".join(f"{k}={v}" for k, v in self._table.items())
            guess = self._near(source)
            hint = f"did you mean {guess!r}? " if guess else ""
            raise UnknownSource(f"unknown source {source!r} ({hint}declared: {known})",
                                f"declare a new source first, e.g. Shelf.open(..., sources={{{source!r}: 0.8}})",
                                fix="source", subject=str(source))
        return self._table[source]

    def _near(self, source: object) -> str | None:
        """The declared source a mistyped one most likely meant ('Stated', 'mind'), if one is close."""
        if not isinstance(source, str):
            return None
        folded = {name.casefold(): name for name in self._table}
        if source.strip().casefold() in folded:
            return folded[source.strip().casefold()]
        close = difflib.get_close_matches(source.casefold(), list(folded), n=1, cutoff=0.75)
        return folded[close[0]] if close else None

    def __getitem__(self, key: str) -> float:
        return self._table[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


SOURCES_EXAMPLE = "imported=0.7,crm=0.5"


def sources_from_text(text: str, where: str) -> dict[str, float]:
    """Sources declared as text, NAME=WORTH pairs separated by commas (SOURCES_EXAMPLE), as MEMSHELF_SOURCES and
    the faces' --sources options take them; `where` names the setting in errors. Empty text declares none."""
    fix = f"write NAME=WORTH pairs separated by commas, with WORTH in (0, 1], e.g. {SOURCES_EXAMPLE}"
    declared: dict[str, float] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        name, equals, worth = (part.strip() for part in pair.partition("="))
        if not equals or not name:
            raise ConfigError(f"{where}: {pair!r} is not NAME=WORTH", fix)
        if name in declared:
            raise ConfigError(f"{where}: source {name!r} is declared twice", "declare each source once")
        try:
            declared[name] = float(worth)
        except ValueError:
            raise ConfigError(f"{where}: the worth of {name!r} is {worth!r}, not a number", fix) from None
    try:
        Sources(declared)
    except InvalidInput as exc:
        raise ConfigError(f"{where}: {exc}", fix) from None
    return declared


@dataclass(frozen=True, slots=True)
class Memory:
    """A statement about a topic, with its provenance (spec 000)."""

    id: str
    topic: str
    content: str
    source: str
    confidence: float
    created_at: datetime
    expires_at: datetime | None = None
    last_seen: datetime | None = None
    observations: int = 1
    embed_model: str | None = None
    superseded_at: datetime | None = None  # when a newer memory replaced it (it keeps its text; searches skip it)
    superseded_by: str | None = None  # the id of that newer memory
    confirmed_at: datetime | None = None  # when the user vouched for it (Shelf.confirm), making it stated
    confirmed_from: str | None = None  # the source it had before that


@dataclass(frozen=True, slots=True)
class Fact:
    """Keyed state: one current value per (owner, key)."""

    key: str
    value: str
    source: str
    updated_at: datetime
    outranked: FactChange | None = field(default=None, compare=False)
    """Set only on what set_fact returns when the value just given came from a weaker source than the current
    one: that value went to the fact's history, and this (unchanged) value stays current."""

    @property
    def note(self) -> str | None:
        """What set_fact did when it did not replace the current value, in words an interface can show."""
        if self.outranked is None:
            return None
        return (f"kept the {self.source} value {self.value!r}; the {self.outranked.source} value "
                f"{self.outranked.value!r} is in the fact's history (set it from a source at least as strong "
                "to replace it)")


@dataclass(frozen=True, slots=True)
class FactChange:
    """One entry of a fact's audit trail: the value it had, and when it was set."""

    key: str
    value: str
    source: str
    set_at: datetime


_Row = TypeVar("_Row", bound=Hashable)


def missing_changes(wanted: Sequence[_Row], present: Sequence[_Row]) -> list[_Row]:
    """The fact changes of `wanted` that `present` lacks (a multiset difference, in wanted's order). History has no
    ids: a change is its (key, value, source, set_at), so a second import or a resumed migration adds none twice.
    Evidence rows (stores.base.Evidence) are compared the same way."""
    have = Counter(present)
    missing = []
    for change in wanted:
        if have[change]:
            have[change] -= 1
        else:
            missing.append(change)
    return missing


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of a conversation thread."""

    id: str
    thread: str
    role: str
    content: str
    created_at: datetime
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class UserSummary:
    """One of a tenant's users and how many live records they have: current memories (neither expired nor
    superseded), facts, and messages not expired."""

    user: str
    memories: int
    facts: int
    messages: int
    newest_at: datetime | None = None  # when the newest of those records was written; None when none is live


@dataclass(frozen=True, slots=True)
class Hit:
    """A memory found by a search, with the score the retriever gave it and which retriever that was."""

    memory: Memory
    score: float
    retriever: str  # "keyword", "semantic" or "hybrid" (found by both)
    details: Mapping[str, float] = field(default_factory=dict)  # each retriever's rank and raw score


class SearchResult(list[Hit]):
    """The hits of one search, best first. `degraded` is True when meaning search was wanted but unavailable.
    `unembedded` counts the owner's memories a search by meaning alone could not see, having no vector of the
    embedder's model yet (counted only when it found fewer than asked): backfill gives them one."""

    def __init__(self, hits: list[Hit] = (), *, mode: str = "keyword", degraded: bool = False,  # type: ignore[assignment]
                 reason: str | None = None, unembedded: int = 0) -> None:
        super().__init__(hits)
        self.mode = mode
        self.degraded = degraded
        self.reason = reason
        self.unembedded = unembedded


@dataclass(slots=True)
class NewMemory:
    """A memory about to be stored: validated, with its confidence resolved from its source."""

    topic: str
    content: str
    source: str
    confidence: float
    expires_at: datetime | None
    vector: bytes | None = None
    embed_model: str | None = None
    created_at: datetime = field(default_factory=utcnow)
    pieces: list[bytes] = field(default_factory=list)
    """The vectors of a long text's later pieces, of embed_model (`vector` is its first piece's)."""


_EMPTY_ADVICE = {"question": "pass the words to search for", "fact key": "pass a name such as 'user_name'",
                 "thread": "pass a name such as 'kitchen'", "role": "pass who spoke, such as user or assistant",
                 "key name": "pass a label such as 'ci', or none"}
_LONG_ADVICE = {"question": "ask a shorter question", "fact key": "use a shorter key", "thread": "use a shorter name",
                "user_text": "pass the user's latest message, not the whole conversation",
                "fact value": "keep one short current value (a long text belongs in a memory, split into statements)",
                "role": "use a short role such as user or assistant", "key name": "use a shorter label",
                "topic": "use a short label such as 'network'"}
"""What to do about an empty or too long text, by what it is; other texts are stored, and split."""


def check_text(kind: str, value: object, limit: int = MAX_CONTENT_CHARS) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{kind} must be a string, got {type(value).__name__}: pass the text itself (str)")
    if not value.strip():
        raise InvalidInput(f"{kind} is empty or only whitespace", _EMPTY_ADVICE.get(kind, "pass the text to store"))
    if len(value) > limit:
        raise InvalidInput(f"{kind} is {len(value):,} characters; the limit is {limit:,}",
                           _LONG_ADVICE.get(kind, "split it into shorter statements"))
    if "\x00" in value:
        raise InvalidInput(f"{kind} contains a NUL character: remove it")
    return check_encodable(kind, value)


_SINGULAR = {"memories": "memory", "evidence": "evidence"}


def check_name(kind: str, value: object, limit: int) -> str:
    """A thread or fact key being written: check_text's rules and addressable's."""
    return addressable(kind, check_text(kind, value, limit))


def counted(number: int, plural: str) -> str:
    """'1 memory', '2 memories': a count with its noun (given in the plural, as record kinds are named)."""
    if number != 1:
        return f"{number:,} {plural}"
    return f"1 {_SINGULAR.get(plural, plural.removesuffix('s'))}"


def check_topic(topic: object) -> str:
    if not isinstance(topic, str):
        raise InvalidInput(f"topic must be a string, got {type(topic).__name__}: pass a short label such as 'network'")
    return check_text("topic", topic, MAX_TOPIC_CHARS)


ROLES = ("user", "assistant", "system", "developer", "tool")
"""Who said a conversation turn, in the chat APIs' words. Only "user" turns say anything about the user (learning
reads the rest as context); the others are kept so a thread reads back as it was held."""


def check_role(role: object) -> str:
    """The role in its canonical spelling ('User ' is 'user'); any other word is refused, naming the roles."""
    if not isinstance(role, str):
        raise InvalidInput(f"role must be a string, one of {', '.join(ROLES)}; got {type(role).__name__}")
    canonical = role.strip().lower()
    if canonical not in ROLES:
        raise InvalidInput(f"role {role!r} is not one of {', '.join(ROLES)}: the person's turns are 'user', the "
                           "model's 'assistant', instructions 'system' or 'developer', tool output 'tool'")
    return canonical


def check_when(kind: str, value: object) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidInput(f"{kind} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(
            f"{kind} is a naive datetime: pass an aware one, e.g. datetime.now(timezone.utc) + timedelta(days=7)"
        )
    if not EARLIEST <= value <= LATEST:  # compared before converting: astimezone overflows near years 1 and 9999
        raise InvalidInput(f"{kind} {value.isoformat()} is out of range: pass an instant between "
                           f"{EARLIEST.date()} and {LATEST.date()} (UTC)")
    return value.astimezone(UTC)


def check_ttl(kind: str, ttl: object) -> timedelta:
    """A time to live (seconds, or a timedelta) as a timedelta: more than 0 and at most MAX_TTL."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float, timedelta)):
        raise InvalidInput(f"{kind} must be seconds (a number) or a timedelta, got {type(ttl).__name__}")
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if not seconds > 0:  # NaN too
        raise InvalidInput(f"{kind} must be a positive number of seconds, got {ttl!r}: pass e.g. 86400 for a day, "
                           "or no ttl for a record that never expires")
    if seconds > MAX_TTL.total_seconds():  # a huge int is compared as it is: float() of it would overflow
        raise InvalidInput(f"{kind} {ttl!r} is over the limit of {MAX_TTL.total_seconds():,.0f} seconds "
                           f"({MAX_TTL.days:,} days): pass a shorter ttl, or no ttl for a record that never expires")
    kept = timedelta(seconds=seconds)
    if not kept:  # under a microsecond: the record would expire the instant it was made
        raise InvalidInput(f"{kind} {ttl!r} is shorter than a microsecond, the finest time memshelf keeps: pass a "
                           "longer ttl, or no ttl for a record that never expires")
    return kept


def resolve_expiry(expires_at: object, ttl: object, now: datetime) -> datetime | None:
    """Turn expires_at (an aware datetime) or ttl (seconds from now) into one UTC instant, or None."""
    if expires_at is not None and ttl is not None:
        raise InvalidInput("pass expires_at or ttl, not both")
    if ttl is not None:
        return now + check_ttl("ttl", ttl)
    if expires_at is not None:
        when = check_when("expires_at", expires_at)
        if when <= now:
            raise InvalidInput(f"expires_at {when.isoformat()} has already passed: pass a future instant, "
                               "or leave it out to keep the record")
        return when
    return None
