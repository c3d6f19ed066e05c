"""How the Shelf turns an extractor's proposals into writes: it checks each one, decides, and applies the plan.

The extractor proposes; this module decides, so the same rules hold for every extractor: a proposal must cite
only the messages it was given, name a declared source, and fit the limits of what it writes; a fact is not
rewritten with the value it already has, and nothing replaces a record worth more than itself (a guess never
retires what the user said). Every refusal is a "skip" whose reason says why.

Learning a thread reads only its messages after the thread's watermark (stores.base.Mark). Applying a plan is one
transaction: the memories and facts, their evidence (which messages each came from) and the moved watermark are
written together or not at all, so a failure anywhere (the extractor, a write) loses nothing: the next call reads
the same messages again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING

from ..errors import Conflict, ExtractorError, InvalidInput, MemshelfError
from ..exports import MAX_CLOCK_SKEW
from ..model import (MAX_FACT_KEY_CHARS, MAX_FACT_VALUE_CHARS, MAX_TOPIC_CHARS, Fact, Memory, Message, NewMemory,
                     Owner, check_name, check_role, check_text, check_topic)
from ..stores.base import Evidence, Mark
from .base import Extractor, Known, Plan, Proposal, Turn, resolve_extractor
from .dates import resolve_dates

if TYPE_CHECKING:
    from ..shelf import Shelf

KNOWN_MEMORIES = 20
"""How many of the owner's memories related to the new turns an extractor is shown."""
KNOWN_QUERY_CHARS = 2_000
MAX_TURNS = 1_000
"""At most this many messages are read from a thread in one call; the rest wait for the next call (Plan.more)."""


GIVEN = "turn-"
"""The plan-local id of a turn passed in without one: "turn-2" is the second. It lets a proposal cite the turn (and
so when it was said, for relative dates) but is never written as evidence, since no logged message has it."""


def given_turn(item: object, now: datetime) -> Turn:
    """One turn passed in directly, checked as learn() and an import check it: a mapping (or Turn) with a known
    role, an id that is printable text, and a time with a zone, not later than now."""
    try:
        turn = Turn.of(item)  # type: ignore[arg-type]
    except (ExtractorError, AttributeError) as exc:
        raise InvalidInput(f"each message must be a mapping with role and content: {exc}") from None
    check_role(turn.role)
    if turn.at is not None and turn.at > now + MAX_CLOCK_SKEW:
        raise InvalidInput(f"a turn's 'at' {turn.at.isoformat()} is in the future (now is {now.isoformat()}): "
                           "give when it was said")
    return turn


def turns_given(messages: object, now: datetime) -> tuple[list[Turn], frozenset[str]]:
    """Turns passed in directly, checked (what was said cannot be said later than now, as an import checks it),
    and the plan-local ids given to those that came without one."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidInput("messages must be a list of turns like {'role': 'user', 'content': 'I live in Lisbon.'}")
    turns = [given_turn(item, now) for item in messages]
    taken = {turn.id for turn in turns}
    local: dict[int, str] = {}
    for index, turn in enumerate(turns):
        if turn.id is None:
            name = f"{GIVEN}{index + 1}"
            while name in taken:  # the caller named another turn so: keep theirs, mark this one apart
                name += "'"
            local[index] = name
            taken.add(name)
    return ([replace(turn, id=local[index]) if index in local else turn for index, turn in enumerate(turns)],
            frozenset(local.values()))


def turns_of(messages: Sequence[Message]) -> list[Turn]:
    return [Turn(m.role, m.content, m.id, m.created_at) for m in messages]


def known_for(shelf: Shelf, owner: Owner, turns: Sequence[Turn], facts: Sequence[Fact]) -> Known:
    """The owner's current facts and the current memories most related to what the user said in these turns (one
    search: hybrid with an embedder, keywords without)."""
    said = " ".join(turn.content for turn in turns if turn.role == "user")[:KNOWN_QUERY_CHARS].strip()
    related = [hit.memory for hit in shelf.search(owner, said, limit=KNOWN_MEMORIES)] if said else []
    return Known({fact.key: fact.value for fact in facts}, tuple(m.content for m in related),
                 tuple(m.id for m in related), {fact.key: fact.source for fact in facts},
                 tuple(m.source for m in related))


def extractor_name(extractor: object) -> str:
    return str(getattr(extractor, "name", None) or type(extractor).__name__)


def propose(extractor: Extractor, turns: Sequence[Turn], known: Known) -> list[Proposal]:
    """The extractor's proposals. Its failure is an ExtractorError naming it (memshelf's own errors pass as they
    are), and anything but a list of Proposals is its error too."""
    name = extractor_name(extractor)
    try:
        found = extractor.propose(list(turns), known) if turns else []
    except MemshelfError:
        raise
    except Exception as exc:  # a third-party extractor's bug: reported as its error, never swallowed
        raise ExtractorError(f"extractor {name!r} failed ({type(exc).__name__}: {exc}); nothing was written and "
                             "the thread's watermark did not move: fix the extractor, then learn again") from exc
    if not isinstance(found, list) or not all(isinstance(p, Proposal) for p in found):
        raise ExtractorError(f"extractor {name!r} must return a list of Proposal; got {type(found).__name__}: "
                             "fix the extractor")
    return found


def _with(proposal: Proposal, decision: str) -> Proposal:
    """The proposal with the Shelf's decision added to the extractor's reason."""
    return replace(proposal, reason=f"{proposal.reason}; {decision}" if proposal.reason else decision)


class Decider:
    """Checks proposals against the owner's records and the shelf's rules; says what applying each would do. It
    follows the plan as it goes: a second value for one fact key is judged against the first, and a memory closed
    by one proposal cannot be closed again by the next."""

    def __init__(self, shelf: Shelf, owner: Owner, turns: Sequence[Turn], facts: Sequence[Fact],
                 known: Known | None = None) -> None:
        self.shelf, self.owner = shelf, owner
        self.said_at: dict[str, datetime | None] = {t.id: t.at for t in turns if t.id is not None}
        self.users_own = {t.id for t in turns if t.id is not None and t.role == "user"}
        """The turns that can teach: the user's own (assistant, tool and system turns are context)."""
        self.facts = {fact.key: fact for fact in facts}
        self.remembered = {} if known is None else {
            content.casefold(): ident for content, ident in zip(known.memories, known.memory_ids)}
        """The memories the extractor was shown, by their text folded: what a skip "already remembered" names."""
        self.closed: set[str] = set()
        self.confirmed: list[Proposal] = []  # memories said again: more evidence, no write
        self.said_again: list[tuple[Proposal, Fact | int]] = []
        """Facts said again, each with the value it said: the owner's (as read before deciding), or the n-th value
        this plan sets for the key (n, counted from 1), whose instant is known once it is written."""
        self.sets: dict[str, int] = {}  # how many values this plan has set, by key

    def decide(self, proposal: Proposal) -> Proposal:
        try:
            return self._decide(proposal)
        except MemshelfError as exc:  # a limit or a missing field: the shelf's own words say which
            return _skip(proposal, str(exc))

    def _decide(self, proposal: Proposal) -> Proposal:
        if proposal.op == "skip":
            self._confirms(proposal)
            return proposal
        strange = [ident for ident in proposal.evidence if ident not in self.said_at]
        if strange:
            return _skip(proposal, f"its evidence names messages not read in this call: {', '.join(strange)}")
        if proposal.evidence and not any(ident in self.users_own for ident in proposal.evidence):
            return _skip(proposal, "its evidence holds none of the user's own turns (assistant, tool and system turns "
                                   "are context, never evidence about the user)")
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

    def _confirms(self, proposal: Proposal) -> None:
        """A fact said again with the value it has, or a memory said again as it is: the messages that say it are
        its evidence too, so forgetting one of the threads that said it (cascade) leaves it to the others. (A memory
        said again in a second thread had none, and went with the first thread.)"""
        if not proposal.evidence or any(ident not in self.said_at for ident in proposal.evidence) \
                or not any(ident in self.users_own for ident in proposal.evidence):
            return
        if proposal.key is not None:
            current = self.facts.get(proposal.key)
            if current is not None and current.value == proposal.value:
                self.said_again.append((proposal, self.sets.get(proposal.key) or current))
        elif proposal.content and (memory := self.remembered.get(proposal.content.casefold())) is not None:
            self.confirmed.append(replace(proposal, record=memory))

    def _fact(self, proposal: Proposal, worth: float) -> Proposal:
        key = check_name("fact key", proposal.key, MAX_FACT_KEY_CHARS)
        value = check_text("fact value", proposal.value, MAX_FACT_VALUE_CHARS)
        current = self.facts.get(key)
        held = None if current is None else self.shelf.sources.get(current.source, 1.0)
        if current is not None and held is not None and current.value == value and worth <= held:
            skipped = _skip(proposal, f"{key} is already {value!r}")
            self._confirms(skipped)
            return skipped
        if current is not None and held is not None and worth < held:
            return _skip(proposal, f"the current {key} ({current.value!r}) is {current.source}, worth {held}; a "
                                   f"value from {proposal.source} (worth {worth}) cannot replace it")
        self.facts[key] = Fact(key, value, proposal.source, proposal.at or self.shelf.now())
        self.sets[key] = self.sets.get(key, 0) + 1
        if current is None:
            return _with(proposal, f"new fact {key}")
        if current.value == value:  # said again from a stronger source: the value stays, its source rises
            return _with(proposal, f"{key} is {value!r}, {current.source} until now")
        return _with(proposal, f"{key} was {current.value!r} ({current.source})")

    def _supersede(self, proposal: Proposal, worth: float) -> Proposal:
        if not proposal.replaces:
            return _skip(proposal, "a supersede proposal must name the memory it replaces")
        old = self.shelf.store.get_memory(self.owner, proposal.replaces, self.shelf.now())
        if old is None:
            return _skip(proposal, f"{proposal.replaces} is not a memory of {self.owner}")
        if old.superseded_at is not None or old.id in self.closed:
            return _skip(proposal, f"{old.id} is already superseded" +
                         (f" by {old.superseded_by}" if old.superseded_by else " in this plan"))
        if old.confidence > worth:
            return _skip(proposal, f"{old.id} is {old.source} (worth {old.confidence}); a proposal "
                                   f"from {proposal.source} (worth {worth}) cannot retire it")
        self.closed.add(old.id)
        return _with(proposal, f"closes {old.id} ({old.source}, worth {old.confidence}), which keeps its text")


def _skip(proposal: Proposal, why: str) -> Proposal:
    return replace(proposal, op="skip", reason=why)


def _outranks(shelf: Shelf, source: str) -> Callable[[str], bool]:
    """Whether a value from `source` may replace a current value set by another source (same rule as set_fact)."""
    worth = shelf.sources.confidence(source)
    return lambda current: worth >= shelf.sources.get(current, 1.0)


@dataclass
class Application:
    """What applying a plan writes besides its records: the evidence rows, and where the watermark goes."""

    thread: str | None
    mark: Mark | None
    unlogged: frozenset[str] = frozenset()  # plan-local ids of turns passed in without one: never evidence rows
    evidence: list[Evidence] = field(default_factory=list)
    was: Mark | None = None  # the watermark the plan read from: the thread's must still be there to apply it
    read: tuple[str, ...] = ()  # the logged messages it read: each must still be there to apply it

    def cite(self, kind: str, record: str, proposal: Proposal, said_at: dict[str, datetime | None],
             set_at: datetime | None = None) -> None:
        """Evidence rows for the messages the proposal cites; set_at: when the fact value they taught was written."""
        self.evidence += [Evidence(kind, record, ident, self.thread, said_at.get(ident), set_at)
                          for ident in proposal.evidence if ident not in self.unlogged]

    def cites(self, kind: str, record: str) -> bool:
        return any(e.kind == kind and e.record == record for e in self.evidence)


def apply(shelf: Shelf, owner: Owner, decided: Sequence[Proposal], decider: Decider,
          plan: Application) -> list[Proposal]:
    """Write what was decided, its evidence and the moved watermark, in one transaction: all or nothing. Memories
    are embedded first, outside the transaction, so the write lock is not held while a model runs."""
    now, said_at = shelf.now(), decider.said_at
    new = {index: NewMemory(p.topic or "", p.content or "", p.source, shelf.sources.confidence(p.source), None,
                            created_at=now)
           for index, p in enumerate(decided) if p.op in ("remember", "supersede")}
    shelf._embed_new(owner, list(new.values()))
    done: dict[int, Proposal] = {}
    written: dict[str, list[datetime]] = {}  # the instants of the values this plan set, by key, in order
    with shelf.store.atomic():
        if plan.read and shelf.store.lock_messages(owner, plan.read) < len(plan.read):
            raise _Moved()  # erased since they were read: what they taught must not come back
        if not _still_known(shelf, owner, decider, now):
            raise _Moved()  # what a turn said again is gone (its thread was forgotten): that turn teaches it now
        for index in sorted(range(len(decided)), key=lambda i: _write_order(decided[i])):
            proposal = decided[index]
            if proposal.op == "set_fact":
                fact = shelf.store.set_fact(owner, proposal.key or "", proposal.value or "", proposal.source, now,
                                            replaces=_outranks(shelf, proposal.source))
                stamp = fact.outranked.set_at if fact.outranked else fact.updated_at  # its history row's instant
                written.setdefault(fact.key, []).append(stamp)
                plan.cite("fact", fact.key, proposal, said_at, stamp)
                done[index] = replace(proposal, record=fact.key)
            elif index in new:
                memory = shelf.store.add_memories(owner, [new[index]], now)[0]
                done[index] = _remembered(shelf, owner, replace(proposal, record=memory.id), memory, now, plan,
                                          said_at)
            else:
                done[index] = proposal
        for confirmed in decider.confirmed:  # a record the caller wrote (no evidence) stays the caller's
            said = confirmed.record or ""
            if plan.cites("memory", said) or shelf.store.evidence(owner, "memory", said):
                plan.cite("memory", said, confirmed, said_at)
        for confirmed, value in decider.said_again:
            key = confirmed.key or ""
            if isinstance(value, int):  # a value this plan set: learned, at the instant it was written
                stamps = written.get(key, [])
                if value <= len(stamps):
                    plan.cite("fact", key, confirmed, said_at, stamps[value - 1])
            else:
                for set_at in _learned_value(shelf, owner, value, plan):
                    plan.cite("fact", key, confirmed, said_at, set_at)
        shelf.store.add_evidence(owner, plan.evidence)
        if plan.thread is not None and plan.mark is not None \
                and not shelf.store.move_learn_mark(owner, plan.thread, plan.was, plan.mark, now):
            raise _Moved()
    return [done[index] for index in range(len(decided))]


def _write_order(proposal: Proposal) -> tuple[int, str, str]:
    """The order apply writes a plan in: facts by key, then memories by topic and text (a key's values, and a
    text's repeats, in the plan's order). Two learns of one owner then take their rows' locks in one order, and
    neither waits on a row the other holds while it holds one the first wants (PostgreSQL found a deadlock)."""
    if proposal.op == "set_fact":
        return 0, proposal.key or "", ""
    return 1, proposal.topic or "", proposal.content or ""


def _still_known(shelf: Shelf, owner: Owner, decider: Decider, now: datetime) -> bool:
    """Whether what the plan found said again is still there, in its transaction: each memory, and each fact value
    (its history row). One erased since the plan read the owner's records (forget_thread with cascade of the thread
    that taught it) would get no evidence, and the turn that said it again would be behind the watermark."""
    if any(shelf.store.get_memory(owner, said.record or "", now) is None for said in decider.confirmed):
        return False
    keys = {value.key for _, value in decider.said_again if isinstance(value, Fact)}
    held = {(c.key, c.value, c.set_at) for key in keys for c in shelf.store.fact_history(owner, key)}
    return all((value.key, value.value, value.updated_at) in held
               for _, value in decider.said_again if isinstance(value, Fact))


def _learned_value(shelf: Shelf, owner: Owner, fact: Fact, plan: Application) -> list[datetime | None]:
    """What evidence of a fact said again names: the value it holds, when learning taught that value (evidence
    names its set_at), so the value stays while any thread that says it does and goes with the last of them. A
    value the caller set is named by no evidence and stays the caller's: nothing. A key whose evidence was written
    before memshelf kept set_at names no value (None), as that evidence does."""
    named = [e.set_at for e in (*plan.evidence, *shelf.store.evidence(owner, "fact", fact.key))
             if e.kind == "fact" and e.record == fact.key]
    if fact.updated_at in named:
        return [fact.updated_at]
    return [None] if None in named else []


def _remembered(shelf: Shelf, owner: Owner, proposal: Proposal, memory: Memory, now: datetime, plan: Application,
                said_at: dict[str, datetime | None]) -> Proposal:
    """A memory written (or seen again): its evidence, and the memory it supersedes closed. A memory seen again
    gets evidence only if it was learned before: one the caller wrote stays the caller's, and no forget_thread
    cascade takes it."""
    seen_again = memory.observations > 1
    if not seen_again or plan.cites("memory", memory.id) or shelf.store.evidence(owner, "memory", memory.id):
        plan.cite("memory", memory.id, proposal, said_at)
    if seen_again:
        proposal = _with(proposal, f"seen again: {memory.id} now has {memory.observations} observations" + (
            f"; it stays superseded by {memory.superseded_by}" if memory.superseded_by else ""))
    if proposal.op != "supersede":
        return proposal
    if proposal.replaces == memory.id:
        return replace(_with(proposal, "it is the memory it would replace, so nothing is closed"), op="remember")
    if not shelf.store.supersede_memory(owner, proposal.replaces or "", memory.id, now):
        return replace(_with(proposal, f"{proposal.replaces} was closed meanwhile"), op="remember")
    return proposal


LEARN_ATTEMPTS = 3
"""How often learn reads again when what its plan was decided on changed before it could be applied."""


class _Moved(Exception):
    """Raised inside apply's transaction, which it rolls back: what the plan was decided on is not there any more
    (another learn of the thread moved its watermark, a message read or a record said again was erased)."""


def learn(shelf: Shelf, owner: Owner, messages: object, thread: str | None, extractor: object,
          dry_run: bool) -> Plan:
    """Learn once; a plan whose ground changed before it was applied (_Moved) is dropped whole and the thread read
    again (from where another learn left it), so two learns of one thread at once never apply the same turns twice,
    and nothing learned from what an erasure took meanwhile comes back."""
    chosen = resolve_extractor(extractor)
    started = time.perf_counter()
    for _ in range(LEARN_ATTEMPTS):
        try:
            return _learn(shelf, owner, messages, thread, chosen, dry_run, started)
        except _Moved:
            continue
    raise Conflict(f"what learning read of {owner} (thread {thread!r}) changed while it decided, {LEARN_ATTEMPTS} "
                   "times over (other learns of the thread, or erasures)",
                   "learn again once they are done; nothing of this call was written")


def _learn(shelf: Shelf, owner: Owner, messages: object, thread: str | None, chosen: Extractor, dry_run: bool,
           started: float) -> Plan:
    mark: Mark | None = None
    logged: list[Message] = []
    unlogged: frozenset[str] = frozenset()
    if messages is not None:
        turns, unlogged = turns_given(messages, shelf.now())
    else:
        assert thread is not None
        mark = shelf.store.learn_mark(owner, thread)
        logged = shelf.store.messages_after(owner, thread, mark, MAX_TURNS + 1, shelf.now())
        turns = turns_of(logged[:MAX_TURNS])
    facts = shelf.facts(owner)  # read once: what the extractor is shown is what the decisions are checked against
    known = known_for(shelf, owner, turns, facts) if turns else Known()
    proposals = propose(chosen, turns, known)
    decider = Decider(shelf, owner, turns, facts, known)
    decided = [decider.decide(p) for p in proposals]
    read = logged[:MAX_TURNS]
    if not dry_run and (read or any(p.op != "skip" for p in decided)):
        moved = Mark(read[-1].id, read[-1].created_at) if read else None
        decided = apply(shelf, owner, decided, decider,
                        Application(thread if messages is None else None, moved, unlogged, was=mark,
                                    read=tuple(m.id for m in read)))
        mark = moved or mark
    return Plan(str(owner), thread, extractor_name(chosen), dry_run, tuple(decided), tuple(m.id for m in read),
                None if mark is None else mark.message_id, getattr(chosen, "usage", None),
                (time.perf_counter() - started) * 1000, more=len(logged) > MAX_TURNS)


def check_learn_args(messages: object, thread: object) -> str | None:
    if (messages is None) == (thread is None):
        raise InvalidInput("learn from either messages (a list of turns) or thread (a logged thread's name), "
                           "not both and not neither")
    return None if thread is None else check_text("thread", thread, MAX_TOPIC_CHARS)

