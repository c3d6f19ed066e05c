"""How the Shelf turns an extractor's proposals into writes: it checks each one, decides, and applies the plan.

The extractor proposes; this module decides, so the same rules hold for every extractor: a proposal must cite
only the messages it was given, name a declared source, and fit the limits of what it writes; a fact is not
rewritten with the value it already has, and nothing replaces a record worth more than itself (a guess never
retires what the user said). Every refusal is a "skip" whose reason says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import ExtractorError, InvalidInput, MemshelfError
from ..model import (MAX_FACT_KEY_CHARS, MAX_FACT_VALUE_CHARS, MAX_TOPIC_CHARS, Message, NewMemory, Owner, check_text,
                     check_topic)
from .base import Known, Plan, Proposal, Turn, resolve_extractor
from .dates import resolve_dates

if TYPE_CHECKING:
    from ..shelf import Shelf

KNOWN_MEMORIES = 20
"""How many of the owner's memories related to the new turns an extractor is shown."""
KNOWN_QUERY_CHARS = 2_000
MAX_TURNS = 1_000
"""At most this many messages are read from a thread in one call; the rest wait for the next call."""


def turns_given(messages: object) -> list[Turn]:
    """Turns passed in directly, checked."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidInput("messages must be a list of turns like {'role': 'user', 'content': 'I live in Lisbon.'}")
    try:
        return [Turn.of(item) for item in messages]  # type: ignore[arg-type]
    except (ExtractorError, AttributeError) as exc:
        raise InvalidInput(f"each message must be a mapping with role and content: {exc}") from None


def turns_of(messages: Sequence[Message]) -> list[Turn]:
    return [Turn(m.role, m.content, m.id, m.created_at) for m in messages]


def known_for(shelf: Shelf, owner: Owner, turns: Sequence[Turn]) -> Known:
    """The owner's current facts and the memories most related to what the user said in these turns."""
    facts = {fact.key: fact.value for fact in shelf.facts(owner)}
    said = " ".join(turn.content for turn in turns if turn.role == "user")[:KNOWN_QUERY_CHARS].strip()
    memories: tuple[str, ...] = ()
    if said:
        memories = tuple(hit.memory.content for hit in shelf.search(owner, said, limit=KNOWN_MEMORIES))
    return Known(facts, memories)


def propose(extractor: Any, turns: Sequence[Turn], known: Known) -> tuple[list[Proposal], float]:
    """The extractor's proposals and how long it took (ms). Anything but a list of Proposals is its error."""
    started = time.perf_counter()
    found = extractor.propose(list(turns), known) if turns else []
    took = (time.perf_counter() - started) * 1000
    if not isinstance(found, list) or not all(isinstance(p, Proposal) for p in found):
        raise ExtractorError(f"extractor {getattr(extractor, 'name', extractor)!r} must return a list of Proposal; "
                             f"got {type(found).__name__}: fix the extractor")
    return found, took


class Decider:
    """Checks proposals against the owner's records and the shelf's rules; says what applying each would do."""

    def __init__(self, shelf: Shelf, owner: Owner, turns: Sequence[Turn]) -> None:
        self.shelf, self.owner = shelf, owner
        self.said_at: dict[str, datetime | None] = {t.id: t.at for t in turns if t.id is not None}
        self.facts = {fact.key: fact for fact in shelf.facts(owner)}

    def decide(self, proposal: Proposal) -> Proposal:
        try:
            return self._decide(proposal)
        except MemshelfError as exc:  # a limit or a missing field: the shelf's own words say which
            return _skip(proposal, str(exc))

    def _decide(self, proposal: Proposal) -> Proposal:
        if proposal.op == "skip":
            return proposal
        strange = [ident for ident in proposal.evidence if ident not in self.said_at]
        if strange:
            return _skip(proposal, f"its evidence names messages not read in this call: {', '.join(strange)}")
        worth = self.shelf.sources.confidence(proposal.source)
        at = max((t for t in (self.said_at.get(i) for i in proposal.evidence) if t is not None), default=None)
        proposal = replace(proposal, at=at)
        if at is not None:  # "tomorrow" means the day after it was said, not after it is read
            proposal = replace(proposal, content=proposal.content and resolve_dates(proposal.content, at),
                               value=proposal.value and resolve_dates(proposal.value, at))
        if proposal.op == "set_fact":
            return self._fact(proposal, worth)
        check_topic(proposal.topic)
        check_text("content", proposal.content)
        if proposal.op == "supersede":
            return self._supersede(proposal, worth)
        return proposal

    def _fact(self, proposal: Proposal, worth: float) -> Proposal:
        key = check_text("fact key", proposal.key, MAX_FACT_KEY_CHARS)
        value = check_text("fact value", proposal.value, MAX_FACT_VALUE_CHARS)
        current = self.facts.get(key)
        if current is None:
            return proposal
        if current.value == value:
            return _skip(proposal, f"{key} is already {value!r}")
        held = self.shelf.sources.get(current.source, 1.0)
        if worth < held:
            return _skip(proposal, f"the current {key} ({current.value!r}) is {current.source}, worth {held}; a "
                                   f"{proposal.source} value (worth {worth}) cannot replace it")
        return proposal

    def _supersede(self, proposal: Proposal, worth: float) -> Proposal:
        if not proposal.replaces:
            return _skip(proposal, "a supersede proposal must name the memory it replaces")
        old = self.shelf.store.get_memory(self.owner, proposal.replaces, self.shelf.now())
        if old is None:
            return _skip(proposal, f"{proposal.replaces} is not a current memory of {self.owner}")
        if old.confidence > worth:
            return _skip(proposal, f"{old.id} is {old.source} (worth {old.confidence}); a {proposal.source} "
                                   f"proposal (worth {worth}) cannot retire it")
        return proposal


def _skip(proposal: Proposal, why: str) -> Proposal:
    return replace(proposal, op="skip", reason=why)


def _outranks(shelf: Shelf, source: str) -> Callable[[str], bool]:
    """Whether a value from `source` may replace a current value set by another source (same rule as set_fact)."""
    worth = shelf.sources.confidence(source)
    return lambda current: worth >= shelf.sources.get(current, 1.0)


def apply(shelf: Shelf, owner: Owner, decided: Sequence[Proposal]) -> list[Proposal]:
    """Write what was decided, in one transaction: every proposal or none. Memories are embedded first, outside
    the transaction, so the write lock is not held while a model runs."""
    now = shelf.now()
    new = {index: NewMemory(p.topic or "", p.content or "", p.source, shelf.sources.confidence(p.source), None,
                            created_at=now)
           for index, p in enumerate(decided) if p.op in ("remember", "supersede")}
    shelf._embed_new(owner, list(new.values()))
    done: list[Proposal] = []
    with shelf.store.atomic():
        for index, proposal in enumerate(decided):
            if proposal.op == "set_fact":
                fact = shelf.store.set_fact(owner, proposal.key or "", proposal.value or "", proposal.source, now,
                                            replaces=_outranks(shelf, proposal.source))
                done.append(replace(proposal, record=fact.key))
            elif index in new:
                memory = shelf.store.add_memories(owner, [new[index]], now)[0]
                if proposal.op == "supersede":
                    shelf.store.supersede_memory(owner, proposal.replaces or "", memory.id, now)
                done.append(replace(proposal, record=memory.id))
            else:
                done.append(proposal)
    return done


def learn(shelf: Shelf, owner: Owner, messages: object, thread: str | None, extractor: object,
          dry_run: bool) -> Plan:
    chosen = resolve_extractor(extractor)
    started = time.perf_counter()
    read: tuple[str, ...] = ()
    if messages is not None:
        turns = turns_given(messages)
    else:
        assert thread is not None
        logged = shelf.messages(owner, thread, limit=MAX_TURNS)
        turns, read = turns_of(logged), tuple(m.id for m in logged)
    known = known_for(shelf, owner, turns) if turns else Known()
    proposals, _ = propose(chosen, turns, known)
    decider = Decider(shelf, owner, turns)
    decided = [decider.decide(p) for p in proposals]
    if not dry_run and any(p.op != "skip" for p in decided):
        decided = apply(shelf, owner, decided)
    return Plan(str(owner), thread, getattr(chosen, "name", type(chosen).__name__), dry_run, tuple(decided), read,
                None, getattr(chosen, "usage", None), (time.perf_counter() - started) * 1000)


def check_learn_args(messages: object, thread: object) -> str | None:
    if (messages is None) == (thread is None):
        raise InvalidInput("learn from either messages (a list of turns) or thread (a logged thread's name), "
                           "not both and not neither")
    return None if thread is None else check_text("thread", thread, MAX_TOPIC_CHARS)

