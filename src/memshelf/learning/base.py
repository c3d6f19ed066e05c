"""The extractor protocol, its records (Turn in, Proposal out) and the registry every extractor registers with.

An extractor reads new conversation turns, plus what the owner already knows, and proposes what to remember; it
writes nothing. The Shelf decides which proposals to apply (learning/_decide.py; README, "Learning").
Extractors are found like embedders: registered in code with `register_extractor`, or declared by a distribution
in the `memshelf.extractors` entry point group (memshelf's own `rules` is declared that way).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, get_args

from .._plugins import Availability, PluginGroup, availability, Requirements, accepting, find_provider, provider_names
from ..errors import ExtractorError, InvalidInput
from ..model import check_identifier, check_when

Op = Literal["remember", "set_fact", "supersede", "skip"]
OPS: tuple[Op, ...] = get_args(Op)

DEFAULT_EXTRACTOR = "rules"


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of the conversation, as an extractor reads it."""

    role: str  # "user", "assistant", "tool", "system": only the user's own turns say anything about the user
    content: str
    id: str | None = None  # the logged message's id, which becomes a proposal's evidence
    at: datetime | None = None  # when it was said

    @classmethod
    def of(cls, value: Turn | Mapping[str, object]) -> Turn:
        """A Turn from itself or from a mapping like {"role": "user", "content": "...", "id": "m1", "at": when}."""
        if isinstance(value, Turn):
            return value
        role, content = value.get("role"), value.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise ExtractorError(f"a turn needs a string 'role' and 'content', like {{'role': 'user', 'content': "
                                 f"'I live in Lisbon.'}}; got keys {sorted(value)}")
        ident, at = value.get("id"), value.get("at")
        if isinstance(ident, int) and not isinstance(ident, bool):
            ident = str(ident)
        return cls(role.strip().lower(), content, None if ident is None else check_identifier("a turn's 'id'", ident),
                   None if at is None else _instant(at))


def _instant(at: object) -> datetime:
    """A turn's 'at': an aware datetime, or the ISO 8601 text of one (as JSON and the CLI give it)."""
    if not isinstance(at, str):
        return check_when("a turn's 'at'", at)
    try:
        parsed = datetime.fromisoformat(at)
    except ValueError:
        raise InvalidInput(f"a turn's 'at' {at[:40]!r} is not an ISO 8601 time: give one with a time zone, "
                           "e.g. 2026-05-20T10:00:00+00:00") from None
    return check_when("a turn's 'at'", parsed)


@dataclass(frozen=True, slots=True)
class Known:
    """What the owner already knows, so an extractor can skip what is not news: current facts by key, and the
    contents of related memories with their ids in the same order (`memory_ids`, which a supersede proposal names
    in `replaces`; empty when the caller gave texts only)."""

    facts: Mapping[str, str] = field(default_factory=dict)
    memories: tuple[str, ...] = ()
    memory_ids: tuple[str, ...] = ()
    fact_sources: Mapping[str, str] = field(default_factory=dict)
    """Each current fact's source, by key: a value said again from another source is news (a guess the user now
    states becomes stated), the same value from the same source is not."""
    memory_sources: tuple[str, ...] = ()
    """Each related memory's source, in the order of `memories` (empty when the caller gave texts only)."""


@dataclass(frozen=True, slots=True)
class Proposal:
    """One thing an extractor proposes; the Shelf decides whether to apply it and says why on the proposal.

    op: "remember" a memory (topic, content), "set_fact" (key, value), "supersede" the memory `replaces` with a
        new one (topic, content), or "skip" (nothing to write, with the reason).
    source: the provenance that sets confidence: "stated" (the user asked), "mined" (a rule found it), "inferred".
    evidence: the ids of the messages it comes from.
    """

    op: Op
    source: str
    evidence: tuple[str, ...] = ()
    topic: str | None = None
    content: str | None = None
    key: str | None = None
    value: str | None = None
    replaces: str | None = None
    reason: str = ""
    record: str | None = None  # set by the Shelf when applied: the id of the memory written, or the fact's key
    at: datetime | None = None  # when its newest evidence was said, filled in by the Shelf from the messages

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ExtractorError(f"a proposal's op must be one of {', '.join(OPS)}; got {self.op!r}")


@dataclass(frozen=True, slots=True)
class Usage:
    """What one `propose` call cost: model calls made, tokens read and written (None when the service does not
    say), and wall time in milliseconds. An extractor without a model reports zero calls."""

    calls: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Plan:
    """What one `Shelf.learn` call read, proposed and decided.

    proposals: every proposal with the Shelf's decision on it: `op` is what was (or, in a dry run, would be) done
        ("skip" when the Shelf refused, with the reason why), `record` the memory id or fact key it wrote.
    messages: the ids of the logged messages read (empty for turns passed in directly).
    watermark: the id of the last message now learned in the thread (unchanged in a dry run or on failure).
    usage: what the extractor reported (model calls, tokens, its latency); latency_ms is the whole call's.
    more: the thread has more unlearned messages than one call reads (MAX_TURNS): they wait for the next call.
    """

    owner: str
    thread: str | None
    extractor: str
    dry_run: bool
    proposals: tuple[Proposal, ...] = ()
    messages: tuple[str, ...] = ()
    watermark: str | None = None
    usage: Usage | None = None
    latency_ms: float = 0.0
    more: bool = False

    @property
    def applied(self) -> tuple[Proposal, ...]:
        """The proposals that write something (in a dry run: that would)."""
        return tuple(p for p in self.proposals if p.op != "skip")

    @property
    def skipped(self) -> tuple[Proposal, ...]:
        return tuple(p for p in self.proposals if p.op == "skip")


class Extractor(ABC):
    """Turns conversation turns into proposals. One required method, `propose`; it never writes.

    After each call `usage` says what it cost (model calls, tokens); the Shelf copies it into the plan."""

    name: str = "extractor"
    usage: Usage | None = None

    @abstractmethod
    def propose(self, turns: Sequence[Turn], known: Known | None = None) -> list[Proposal]:
        """The proposals the turns support, in the order they were said. Raise ExtractorError when the extractor
        cannot answer (a model service down, a reply that fails validation twice): nothing is then written."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


Factory = Callable[[str | None], Extractor]
"""Builds an extractor from the part after the colon in "provider:model" (None when absent)."""


@dataclass(frozen=True, slots=True)
class ExtractorProvider(Requirements):
    """What an entry point of the `memshelf.extractors` group names, and what `register_extractor` keeps.

    create: the factory, called with the model name (the part after the colon, or None).
    requires: modules the provider needs, looked up without importing them.
    install: what to run when one of them is missing.
    """

    create: Factory
    requires: tuple[str, ...] = ()
    install: str | None = None


_REGISTRY: dict[str, ExtractorProvider] = {}
"""Providers registered in code; they win over an entry point of the same name."""
_PLUGINS = PluginGroup("memshelf.extractors", "extractor", ExtractorError,
                       accepting(ExtractorProvider, "a factory taking the model name"))


def register_extractor(name: str, factory: Factory | ExtractorProvider) -> None:
    """Make `extractor="name[:model]"` build extractors with `factory(model)`. A distribution offers one to every
    program instead through an entry point in the `memshelf.extractors` group."""
    _REGISTRY[name.lower()] = factory if isinstance(factory, ExtractorProvider) else ExtractorProvider(factory)


def registered_extractors() -> list[str]:
    """Every extractor name: registered in code or declared by an installed distribution (none is loaded)."""
    return provider_names(_REGISTRY, _PLUGINS)


def extractor_provider(name: str) -> ExtractorProvider | None:
    """The provider of that name, a registration in code first, then an entry point (loaded on first use)."""
    return find_provider(_REGISTRY, _PLUGINS, name)


def default_extractor_spec() -> str:
    """MEMSHELF_EXTRACTOR if set and not blank, else "rules"."""
    configured = os.environ.get("MEMSHELF_EXTRACTOR", "").strip()
    return configured or DEFAULT_EXTRACTOR


def resolve_extractor(spec: object = None) -> Extractor:
    """Turn what the user passed (None for the default, "rules", "ollama:MODEL", an Extractor) into an extractor."""
    if spec is None:
        spec = default_extractor_spec()
    if isinstance(spec, Extractor) or (not isinstance(spec, str) and callable(getattr(spec, "propose", None))):
        return spec  # type: ignore[return-value]  # duck-typed extractors are welcome
    if not isinstance(spec, str) or not spec.strip():
        raise ExtractorError(f"extractor must be a name like 'rules' or an Extractor, got {spec!r}")
    name, _, model = spec.strip().partition(":")
    found = extractor_provider(name)
    if found is None:
        known = ", ".join(registered_extractors()) or "none"
        raise ExtractorError(
            f"unknown extractor {name!r}; registered extractors are {known}. Register your own with "
            "memshelf.learning.register_extractor(name, factory), or install a distribution that declares it in "
            f"the 'memshelf.extractors' entry point group{_PLUGINS.missing_own_hint()}")
    if not found.available:
        raise ExtractorError(_unavailable(name, found))
    return found.create(model or None)


def extractor_availability() -> list[Availability]:
    """Every extractor name, where it comes from, and whether it can be used here (`memshelf providers`)."""
    return availability(registered_extractors(), _REGISTRY, _PLUGINS, extractor_provider, _unavailable)


def _unavailable(name: str, found: ExtractorProvider) -> str:
    missing = found.missing()
    needs = " and ".join(missing)
    return (f"the {name} extractor needs {needs}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            f"{found.install or 'install ' + needs}, or choose another extractor (e.g. 'rules')")
