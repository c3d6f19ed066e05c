"""Learning from conversations, the way users do it, on both backends: turns are logged in a thread, Shelf.learn
reads what is new since the thread's watermark, the extractor proposes, the Shelf decides and applies the plan in
one transaction; what was learned shows in search, context and prompts, keeps its evidence, can be superseded,
and goes with its thread when the thread is forgotten with cascade."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import UTC, datetime, timedelta
from memshelf.stores.sqlite import sqlite3  # the store's own SQLite: another in this process must not open its files
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from fakes import HashEmbedder

from memshelf import Conflict, ExtractorError, Fact, InvalidInput, MemshelfError, Message, Owner, Proposal, Shelf
from memshelf.learning import Extractor, Known, Plan, RulesExtractor, Turn
from memshelf.learning import _decide
from memshelf.migrate import migrate
from memshelf.stores.sqlite import SQLiteStore

KALEB = Owner("home", "kaleb")
MAYA = Owner("home", "maya")


class Scripted(Extractor):
    """An extractor written by a test: it proposes what `script(user_turns)` returns (real Proposals, with the
    ids of the turns it read as evidence)."""

    name = "scripted"

    def __init__(self, script: Callable[[list[Turn]], list[Proposal]]) -> None:
        self.script = script

    def propose(self, turns: Sequence[Turn], known: Known | None = None) -> list[Proposal]:
        return self.script([t for t in turns if t.role == "user"])


class Flaky(Extractor):
    """Fails the first time (a model that timed out, a bug), then proposes as `rules` does."""

    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, turns: Sequence[Turn], known: Known | None = None) -> list[Proposal]:
        self.calls += 1
        if self.calls == 1:
            raise TimeoutError("the model did not answer")
        from memshelf.learning import resolve_extractor

        return resolve_extractor("rules").propose(turns, known)


class ReadsEveryRole(Extractor):
    """An extractor that proposes home_city from each turn's "I live in X." whoever said it."""

    name = "reads-every-role"

    def propose(self, turns: Sequence[Turn], known: Known | None = None) -> list[Proposal]:
        return [Proposal("set_fact", "mined", (t.id,), key="home_city", value=t.content.split(" in ")[-1].rstrip("."))
                for t in turns if " in " in t.content and t.id is not None]


def records(shelf: Shelf, owner: Owner = KALEB) -> list[dict]:
    return list(shelf.export(owner))


def fact(shelf: Shelf, key: str, owner: Owner = KALEB) -> str | None:
    return next((f.value for f in shelf.facts(owner) if f.key == key), None)


def fact_at(shelf: Shelf, key: str) -> datetime:
    return shelf.get_fact(KALEB, key).updated_at


def test_a_conversation_learned_shows_in_search_context_and_prompt(shelf):
    shelf.log_message(KALEB, "t1", "user", "Hi! I live in Porto and I'm allergic to peanuts.")
    shelf.log_message(KALEB, "t1", "assistant", "Noted. I live in the cloud.")  # the assistant's words: not the user's
    shelf.log_message(KALEB, "t1", "user", "Remember that my sister's wedding is in Faro.")

    plan = shelf.learn(KALEB, thread="t1")

    assert not plan.dry_run and plan.extractor == "rules" and len(plan.messages) == 3
    assert plan.watermark == plan.messages[-1]
    assert fact(shelf, "home_city") == "Porto"
    assert {p.op for p in plan.applied} == {"set_fact", "remember"} and all(p.record for p in plan.applied)
    assert all(p.reason for p in plan.proposals)
    hits = shelf.search(KALEB, "sister wedding")
    assert [h.memory.source for h in hits] == ["stated"] and "Faro" in hits[0].memory.content
    assert "Faro" in shelf.context(KALEB, "when is the wedding")
    prompt = shelf.build_prompt("You are helpful.", KALEB, "What am I allergic to?")
    assert "Porto" in prompt and "peanut" in prompt.lower() and "cloud" not in prompt
    said = shelf.messages(KALEB, "t1")[0]
    assert [(e.message_id, e.thread) for e in shelf.evidence(KALEB, key="home_city")] == [(said.id, "t1")]


def test_a_move_replaces_the_home_and_the_past_stays_readable(shelf, clock):
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="t1")
    clock.advance(60)
    before_the_move = shelf.now()
    clock.advance(60)
    shelf.log_message(KALEB, "t1", "user", "I moved to Lisbon last spring.")

    plan = shelf.learn(KALEB, thread="t1")

    assert [(p.op, p.key, p.value) for p in plan.applied] == [("set_fact", "home_city", "Lisbon")]
    assert "'Porto'" in plan.applied[0].reason
    assert fact(shelf, "home_city") == "Lisbon"
    assert [c.value for c in shelf.fact_history(KALEB, "home_city")] == ["Porto", "Lisbon"]
    assert [f.value for f in shelf.facts(KALEB, as_of=before_the_move)] == ["Porto"]
    assert "Porto" in shelf.build_prompt("base", KALEB, "", as_of=before_the_move)


def test_learning_again_reads_only_what_is_new(shelf, clock):
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    first = shelf.learn(KALEB, thread="t1")
    again = shelf.learn(KALEB, thread="t1")
    assert again.messages == () and again.proposals == () and again.watermark == first.watermark
    history = shelf.fact_history(KALEB, "home_city")

    clock.advance(1)
    shelf.log_message(KALEB, "t1", "user", "My dog is called Rex.")
    later = shelf.learn(KALEB, thread="t1")

    assert len(later.messages) == 1 and later.watermark == later.messages[0] != first.watermark
    assert shelf.fact_history(KALEB, "home_city") == history  # Porto was not read, nor written, again
    assert shelf.learn(KALEB, thread="t2").watermark is None  # another thread has its own watermark


def test_a_dry_run_writes_nothing_and_moves_no_watermark(shelf):
    shelf.log_message(KALEB, "t1", "user", "I live in Porto. Remember that I take the 8:15 train.")
    before = records(shelf)

    plan = shelf.learn(KALEB, thread="t1", dry_run=True)

    assert plan.dry_run and {p.op for p in plan.applied} == {"set_fact", "remember"}
    assert all(p.record is None for p in plan.proposals) and plan.watermark is None
    assert records(shelf) == before
    applied = shelf.learn(KALEB, thread="t1")  # the same messages are still new
    assert len(applied.messages) == 1 and fact(shelf, "home_city") == "Porto"


def test_a_failing_extractor_writes_nothing_and_the_retry_learns_the_same_messages(shelf):
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    flaky = Flaky()
    before = records(shelf)

    with pytest.raises(ExtractorError, match="flaky.*TimeoutError.*watermark did not move"):
        shelf.learn(KALEB, thread="t1", extractor=flaky)

    assert records(shelf) == before and shelf.store.learn_mark(KALEB, "t1") is None
    plan = shelf.learn(KALEB, thread="t1", extractor=flaky)
    assert len(plan.messages) == 1 and fact(shelf, "home_city") == "Porto"


def test_an_extractor_that_returns_garbage_is_an_extractor_error(shelf):
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    with pytest.raises(ExtractorError, match="must return a list of Proposal"):
        shelf.learn(KALEB, thread="t1", extractor=Scripted(lambda turns: "home_city=Porto"))  # type: ignore
    assert shelf.store.learn_mark(KALEB, "t1") is None


def test_a_guess_cannot_retire_what_the_user_stated(shelf):
    stated = shelf.remember(KALEB, "diet", "Kaleb is vegetarian.")
    shelf.log_message(KALEB, "t1", "user", "I had a burger yesterday.")
    guess = Scripted(lambda turns: [Proposal("supersede", "inferred", (turns[0].id,), topic="diet",
                                             content="Kaleb eats meat.", replaces=stated.id)])

    plan = shelf.learn(KALEB, thread="t1", extractor=guess)

    assert [p.op for p in plan.proposals] == ["skip"]
    assert "stated" in plan.proposals[0].reason and "cannot retire" in plan.proposals[0].reason
    assert shelf.get(KALEB, stated.id).superseded_at is None
    assert [h.memory.content for h in shelf.search(KALEB, "Kaleb")] == ["Kaleb is vegetarian."]


def test_a_statement_supersedes_and_the_old_memory_stays_in_the_past(shelf, clock):
    old = shelf.remember(KALEB, "work", "Kaleb works at Acme.")
    clock.advance(60)
    before = shelf.now()
    clock.advance(60)
    shelf.log_message(KALEB, "t1", "user", "I left Acme, I work at Globex now.")
    told = Scripted(lambda turns: [Proposal("supersede", "stated", (turns[0].id,), topic="work",
                                            content="Kaleb works at Globex.", replaces=old.id)])

    plan = shelf.learn(KALEB, thread="t1", extractor=told)

    [applied] = plan.applied
    assert applied.op == "supersede" and f"closes {old.id}" in applied.reason
    closed = shelf.get(KALEB, old.id)
    assert (closed.content, closed.superseded_by, closed.superseded_at) == ("Kaleb works at Acme.", applied.record,
                                                                           shelf.now())
    assert [h.memory.content for h in shelf.search(KALEB, "Kaleb works")] == ["Kaleb works at Globex."]
    assert "Acme" not in shelf.build_prompt("base", KALEB, "where does Kaleb work")
    assert {h.memory.content for h in shelf.search(KALEB, "Kaleb works", include_superseded=True)} == {
        "Kaleb works at Acme.", "Kaleb works at Globex."}
    assert [h.memory.content for h in shelf.search(KALEB, "Kaleb works", as_of=before)] == ["Kaleb works at Acme."]
    assert [m.content for m in shelf.list_memories(KALEB)[0]] == ["Kaleb works at Globex."]


def test_moving_back_makes_the_old_memory_current_again(shelf, clock):
    """Acme, then Globex, then back to Acme: the third statement repeats the first memory's text, which holds again
    and closes Globex (before, the repeat stayed superseded by Globex and then closed Globex too: nothing current)."""
    acme = shelf.remember(KALEB, "work", "Kaleb works at Acme.")
    for thread, said, content, replaces in (("t1", "I work at Globex now.", "Kaleb works at Globex.", acme.id),
                                            ("t2", "I am back at Acme.", "Kaleb works at Acme.", None)):
        clock.advance(60)
        shelf.log_message(KALEB, thread, "user", said)
        current = replaces or shelf.list_memories(KALEB)[0][0].id
        told = Scripted(lambda turns, c=content, r=current: [Proposal("supersede", "stated", (turns[0].id,),
                                                                       topic="work", content=c, replaces=r)])
        [applied] = shelf.learn(KALEB, thread=thread, extractor=told).applied
        assert applied.op == "supersede", applied.reason
    assert [h.memory.content for h in shelf.search(KALEB, "Kaleb works")] == ["Kaleb works at Acme."]
    assert shelf.get(KALEB, acme.id).superseded_at is None
    [globex] = [m for m in shelf.list_memories(KALEB, include_superseded=True)[0] if "Globex" in m.content]
    assert globex.superseded_by == acme.id


@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_meaning_search_skips_a_superseded_memory_too(open_shelf, clock, mode):
    """Vector search as well as keywords: on SQLite the owner's cached vector matrix is refreshed when a memory is
    closed, and again when it holds again because what closed it was erased; on PostgreSQL the exact scan drops
    closed rows."""
    shelf = open_shelf(embedder=HashEmbedder(), clock=clock)
    old = shelf.remember(KALEB, "work", "Kaleb works at Acme as a welder.")
    clock.advance(60)
    before = shelf.now()
    assert [h.memory.id for h in shelf.search(KALEB, "Kaleb works at Acme", mode=mode)] == [old.id]  # cached now
    clock.advance(60)
    shelf.log_message(KALEB, "t1", "user", "I work at Globex now.")
    told = Scripted(lambda turns: [Proposal("supersede", "stated", (turns[0].id,), topic="work",
                                            content="Kaleb works at Globex as a welder.", replaces=old.id)])
    [applied] = shelf.learn(KALEB, thread="t1", extractor=told).applied

    assert [h.memory.id for h in shelf.search(KALEB, "Kaleb works at Acme", mode=mode)] == [applied.record]
    assert {h.memory.id for h in shelf.search(KALEB, "Kaleb works at Acme", mode=mode, include_superseded=True)} == {
        old.id, applied.record}
    assert [h.memory.id for h in shelf.search(KALEB, "Kaleb works at Acme", mode=mode, as_of=before)] == [old.id]

    shelf.forget_thread(KALEB, "t1", cascade=True)  # what the thread taught goes: what it replaced holds again
    assert [h.memory.id for h in shelf.search(KALEB, "Kaleb works at Acme", mode=mode)] == [old.id]
    assert "Acme" in shelf.build_prompt("base", KALEB, "where does Kaleb work as a welder")
    assert shelf.get(KALEB, old.id).superseded_by is None


def test_another_owners_memory_cannot_be_superseded(shelf):
    theirs = shelf.remember(MAYA, "work", "Maya works at Acme.")
    shelf.log_message(KALEB, "t1", "user", "Maya quit.")
    grab = Scripted(lambda turns: [Proposal("supersede", "stated", (turns[0].id,), topic="work",
                                            content="Maya quit Acme.", replaces=theirs.id)])

    plan = shelf.learn(KALEB, thread="t1", extractor=grab)

    assert [p.op for p in plan.proposals] == ["skip"] and "is not a memory of home/kaleb" in plan.proposals[0].reason
    assert shelf.get(MAYA, theirs.id).superseded_at is None and shelf.list_memories(KALEB)[0] == []


def test_evidence_must_come_from_the_messages_read(shelf):
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    forged = Scripted(lambda turns: [Proposal("set_fact", "mined", ("msg_0000000000000000",), key="home_city",
                                              value="Atlantis")])
    plan = shelf.learn(KALEB, thread="t1", extractor=forged)
    assert plan.applied == () and "not read in this call" in plan.proposals[0].reason
    assert fact(shelf, "home_city") is None


def test_two_values_for_one_key_in_one_plan_apply_in_order(shelf):
    shelf.log_message(KALEB, "t1", "user", "I lived in Porto, then I moved to Braga, and now I live in Lisbon.")
    moves = Scripted(lambda turns: [Proposal("set_fact", "mined", (turns[0].id,), key="home_city", value=city)
                                    for city in ("Braga", "Lisbon", "Lisbon")])
    plan = shelf.learn(KALEB, thread="t1", extractor=moves)
    assert [p.op for p in plan.proposals] == ["set_fact", "set_fact", "skip"]
    assert fact(shelf, "home_city") == "Lisbon"
    assert [c.value for c in shelf.fact_history(KALEB, "home_city")] == ["Braga", "Lisbon"]


def test_remembering_what_is_already_known_counts_as_seen_again(shelf):
    mine = shelf.remember(KALEB, "noted", "Kaleb takes the 8:15 train", source="stated")
    shelf.log_message(KALEB, "t1", "user", "Remember that Kaleb takes the 8:15 train.")
    again = Scripted(lambda turns: [Proposal("remember", "stated", (turns[0].id,), topic="noted",
                                             content="Kaleb takes the 8:15 train")])
    plan = shelf.learn(KALEB, thread="t1", extractor=again)
    [applied] = plan.applied
    assert applied.record == mine.id and "seen again" in applied.reason
    assert shelf.get(KALEB, mine.id).observations == 2
    assert shelf.evidence(KALEB, memory_id=mine.id) == []  # the caller's memory stays the caller's


def test_turns_passed_directly_touch_no_watermark(shelf):
    plan = shelf.learn(KALEB, [{"role": "user", "content": "I live in Porto.", "id": "x1"}])
    assert plan.thread is None and plan.watermark is None and fact(shelf, "home_city") == "Porto"
    assert shelf.store.learn_marks(KALEB) == {}
    assert [(e.message_id, e.thread) for e in shelf.evidence(KALEB, key="home_city")] == [("x1", None)]


def test_what_the_user_says_of_a_guess_makes_it_stated(shelf):
    """A memory and a fact the system only guessed, then said by the user: they become what the user said (before,
    both were skipped as known, and the prompt went on showing them as unconfirmed guesses)."""
    guess = shelf.remember(KALEB, "noted", "The spare key is under the mat", source="inferred")
    shelf.set_fact(KALEB, "home_city", "Porto", source="inferred")
    shelf.log_message(KALEB, "t1", "user", "Remember that the spare key is under the mat.")
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    plan = shelf.learn(KALEB, thread="t1")
    assert [p.op for p in plan.proposals] == ["remember", "set_fact"]
    assert shelf.get(KALEB, guess.id).source == "stated"
    assert [(f.value, f.source) for f in shelf.facts(KALEB)] == [("Porto", "mined")]
    again = shelf.learn(KALEB, [{"role": "user", "content": "I live in Porto."}])  # the same source: not news
    assert [(p.op, p.reason) for p in again.proposals] == [("skip", "home_city is already 'Porto'")]


def test_what_turns_with_their_own_ids_taught_exports_and_imports(shelf):
    """The evidence of a turn given with the caller's id names that id; an import refused it as "not an id memshelf
    makes", so no export of such an owner could be imported."""
    said = datetime(2025, 5, 18, 9, 0, tzinfo=UTC)
    shelf.learn(KALEB, [{"role": "user", "content": "I live in Porto.", "id": "m1", "at": said.isoformat()},
                        {"role": "user", "content": "Remember that the spare key is under the mat.", "id": 7}])
    exported = records(shelf)
    assert {(r["message_id"], r["said_at"]) for r in exported if r["kind"] == "evidence"} == {
        ("m1", "2025-05-18T09:00:00.000000+00:00"), ("7", None)}
    counts = shelf.import_(MAYA, exported)
    assert counts["evidence"] == 2
    assert [(e.message_id, e.said_at) for e in shelf.evidence(MAYA, key="home_city")] == [("m1", said)]


@pytest.mark.parametrize("turn, says", [
    ({"id": "a\x00b"}, "control characters"), ({"id": ""}, "empty"), ({"id": "x" * 201}, "limit"),
    ({"at": "tomorrow"}, "not an ISO 8601 time"), ({"at": datetime(2026, 5, 18)}, "naive"),
    ({"at": "2026-05-18T09:00:00"}, "naive"), ({"at": datetime(2999, 1, 1, tzinfo=UTC)}, "in the future"),
    ({"at": 1716000000}, "must be a datetime")])
def test_a_turns_id_and_time_are_checked_as_an_import_checks_them(shelf, turn, says):
    with pytest.raises(InvalidInput, match=says):
        shelf.learn(KALEB, [{"role": "user", "content": "I live in Porto.", **turn}])
    assert shelf.facts(KALEB) == []


def test_a_turn_with_a_role_no_chat_api_has_is_refused_before_anything_is_learned(shelf):
    turns = [{"role": "User", "content": "I live in Porto."}, {"role": "human", "content": "I live in Lisbon."}]
    with pytest.raises(MemshelfError, match="role 'human' is not one of user, assistant, system, developer, tool"):
        shelf.learn(KALEB, turns)
    assert shelf.facts(KALEB) == []
    shelf.log_message(KALEB, "t1", "USER", "I live in Porto.")  # a logged role is kept in its canonical spelling
    assert [m.role for m in shelf.messages(KALEB, "t1")] == ["user"]
    shelf.learn(KALEB, thread="t1")
    assert fact(shelf, "home_city") == "Porto"


def test_turns_passed_without_ids_are_cited_by_position_and_their_dates_resolve(shelf):
    """The issue's own call: turns with a time but no id. Each proposal cites its turn by position ("turn-2"), so
    a relative date resolves against when that turn was said; no evidence row is written, as no message has it."""
    said = datetime(2025, 5, 18, 9, 0, tzinfo=UTC)
    plan = shelf.learn(KALEB, [{"role": "user", "content": "I moved to Lisbon last spring.", "at": said},
                               {"role": "user", "content": "Remember that my dentist appointment is tomorrow.",
                                "at": said + timedelta(days=3)}], extractor="rules", dry_run=True)
    assert [(p.op, p.evidence, p.at) for p in plan.proposals] == [
        ("set_fact", ("turn-1",), said), ("remember", ("turn-2",), said + timedelta(days=3))]
    assert plan.proposals[1].content == "My dentist appointment is tomorrow (2025-05-22)"
    assert shelf.facts(KALEB) == [] and shelf.search(KALEB, "dentist") == []  # a dry run writes nothing
    shelf.learn(KALEB, [{"role": "user", "content": "Remember that my dentist appointment is tomorrow.",
                         "at": said}, {"role": "user", "content": "I live in Porto.", "id": "turn-1"}])
    [hit] = shelf.search(KALEB, "dentist")
    assert hit.memory.content == "My dentist appointment is tomorrow (2025-05-19)"
    assert shelf.evidence(KALEB, memory_id=hit.memory.id) == []  # position ids are never written as evidence
    assert [e.message_id for e in shelf.evidence(KALEB, key="home_city")] == ["turn-1"]  # the caller's own id


def test_a_long_thread_is_learned_in_parts(shelf, monkeypatch):
    monkeypatch.setattr(_decide, "MAX_TURNS", 2)
    for city in ("Porto", "Braga", "Faro"):
        shelf.log_message(KALEB, "t1", "user", f"I live in {city}.")
    first = shelf.learn(KALEB, thread="t1")
    assert len(first.messages) == 2 and first.more and fact(shelf, "home_city") == "Braga"
    rest = shelf.learn(KALEB, thread="t1")
    assert len(rest.messages) == 1 and not rest.more and fact(shelf, "home_city") == "Faro"


def test_a_proposal_that_cites_no_turn_of_the_users_is_skipped(shelf, clock):
    """Only the user's own turns teach: the model extractors refuse other evidence themselves, but a proposal of a
    custom extractor citing the assistant's turn ("You live in Paris.") was applied."""
    shelf.log_message(KALEB, "t1", "assistant", "You live in Paris.")
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    plan = shelf.learn(KALEB, thread="t1", extractor=ReadsEveryRole())
    assert [(p.op, p.value) for p in plan.proposals] == [("skip", "Paris"), ("set_fact", "Porto")]
    assert "none of the user's own turns" in plan.proposals[0].reason
    assert fact(shelf, "home_city") == "Porto" and [c.value for c in shelf.fact_history(KALEB, "home_city")] == [
        "Porto"]


def test_forget_thread_with_cascade_takes_only_what_came_only_from_it(shelf, clock):
    shelf.log_message(KALEB, "work", "user", "I work at Acme. I live in Porto.")
    shelf.learn(KALEB, thread="work")
    shelf.log_message(KALEB, "home", "user", "I live in Porto. I have a dog named Rex.")
    shelf.learn(KALEB, thread="home")
    written = shelf.remember(KALEB, "work", "Kaleb's desk is by the window.")

    erased = shelf.forget_thread(KALEB, "work", cascade=True)

    assert erased.messages == 1 and erased.facts == 1  # the employer; home_city was said in both threads
    assert fact(shelf, "employer") is None and shelf.fact_history(KALEB, "employer") == []
    assert fact(shelf, "home_city") == "Porto"
    assert [e.thread for e in shelf.evidence(KALEB, key="home_city")] == ["home"]
    assert shelf.get(KALEB, written.id).content == "Kaleb's desk is by the window."
    assert shelf.messages(KALEB, "work") == [] and shelf.store.learn_mark(KALEB, "work") is None
    assert shelf.store.learn_mark(KALEB, "home") is not None


@pytest.mark.parametrize("first", ["t1", "t2"])
def test_a_memory_said_again_in_another_thread_stays_until_both_are_forgotten(shelf, clock, first):
    """A memory the rules learned in one thread and the user said again in another was skipped there ("already
    remembered") with no evidence, so forgetting the first thread took it although the second still says it (and
    that thread, read, teaches nothing more). As a fact said again, its second thread is its evidence too."""
    shelf.log_message(KALEB, "t1", "user", "Remember that I love jazz.")
    [learned] = shelf.learn(KALEB, thread="t1").applied
    clock.advance(60)
    shelf.log_message(KALEB, "t2", "user", "Remember that I love jazz.")
    assert [p.reason for p in shelf.learn(KALEB, thread="t2").proposals] == ["already remembered"]
    assert sorted(e.thread for e in shelf.evidence(KALEB, memory_id=learned.record)) == ["t1", "t2"]

    shelf.forget_thread(KALEB, first, cascade=True)
    assert [m.content for m in shelf.list_memories(KALEB)[0]] == ["I love jazz"]
    erased = shelf.forget_thread(KALEB, {"t1": "t2", "t2": "t1"}[first], cascade=True)
    assert erased.memories == 1 and shelf.list_memories(KALEB)[0] == []


def test_forget_thread_with_cascade_keeps_a_learned_memory_the_caller_then_remembered(shelf, clock):
    """The assistant learns a line from the conversation, then the caller's own code remembers the same line:
    forgetting the conversation takes what only it taught, and leaves what the caller said."""
    shelf.log_message(KALEB, "t1", "user", "Remember that my sister's wedding is in Faro. I live in Porto.")
    [learned] = [p for p in shelf.learn(KALEB, thread="t1").applied if p.op == "remember"]
    memory = shelf.get(KALEB, learned.record)
    assert [e.thread for e in shelf.evidence(KALEB, memory_id=memory.id)] == ["t1"]
    clock.advance(60)

    again = shelf.remember(KALEB, memory.topic, memory.content)

    assert again.id == memory.id and shelf.evidence(KALEB, memory_id=memory.id) == []
    erased = shelf.forget_thread(KALEB, "t1", cascade=True)
    assert (erased.memories, erased.facts) == (0, 1)  # home_city was only learned
    assert [h.memory.id for h in shelf.search(KALEB, "sister wedding")] == [memory.id]
    assert "Faro" in shelf.build_prompt("base", KALEB, "where is the wedding") and fact(shelf, "home_city") is None


def test_forget_thread_with_cascade_keeps_what_the_caller_set(shelf, clock):
    """A fact learned from a thread, then set by the caller: forgetting the thread takes the learned value from the
    history and leaves the caller's (before, the whole fact went, the caller's value with it). A learned value that
    had replaced the caller's gives way to it again."""
    shelf.log_message(KALEB, "t1", "user", "I work at Acme.")
    shelf.learn(KALEB, thread="t1")
    clock.advance(60)
    shelf.set_fact(KALEB, "employer", "Initech")
    shelf.set_fact(KALEB, "home_city", "Faro", "inferred")
    clock.advance(60)
    shelf.log_message(KALEB, "t2", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="t2")
    assert fact(shelf, "home_city") == "Porto"  # mined outranks the guess
    taught = [r for r in records(shelf) if r["kind"] == "evidence"]
    assert len(taught) == 2 and all(r["set_at"] for r in taught)  # an export carries which value each taught
    shelf.import_(MAYA, records(shelf))
    assert shelf.forget_thread(MAYA, "t1", cascade=True).fact_changes == 1
    assert fact(shelf, "employer", MAYA) == "Initech"

    first, second = (shelf.forget_thread(KALEB, thread, cascade=True) for thread in ("t1", "t2"))

    assert (first.facts, first.fact_changes, second.facts, second.fact_changes) == (0, 1, 0, 1)
    assert [(f.key, f.value, f.source) for f in shelf.facts(KALEB)] == [
        ("employer", "Initech", "stated"), ("home_city", "Faro", "inferred")]
    assert [c.value for c in shelf.fact_history(KALEB, "employer")] == ["Initech"]
    assert [(f.key, f.value) for f in shelf.facts(KALEB, as_of=shelf.now())] == [
        ("employer", "Initech"), ("home_city", "Faro")]
    exported = [r for r in records(shelf) if r["kind"] == "evidence"]
    assert exported == []  # the evidence went with the threads


@pytest.mark.parametrize("first", ["a", "b"])
def test_a_fact_said_again_in_another_thread_stays_until_both_are_forgotten(shelf, clock, first):
    """A value taught in one thread and said again in another is held by both: forgetting either leaves it, and
    forgetting the other then takes it, and the value before it comes back. (The second thread's evidence named no
    value, so once the first was forgotten the value stayed for good, with no evidence left.)"""
    shelf.set_fact(KALEB, "home_city", "Lisbon", "mined")
    clock.advance(60)
    shelf.log_message(KALEB, "a", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="a")
    clock.advance(60)
    shelf.log_message(KALEB, "b", "user", "I live in Porto.")
    assert [p.reason for p in shelf.learn(KALEB, thread="b").proposals] == ["home_city is already 'Porto'"]
    assert [e.set_at for e in shelf.evidence(KALEB, key="home_city")] == [fact_at(shelf, "home_city")] * 2

    kept = shelf.forget_thread(KALEB, first, cascade=True)
    assert (kept.facts, kept.fact_changes) == (0, 0) and fact(shelf, "home_city") == "Porto"
    erased = shelf.forget_thread(KALEB, {"a": "b", "b": "a"}[first], cascade=True)
    assert (erased.facts, erased.fact_changes) == (0, 1)
    assert fact(shelf, "home_city") == "Lisbon" and shelf.evidence(KALEB, key="home_city") == []
    assert [c.value for c in shelf.fact_history(KALEB, "home_city")] == ["Lisbon"]


@pytest.mark.parametrize("first", ["a", "b"])
def test_values_two_threads_taught_go_with_their_threads(shelf, clock, first):
    """Thread a taught Porto, thread b then taught Faro: forgetting a takes Porto from the history (before, the key
    had evidence in b and nothing of a's went, so forgetting b next brought a's Porto back as the current value)."""
    shelf.log_message(KALEB, "a", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="a")
    clock.advance(60)
    shelf.log_message(KALEB, "b", "user", "I live in Faro.")
    shelf.learn(KALEB, thread="b")

    shelf.forget_thread(KALEB, first, cascade=True)
    assert [c.value for c in shelf.fact_history(KALEB, "home_city")] == [{"a": "Faro", "b": "Porto"}[first]]
    assert fact(shelf, "home_city") == {"a": "Faro", "b": "Porto"}[first]
    erased = shelf.forget_thread(KALEB, {"a": "b", "b": "a"}[first], cascade=True)
    assert (erased.facts, erased.fact_changes) == (1, 1)
    assert fact(shelf, "home_city") is None and shelf.fact_history(KALEB, "home_city") == []
    assert shelf.evidence(KALEB, key="home_city") == []


def test_a_value_the_caller_set_and_a_thread_said_again_stays_the_callers(shelf, clock):
    """The caller set the value; a thread that says it again is no evidence of it, so forgetting the thread with
    cascade leaves it, even when the key has evidence of an older learned value."""
    shelf.log_message(KALEB, "a", "user", "I live in Faro.")
    shelf.learn(KALEB, thread="a")
    clock.advance(60)
    shelf.set_fact(KALEB, "home_city", "Porto")
    clock.advance(60)
    shelf.log_message(KALEB, "b", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="b")
    assert [e.thread for e in shelf.evidence(KALEB, key="home_city")] == ["a"]

    for thread in ("b", "a"):
        shelf.forget_thread(KALEB, thread, cascade=True)
    assert fact(shelf, "home_city") == "Porto"
    assert [(c.value, c.source) for c in shelf.fact_history(KALEB, "home_city")] == [("Porto", "stated")]


def test_evidence_that_names_no_value_keeps_the_fact_for_its_thread(shelf, backend, target, clock):
    """Evidence written before memshelf kept which value it taught (set_at NULL), or a value said again before it
    named the value (SAID_AGAIN): in another thread it may hold any value, so forgetting a thread that taught one
    erases nothing of the key, as before."""
    shelf.log_message(KALEB, "a", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="a")
    shelf.log_message(KALEB, "b", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="b")
    _run_sql(backend, target, "UPDATE learned_from SET set_at = NULL WHERE thread = 'b'")
    assert shelf.forget_thread(KALEB, "a", cascade=True).fact_changes == 0
    assert fact(shelf, "home_city") == "Porto"
    erased = shelf.forget_thread(KALEB, "b", cascade=True)  # the old rule: the fact goes whole with its last thread
    assert erased.facts == 1 and shelf.fact_history(KALEB, "home_city") == []


def test_forget_user_leaves_nothing_learned_behind(shelf):
    shelf.log_message(KALEB, "t1", "user", "I live in Porto. Remember that I take the 8:15 train.")
    shelf.learn(KALEB, thread="t1")
    shelf.log_message(MAYA, "t1", "user", "I live in Faro.")
    shelf.learn(MAYA, thread="t1")
    shelf.forget_user(KALEB)
    assert shelf.store.learn_marks(KALEB) == {} and shelf.store.evidence(KALEB, None, None) == []
    assert [r["kind"] for r in records(shelf)] == ["memshelf-export"]
    assert shelf.store.learn_marks(MAYA) and shelf.store.evidence(MAYA, None, None)


def _run_sql(backend: str, target: str, statement: str) -> None:
    """Change the database behind memshelf's back (as the test server's superuser on PostgreSQL)."""
    if backend == "sqlite":
        with contextlib.closing(sqlite3.connect(target, isolation_level=None)) as conn:
            conn.execute(statement)
        return
    import psycopg

    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute(statement)  # type: ignore[arg-type]


_REFUSE_MARKS = {
    "sqlite": "CREATE TRIGGER refuse_marks BEFORE INSERT ON learn_marks BEGIN SELECT RAISE(ABORT, 'disk says no'); END",
    "postgres": "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION"
                " 'disk says no'; END $$; CREATE TRIGGER refuse_marks BEFORE INSERT ON learn_marks FOR EACH ROW"
                " EXECUTE FUNCTION refuse()",
}


def test_a_failure_at_the_end_of_a_plan_writes_none_of_it(shelf, backend, target):
    """The watermark is the plan's last write: when the database refuses it, the facts, memories and evidence
    written before it in the same transaction are gone too, and the next call learns the same messages."""
    shelf.log_message(KALEB, "t1", "user", "I live in Porto. Remember that I take the 8:15 train.")
    _run_sql(backend, target, _REFUSE_MARKS[backend])

    with pytest.raises(MemshelfError, match="disk says no"):
        shelf.learn(KALEB, thread="t1")

    assert shelf.facts(KALEB) == [] and shelf.list_memories(KALEB)[0] == []
    assert shelf.store.evidence(KALEB, None, None) == [] and shelf.store.learn_mark(KALEB, "t1") is None
    _run_sql(backend, target, "DROP TRIGGER refuse_marks" + (" ON learn_marks" if backend == "postgres" else ""))
    plan = shelf.learn(KALEB, thread="t1")
    assert len(plan.messages) == 1 and fact(shelf, "home_city") == "Porto" and shelf.list_memories(KALEB)[0]


def test_a_failed_write_leaves_no_record_and_no_watermark(tmp_path):
    """The transaction cannot start (another process holds the file's write lock): nothing is written, the watermark
    stays, and learning again once the lock is gone reads the same messages."""
    path = str(tmp_path / "shelf.db")
    with Shelf(SQLiteStore(path, busy_timeout_ms=50), embedder=None) as shelf:
        shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(Exception, match="busy"):
                shelf.learn(KALEB, thread="t1")
            other.execute("ROLLBACK")
        assert shelf.facts(KALEB) == [] and shelf.store.learn_mark(KALEB, "t1") is None
        assert len(shelf.learn(KALEB, thread="t1").messages) == 1 and fact(shelf, "home_city") == "Porto"


def test_migrate_copies_what_learning_keeps(tmp_path, target, clock):
    """A SQLite file with learned records, a superseded memory, evidence and watermarks, copied to each backend:
    the copy is verified record by record (the export's lines), so each of them is there, as it was."""
    source = str(tmp_path / "source.db")
    with Shelf.open(source, embedder=None, clock=clock) as shelf:
        old = shelf.remember(KALEB, "work", "Kaleb works at Acme.")
        shelf.log_message(KALEB, "t1", "user", "I live in Porto. I work at Globex now.")
        told = Scripted(lambda turns: [Proposal("supersede", "stated", (turns[0].id,), topic="work",
                                                content="Kaleb works at Globex.", replaces=old.id),
                                       Proposal("set_fact", "mined", (turns[0].id,), key="home_city", value="Porto")])
        shelf.learn(KALEB, thread="t1", extractor=told)
        exported = records(shelf)

    report = migrate(source, target).as_dict()

    assert report["copied"] == {"memories": 2, "facts": 1, "fact_changes": 1, "messages": 1, "evidence": 2,
                                "learn_marks": 1}
    [verified] = [v for v in report["verified"] if (v["tenant"], v["user"]) == ("home", "kaleb")]
    assert verified["evidence"] == 2
    with Shelf.open(target, embedder=None, clock=clock) as copy:
        assert records(copy) == exported
        assert copy.get(KALEB, old.id).superseded_by is not None
        assert copy.learn(KALEB, thread="t1").messages == ()  # the watermark came along


def test_a_value_the_caller_sets_in_the_instant_learning_set_one_stays_the_callers(shelf, clock):
    """A clock that does not move between two calls (a coarse one; here, a test's) gave the learned value and the
    caller's the same instant, and evidence names a value by its instant: forgetting the thread erased both, and
    the fact with them. The second value is stamped a microsecond later."""
    shelf.log_message(KALEB, "t", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="t")
    callers = shelf.set_fact(KALEB, "home_city", "Faro")
    shelf.set_fact(KALEB, "employer", "Acme")
    shelf.set_fact(KALEB, "employer", "Initech")

    assert callers.updated_at == shelf.now() + timedelta(microseconds=1)
    assert [c.set_at - shelf.now() for c in shelf.fact_history(KALEB, "employer")] == [timedelta(0),
                                                                                        timedelta(microseconds=1)]
    erased = shelf.forget_thread(KALEB, "t", cascade=True)
    assert (erased.facts, erased.fact_changes) == (0, 1)
    assert fact(shelf, "home_city") == "Faro" and [c.value for c in shelf.fact_history(KALEB, "home_city")] == ["Faro"]


def test_two_learns_of_one_thread_at_once_apply_it_once(shelf, clock):
    """Two callers (two workers, two processes) learn the same thread at once: both read from the same watermark,
    and the second to apply wrote every proposal again (the memory seen twice, its evidence twice, the fact set
    twice). The watermark is compared as it is moved: the later plan is dropped and its learn reads again, after
    the first one's watermark, where nothing is left."""
    shelf.log_message(KALEB, "t1", "user", "I live in Porto. Remember that I take the 8:15 train.")
    both_read = threading.Barrier(2)

    def read_then_wait(turns: list[Turn]) -> list[Proposal]:
        proposals = RulesExtractor().propose(turns)
        if proposals:  # the second reading (after the other applied) finds nothing to wait for
            both_read.wait(timeout=10)
        return proposals

    plans: list[Plan] = []
    workers = [threading.Thread(target=lambda: plans.append(shelf.learn(KALEB, thread="t1",
                                                                          extractor=Scripted(read_then_wait))))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)

    assert sorted(len(plan.applied) for plan in plans) == [0, 2]
    [memory] = shelf.list_memories(KALEB)[0]
    assert memory.observations == 1 and len(shelf.evidence(KALEB, memory_id=memory.id)) == 1
    assert [c.value for c in shelf.fact_history(KALEB, "home_city")] == ["Porto"]
    assert len(shelf.evidence(KALEB, key="home_city")) == 1


def test_a_learn_that_other_learns_keep_overtaking_says_so_and_writes_nothing(shelf, clock):
    """Each time this learn has decided, another caller has logged a turn and learned the thread: after three
    readings it gives up with Conflict, and nothing it decided is written."""
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    cities = iter(["Faro", "Lisbon", "Braga"])

    def overtaken(turns: list[Turn]) -> list[Proposal]:
        shelf.learn(KALEB, thread="t1")  # what this call read, and was about to apply
        shelf.log_message(KALEB, "t1", "user", f"I live in {next(cities)}.")  # what its next reading finds
        return [Proposal("set_fact", "stated", (turns[-1].id,), key="employer", value="Acme")]

    with pytest.raises(Conflict, match=r"changed while it decided, 3 times over \(other learns of the thread, or "
                                       r"erasures\): learn again once they are done; nothing of this call was written"):
        shelf.learn(KALEB, thread="t1", extractor=Scripted(overtaken))
    assert fact(shelf, "employer") is None and fact(shelf, "home_city") == "Lisbon"
    assert [p.value for p in shelf.learn(KALEB, thread="t1").applied] == ["Braga"]


@pytest.mark.parametrize("learned_before", [False, True])
def test_a_thread_forgotten_while_a_learn_decides_stays_forgotten(shelf, clock, learned_before):
    """forget_thread runs between a learn's reading and its applying (a model extractor takes seconds): nothing the
    learn read may come back, neither what it taught, nor evidence naming erased messages, nor a watermark."""
    if learned_before:
        shelf.log_message(KALEB, "t1", "user", "I work at Acme.")
        shelf.learn(KALEB, thread="t1")
    shelf.log_message(KALEB, "t1", "user", "I live in Porto. Remember that I take the 8:15 train.")

    def forgotten_meanwhile(turns: list[Turn]) -> list[Proposal]:
        if turns:
            shelf.forget_thread(KALEB, "t1", cascade=True)
        return RulesExtractor().propose(turns)

    plan = shelf.learn(KALEB, thread="t1", extractor=Scripted(forgotten_meanwhile))

    assert not plan.applied and plan.messages == ()
    assert shelf.facts(KALEB) == [] and shelf.list_memories(KALEB)[0] == []
    assert shelf.evidence(KALEB) == [] and shelf.store.learn_marks(KALEB) == {}


@pytest.mark.parametrize("erasure", ["forget_user", "forget_thread"])
def test_an_erasure_that_starts_while_a_learn_writes_erases_what_it_wrote(shelf, clock, monkeypatch, erasure):
    """A learn is inside its transaction, writing, when the user (or the thread, with cascade) is erased from
    another connection. On PostgreSQL the erasure used to delete the memories and facts at once (the learn's were
    not committed yet, so not seen) and then wait for the messages the learn held: the learned records outlived
    the erasure. The erasure now takes the messages first, so it waits for the learn, then sees all it wrote."""
    shelf.log_message(KALEB, "t1", "user", "I live in Porto. Remember that I take the 8:15 train.")
    writing, go_on = threading.Event(), threading.Event()
    add_evidence = shelf.store.add_evidence

    def slow_evidence(owner: Owner, rows: Sequence) -> None:
        writing.set()
        go_on.wait(timeout=10)
        add_evidence(owner, rows)

    monkeypatch.setattr(shelf.store, "add_evidence", slow_evidence)
    learner = threading.Thread(target=lambda: shelf.learn(KALEB, thread="t1"))
    learner.start()
    assert writing.wait(timeout=10)
    erase = (lambda: shelf.forget_user(KALEB)) if erasure == "forget_user" else \
        (lambda: shelf.forget_thread(KALEB, "t1", cascade=True))
    eraser = threading.Thread(target=erase)
    eraser.start()
    eraser.join(timeout=0.5)  # it waits for the learn (the file's lock on SQLite, the messages on PostgreSQL)
    go_on.set()
    learner.join(timeout=30)
    eraser.join(timeout=30)

    assert shelf.facts(KALEB) == [] and shelf.list_memories(KALEB)[0] == []
    assert shelf.evidence(KALEB) == [] and shelf.store.learn_marks(KALEB) == {} and shelf.messages(KALEB) == []


def test_a_value_set_after_a_cascade_left_a_gap_in_one_instant_still_sorts_last(shelf, clock):
    """With a clock that does not move, values were stamped in the first free microsecond: once a cascade erased
    the learned one in the middle, the caller's next value took its place, before the value it replaced, and as_of
    (and a later cascade's replay) read the older one as current."""
    shelf.set_fact(KALEB, "home_city", "Faro", "inferred")
    shelf.log_message(KALEB, "t0", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="t0")
    shelf.set_fact(KALEB, "home_city", "Lisbon", "inferred")
    shelf.forget_thread(KALEB, "t0", cascade=True)
    shelf.set_fact(KALEB, "home_city", "Faro", "inferred")

    history = shelf.fact_history(KALEB, "home_city")
    assert [c.value for c in history] == ["Faro", "Lisbon", "Faro"]
    assert [c.set_at for c in history] == sorted(c.set_at for c in history)
    assert [f.value for f in shelf.facts(KALEB)] == ["Faro"]
    assert [f.value for f in shelf.facts(KALEB, as_of=shelf.now() + timedelta(seconds=1))] == ["Faro"]


def test_a_learned_successor_purged_before_its_thread_is_forgotten_leaves_no_id_behind(shelf, clock):
    """Globex, learned in t2, superseded Acme, then expired and was purged (Acme stays closed by it: a purge is not
    an erasure). Forgetting t2 with cascade erases what it taught, Globex included: Acme takes its place back, and
    the purged id stayed in its superseded_by before."""
    acme = shelf.remember(KALEB, "work", "Kaleb works at Acme.")
    clock.advance(60)
    shelf.log_message(KALEB, "t2", "user", "I left Acme, I work at Globex now.")
    plan = shelf.learn(KALEB, thread="t2", extractor=Scripted(lambda turns: [Proposal(
        "supersede", "stated", (turns[0].id,), topic="work", content="Kaleb works at Globex.", replaces=acme.id)]))
    shelf.set_expiry(KALEB, plan.applied[0].record, ttl=60)
    clock.advance(120)
    shelf.purge_expired()
    assert shelf.get(KALEB, acme.id).superseded_by == plan.applied[0].record

    shelf.forget_thread(KALEB, "t2", cascade=True)

    back = shelf.get(KALEB, acme.id)
    assert (back.superseded_by, back.superseded_at) == (None, None)
    assert [m.id for m in shelf.list_memories(KALEB)[0]] == [acme.id]


def test_the_users_last_word_in_one_learn_is_the_value(shelf, clock):
    """Porto was current; one learn reads "I live in Lisbon." then "I live in Porto.": the rules compared each
    turn with the facts from before the call, so Porto was skipped as already current and Lisbon stayed."""
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="t1")
    clock.advance(60)
    shelf.log_message(KALEB, "t2", "user", "I live in Lisbon.")
    shelf.log_message(KALEB, "t2", "user", "Wait, I got that wrong. I live in Porto.")

    plan = shelf.learn(KALEB, thread="t2")

    assert [(p.op, p.value) for p in plan.proposals] == [("set_fact", "Lisbon"), ("set_fact", "Porto")]
    assert fact(shelf, "home_city") == "Porto"


def test_a_value_said_again_then_replaced_in_one_learn_keeps_that_threads_evidence(shelf, clock):
    """t1 taught Porto; one learn of t2 reads "I live in Porto." then "I live in Lisbon.": t2 said Porto too, so
    forgetting t1 leaves Porto in the history (t2's evidence only went to the value current at the end)."""
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="t1")
    porto_at = fact_at(shelf, "home_city")
    clock.advance(60)
    shelf.log_message(KALEB, "t2", "user", "I live in Porto.")
    shelf.log_message(KALEB, "t2", "user", "We moved last week. I live in Lisbon.")
    shelf.learn(KALEB, thread="t2")
    assert sorted((e.thread, e.set_at == porto_at) for e in shelf.evidence(KALEB, key="home_city")) == [
        ("t1", True), ("t2", False), ("t2", True)]

    shelf.forget_thread(KALEB, "t1", cascade=True)

    assert [c.value for c in shelf.fact_history(KALEB, "home_city")] == ["Porto", "Lisbon"]
    assert fact(shelf, "home_city") == "Lisbon"
    assert shelf.forget_thread(KALEB, "t2", cascade=True).facts == 1 and fact(shelf, "home_city") is None


def test_an_imported_learned_value_keeps_its_instant_and_goes_with_its_thread(shelf, clock):
    """Kaleb's export holds home_city=Porto learned in t1; Maya holds a later guess, Faro. The import makes Porto
    current (mined outranks inferred) at the instant it was learned, where its evidence names it, so forgetting t1
    in Maya takes Porto and gives Faro back."""
    shelf.log_message(KALEB, "t1", "user", "I live in Porto.")
    shelf.learn(KALEB, thread="t1")
    learned_at = fact_at(shelf, "home_city")
    clock.advance(60)
    shelf.set_fact(MAYA, "home_city", "Faro", "inferred")

    shelf.import_(MAYA, records(shelf))

    assert sorted((c.set_at, c.value) for c in shelf.fact_history(MAYA, "home_city"))[0] == (learned_at, "Porto")
    assert fact(shelf, "home_city", MAYA) == "Porto"
    shelf.forget_thread(MAYA, "t1", cascade=True)
    assert fact(shelf, "home_city", MAYA) == "Faro"


@pytest.mark.parametrize("said", ["I live in Porto.", "Remember that I keep the spare key under the mat."])
def test_what_a_thread_says_again_survives_the_teaching_thread_forgotten_while_it_decides(shelf, clock, said):
    """t1 taught it, t2 says it again; t1 is forgotten (cascade) while t2's learn decides: t2's plan skipped it as
    known and cited a value or memory that was gone, so it was lost, and t2's watermark had passed the turn. The
    plan is dropped and t2 read again: it teaches it now."""
    shelf.log_message(KALEB, "t1", "user", said)
    shelf.learn(KALEB, thread="t1")
    shelf.log_message(KALEB, "t2", "user", said)
    forgot: list[bool] = []

    class ForgetsT1Meanwhile(RulesExtractor):  # the rules, shown what is known, with a slow model's window
        def propose(self, turns: Sequence[Turn], known: Known | None = None) -> list[Proposal]:
            if not forgot:
                forgot.append(True)
                shelf.forget_thread(KALEB, "t1", cascade=True)
            return super().propose(turns, known)

    plan = shelf.learn(KALEB, thread="t2", extractor=ForgetsT1Meanwhile())
    assert [p.op for p in plan.proposals] == ["remember" if "Remember" in said else "set_fact"]

    assert [f.value for f in shelf.facts(KALEB)] + [m.content for m in shelf.list_memories(KALEB)[0]] == [
        "Porto" if "Porto" in said else "I keep the spare key under the mat"]
    assert {e.thread for e in shelf.evidence(KALEB)} == {"t2"}


def test_two_learns_of_one_owner_setting_keys_in_opposite_orders_both_apply(shelf, clock, monkeypatch):
    """t1 says home then work, t2 work then home, learned at once: PostgreSQL found a deadlock (each learn held the
    key the other wanted next). A plan is written in one order, facts by key, so one waits for the other."""
    shelf.log_message(KALEB, "t1", "user", "I live in Porto. I work at Acme.")
    shelf.log_message(KALEB, "t2", "user", "I work at Globex. I live in Lisbon.")
    set_fact = shelf.store.set_fact

    def slow_set_fact(*args: Any, **kwargs: Any) -> Fact:
        written = set_fact(*args, **kwargs)
        time.sleep(0.2)  # holding the key's row: time for the other learn to take its first key
        return written

    monkeypatch.setattr(shelf.store, "set_fact", slow_set_fact)
    failures: list[BaseException] = []

    def learn(thread: str) -> None:
        try:
            shelf.learn(KALEB, thread=thread)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failures.append(exc)

    workers = [threading.Thread(target=learn, args=(thread,)) for thread in ("t1", "t2")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)

    assert failures == []
    assert sorted((c.key, c.value) for c in shelf.fact_history(KALEB)) == [
        ("employer", "Acme"), ("employer", "Globex"), ("home_city", "Lisbon"), ("home_city", "Porto")]


def test_forget_messages_beside_a_learn_of_them_does_not_deadlock(shelf, clock, monkeypatch):
    """forget_messages([m2, m1]) deleted in the caller's order while a learn that read both held them in theirs:
    PostgreSQL found a deadlock. Both take the messages in one order now; the learn, second, finds them gone."""
    m1, m2 = shelf.log_messages(KALEB, "t1", [{"role": "user", "content": "I live in Porto."},
                                              {"role": "user", "content": "I work at Acme."}])
    delete_message = shelf.store.delete_message

    def slow_delete(owner: Owner, message_id: str) -> Any:
        erased = delete_message(owner, message_id)
        time.sleep(0.3)  # holding what it deleted: time for the learn to read both and reach its transaction
        return erased

    monkeypatch.setattr(shelf.store, "delete_message", slow_delete)
    failures: list[BaseException] = []

    def run(call: Callable[[], Any]) -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failures.append(exc)

    forget = threading.Thread(target=run, args=(lambda: shelf.forget_messages(KALEB, [m2.id, m1.id]),))
    learn = threading.Thread(target=run, args=(lambda: shelf.learn(KALEB, thread="t1"),))
    forget.start()
    time.sleep(0.1)
    learn.start()
    for worker in (forget, learn):
        worker.join(timeout=60)

    assert failures == []
    assert shelf.messages(KALEB) == [] and shelf.facts(KALEB) == [] and shelf.evidence(KALEB) == []


def test_a_turn_logged_while_another_writer_holds_the_file_is_learned(tmp_path, clock):
    """SQLite: a turn was stamped before it waited for the file's write lock; meanwhile a later turn was stored and
    learned, and the watermark (by time) passed the waiting turn, which no learn then read. Turns are stamped once
    the write may start."""
    shelf = Shelf.open(tmp_path / "shelf.db", embedder=None, clock=clock)
    waiting = threading.Thread(target=lambda: shelf.log_message(KALEB, "t1", "user", "I live in Porto."))
    with shelf.store.atomic():  # another writer: it logs a later turn and learns the thread
        waiting.start()
        time.sleep(0.3)  # the turn above is waiting for the write lock
        clock.advance(1)
        shelf.log_message(KALEB, "t1", "user", "I work at Acme.")
        shelf.learn(KALEB, thread="t1")
    waiting.join(timeout=30)

    shelf.learn(KALEB, thread="t1")

    assert {f.key: f.value for f in shelf.facts(KALEB)} == {"employer": "Acme", "home_city": "Porto"}
    shelf.close()


def test_a_turn_stored_after_a_later_one_was_learned_is_not_left_behind(shelf, clock, monkeypatch):
    """Two loggers of one thread at once: the first stamps its turn, then is slow to store it; the second stamps a
    later turn and stores it, and the thread is learned. On PostgreSQL the learn read the later turn alone and its
    watermark passed the first, stored after it: never learned. A learn's reading now waits for turns being logged."""
    add_message = shelf.store.add_message

    def slow_for_porto(owner: Owner, message: Message) -> Message:
        if "Porto" in message.content:
            time.sleep(0.5)  # stamped, not yet stored
        return add_message(owner, message)

    monkeypatch.setattr(shelf.store, "add_message", slow_for_porto)
    first = threading.Thread(target=lambda: shelf.log_message(KALEB, "t1", "user", "I live in Porto."))
    first.start()
    time.sleep(0.1)

    def later() -> None:
        clock.advance(1)
        shelf.log_message(KALEB, "t1", "user", "I work at Acme.")

    second = threading.Thread(target=later)
    second.start()
    second.join(timeout=30)
    shelf.learn(KALEB, thread="t1")
    first.join(timeout=30)
    shelf.learn(KALEB, thread="t1")

    assert {f.key: f.value for f in shelf.facts(KALEB)} == {"employer": "Acme", "home_city": "Porto"}
