"""memshelf.Client against a real server (uvicorn on loopback, both backends): the same assistant loop through the
embedded Shelf and through the Client gives the same answers, errors are the Shelf's exception classes, a busy
server is retried, and the iterators reach every record."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from memshelf import (AsyncClient, Client, ConfigError, Conflict, Erased, InvalidInput, Memory, NotFound, Owner,
                      Shelf, StoreUnavailable, UnknownSource)
from memshelf import model
from memshelf.server import create_app
from test_server import LiveServer, free_port

TENANT = "home"


@dataclasses.dataclass
class Served:
    url: str
    shelf: Shelf
    secret: str
    admin: str


@pytest.fixture
def served(target: str) -> Iterator[Served]:
    with Shelf.open(target, embedder=None) as shelf:
        secret = shelf.create_key(TENANT)[1]
        admin = shelf.create_key(None)[1]
        with LiveServer(create_app(target=target, embedder=None)) as live:
            yield Served(live.url, shelf, secret, admin)


def assistant_loop(memory: Any, owner: Owner) -> list[Any]:
    """What an assistant does with its memory, and what it gets back, without ids and times (which differ)."""
    seen: list[Any] = []
    seen.append(list(memory.search(owner, "Where is the printer?")))
    seen.append(memory.context(owner, "Where is the printer?"))
    for content, source in [("The office printer is on 192.168.1.40.", "stated"),
                            ("The printer jams on thick paper.", "mined"),
                            ("The printer might be on the guest network.", "inferred")]:
        memory.remember(owner, "network", content, source)
    hits = memory.search(owner, "printer", mode="keyword")
    seen.append([(h.memory.content, h.memory.source, h.retriever, sorted(h.details)) for h in hits])
    seen.append((hits.mode, hits.degraded))
    seen.append(memory.context(owner, "What did I say the printer's address was?"))
    seen.append(memory.set_fact(owner, "user_name", "Kaleb").value)
    kept = memory.set_fact(owner, "user_name", "K.", "inferred")
    seen.append((kept.value, kept.note))
    seen.append(memory.build_prompt("You are GLaDOS.", owner, "What did I say the printer's address was?"))
    listed, cursor = memory.list_memories(owner, limit=2, order="confident")
    seen.append([m.content for m in listed])
    seen.append([m.content for m in memory.list_memories(owner, cursor=cursor, order="confident")[0]])
    guess = memory.list_memories(owner, source="inferred")[0][0]
    confirmed = memory.confirm(owner, guess.id)
    seen.append((confirmed.source, confirmed.confidence, confirmed.confirmed_from))
    seen.append(memory.set_expiry(owner, guess.id, ttl=3600).expires_at is not None)
    memory.log_message(owner, "t1", "user", "I live in Porto.")
    logged = memory.log_messages(owner, "t2", [{"role": "user", "content": "My sister lives in Faro."},
                                               {"role": "assistant", "content": "Noted."}])
    seen.append([(m.thread, m.role, m.content) for m in logged])
    plan = memory.learn(owner, thread="t1")
    seen.append([(p.op, p.source, p.key, p.value) for p in plan.proposals])
    seen.append([(e.kind, e.record, e.thread) for e in memory.evidence(owner)])
    seen.append([(f.key, f.value, f.source) for f in memory.facts(owner)])
    seen.append([(c.value, c.source) for c in memory.fact_history(owner, "user_name")])
    seen.append([(m.role, m.content) for m in memory.messages(owner, "t1")])
    seen.append([r["kind"] for r in memory.export(owner)])
    erased = memory.forget(owner, guess.id)
    seen.append(erased.memories)
    seen.append(dataclasses.replace(memory.forget_user(owner), scrub_pending=False))
    seen.append(memory.context(owner, "Where is the printer?"))
    return seen


def test_the_assistant_loop_gives_the_same_answers_embedded_and_served(served: Served) -> None:
    embedded = assistant_loop(served.shelf, Owner(TENANT, "kaleb"))
    with Client(served.url, served.secret) as client:
        remote = assistant_loop(client, Owner(TENANT, "kaleb"))
    assert remote == embedded
    assert embedded[0] == [] and embedded[1] == "" and "192.168.1.40" in embedded[4]


def test_records_come_back_as_the_shelfs_types(served: Served) -> None:
    owner = Owner(TENANT, "maya")
    with Client(served.url, served.secret) as client:
        memory = client.remember(owner, "office", "The printer is on 192.168.1.40.", ttl=3600)
        assert isinstance(memory, Memory) and memory == served.shelf.get(owner, memory.id)
        assert client.get(owner, memory.id) == memory
        hit = client.search(owner, "printer", mode="keyword")[0]
        assert hit.memory == memory and hit.score == pytest.approx(served.shelf.search(owner, "printer",
                                                                                         mode="keyword")[0].score)
        assert client.key().tenant == TENANT
        client.set_fact(owner, "city", "Porto")
        kept = client.set_fact(owner, "city", "Lisbon", "inferred")  # history only: its own time, not Porto's
        assert kept.value == "Porto" and kept.outranked is not None
        assert kept.outranked.set_at == served.shelf.fact_history(owner, "city")[-1].set_at > kept.updated_at


def test_errors_are_the_shelfs_exceptions_with_the_servers_advice(served: Served) -> None:
    owner = Owner(TENANT, "kaleb")
    with Client(served.url, served.secret) as client:
        with pytest.raises(NotFound, match="GET /v1/users/kaleb/memories"):
            client.get(owner, "m_0000000000000000")
        with pytest.raises(UnknownSource, match="crm"):
            client.remember(owner, "office", "A line.", "crm")
        with pytest.raises(InvalidInput):
            client.remember(owner, "office", "   ")
        with pytest.raises(InvalidInput, match="not valid Unicode"):
            client.remember(owner, "office", "a\ud800b")
        with pytest.raises(InvalidInput, match="user_text contains a NUL character"):
            client.build_prompt("base", owner, "a\x00b")
        with pytest.raises(InvalidInput, match="next_cursor"):
            client.list_memories(owner, cursor="not-a-cursor")
        old = client.remember(owner, "home", "Kaleb lives in Porto.", "inferred")
        new = client.remember(owner, "home", "Kaleb lives in Lisbon.")
        served.shelf.store.supersede_memory(owner, old.id, new.id, served.shelf.now())
        with pytest.raises(Conflict, match=new.id):
            client.confirm(owner, old.id)
        with pytest.raises(InvalidInput, match="for tenant 'home', not 'acme'"):
            client.remember(Owner("acme", "kaleb"), "office", "Never sent.")
    with Client(served.url, served.admin) as admin, pytest.raises(ConfigError, match="admin key"):
        admin.search(owner, "printer")
    with Client(served.url, "ms_wrong") as wrong, pytest.raises(ConfigError, match="wrong or revoked"):
        wrong.search(owner, "printer")
    with Client(f"http://127.0.0.1:{free_port()}", served.secret, retries=0) as nowhere, \
            pytest.raises(StoreUnavailable, match="could not be reached"):
        nowhere.search(owner, "printer")
    with pytest.raises(ConfigError, match="http://"):
        Client("127.0.0.1:8077", served.secret)


def test_a_slash_inside_an_id_stays_inside_it(served: Served) -> None:
    """Ids with "/" (or "%") reach their own records: the server decoded "%2F" before routing, so a user
    "kaleb/facts/x" was routed to kaleb's fact "x", and erasing that user erased the fact."""
    kaleb, odd = Owner(TENANT, "kaleb"), Owner(TENANT, "kaleb/facts/x")
    with Client(served.url, served.secret) as client:
        client.set_fact(kaleb, "x", "keep")
        assert client.forget_user(odd) == Erased()
        assert served.shelf.get_fact(kaleb, "x").value == "keep"  # untouched
        slashed = Owner(TENANT, "team/a%2Fb 50%")
        memory = client.remember(slashed, "office", "The printer is on 192.168.1.40.")
        assert [h.memory.id for h in client.search(slashed, "printer", mode="keyword")] == [memory.id]
        assert served.shelf.get(slashed, memory.id) == memory
        assert client.set_fact(slashed, "notes/2026", "kept").value == "kept"
        assert [c.value for c in client.fact_history(slashed, "notes/2026")] == ["kept"]
        assert client.fact_history(slashed, "notes") == []  # no fact "notes": not the history of "notes/2026"
        client.set_fact(kaleb, "home", "Porto")
        with pytest.raises(NotFound):
            client.get_fact(kaleb, "home/history")
        client.log_message(slashed, "support/42", "user", "Where is the printer?")
        assert client.forget_thread(slashed, "support/42").messages == 1
        assert client.forget_user(slashed).memories == 1
        assert served.shelf.facts(slashed) == [] and served.shelf.get_fact(kaleb, "home").value == "Porto"


def test_an_import_counts_what_it_added_as_the_shelf_does(served: Served) -> None:
    taught, embedded, remote = Owner(TENANT, "ines"), Owner(TENANT, "joao"), Owner(TENANT, "rui")
    served.shelf.learn(taught, [{"role": "user", "content": "I live in Porto.", "id": "turn-7"}])
    exported = list(served.shelf.export(taught))
    with Client(served.url, served.secret) as client:
        assert client.import_(remote, exported) == served.shelf.import_(embedded, exported) == {
            "memories": 0, "facts": 1, "messages": 0, "evidence": 1}
        assert client.import_(remote, [r for r in exported if r["kind"] != "evidence"]) == {
            "memories": 0, "facts": 0, "messages": 0}


def test_the_iterators_reach_every_record(served: Served) -> None:
    owner, copy = Owner(TENANT, "bulk"), Owner(TENANT, "bulk-copy")
    with Client(served.url, served.secret) as client:
        stored = client.remember_many(owner, [{"topic": "notes", "content": f"Note number {n}."} for n in range(2300)])
        assert len(stored) == 2300 and len({m.id for m in stored}) == 2300  # three batches
        assert sorted(m.id for m in client.memories(owner)) == sorted(m.id for m in stored)
        assert [m.content for m in client.memories(owner, contains="number 229")][::-1] == [
            f"Note number {n}." for n in range(229, 2300) if str(n).startswith("229")]
        records = list(client.export(owner))
        assert records[0]["kind"] == "memshelf-export" and len(records) == 2301
        assert client.import_(copy, records)["memories"] == 2300
        assert served.shelf.list_users(TENANT)[0][0].user == "bulk"


class Busy:
    """A server that is busy (503, Retry-After: 0) for its first `busy` searches."""

    def __init__(self, busy: int) -> None:
        self.busy, self.calls = busy, 0

    def app(self) -> Starlette:
        async def key(request: Request) -> Response:
            return JSONResponse({"id": "k_1", "tenant": TENANT, "name": "", "created_at": "2026-01-01T00:00:00+00:00",
                                 "revoked_at": None})

        async def search(request: Request) -> Response:
            self.calls += 1
            if self.calls <= self.busy:
                return JSONResponse({"error": {"type": "store_unavailable", "message": "the store is busy: retry"}},
                                    503, headers={"Retry-After": "0"})
            return JSONResponse({"mode": "keyword", "degraded": False, "reason": None, "unembedded": 0, "hits": []})

        return Starlette(routes=[Route("/v1/key", key), Route("/v1/users/{user}/search", search, methods=["POST"])])


def test_batches_over_a_request_go_in_several_and_a_refused_one_keeps_nothing(served: Served) -> None:
    """remember_many and log_messages send requests under the server's 1 MiB body limit (more text than that in
    one call was refused with 413); each request is all or nothing."""
    owner = Owner(TENANT, "kaleb")
    long = "word " * 3_000  # 15,000 characters: 80 of them are 1.2 MB of JSON
    with Client(served.url, served.secret) as client:
        stored = client.remember_many(owner, [{"topic": "notes", "content": f"{i} {long}"} for i in range(80)])
        turns = [{"role": "user" if i % 2 else "assistant", "content": f"{i} {long}"} for i in range(80)]
        logged = client.log_messages(owner, "long", turns)
        with pytest.raises(InvalidInput, match="turn 2"):
            client.log_messages(owner, "long", [{"role": "user", "content": "kept?"},
                                                {"role": "user", "content": " "}])
        with pytest.raises(InvalidInput, match="mapping"):
            client.log_messages(owner, "long", ["Hello."])
        with pytest.raises(NotFound):  # one id is not the user's: none goes
            client.forget_messages(owner, [logged[0].id, "msg_0000000000000000"])
        assert client.forget_messages(owner, [logged[0].id, logged[1].id]).messages == 2
    assert len(stored) == 80 and len(served.shelf.list_memories(owner, limit=100)[0]) == 80
    assert [m.content for m in logged] == [t["content"] for t in turns]
    assert [m.content for m in served.shelf.messages(owner, "long", limit=100)] == [t["content"] for t in turns[2:]]


def test_a_batch_item_no_request_could_carry_is_refused_before_anything_is_sent(served: Served) -> None:
    """The items were checked one request at a time: 1,500 good turns and then one that is not a mapping, or one of
    over a mebibyte, kept the first 1,000 (or the turns before it) while the error said nothing was sent."""
    owner = Owner(TENANT, "ines")
    turns = [{"role": "user", "content": f"Turn {i}."} for i in range(1_500)]
    memories = [{"topic": "notes", "content": f"Note {i}."} for i in range(1_500)]
    with Client(served.url, served.secret) as client:
        with pytest.raises(InvalidInput, match="mapping, got str: nothing of it was sent"):
            client.log_messages(owner, "t", [*turns, "Hello."])  # type: ignore[list-item]
        with pytest.raises(InvalidInput, match="mapping, got str: nothing of it was sent"):
            client.remember_many(owner, [*memories, "Hello."])  # type: ignore[list-item]
        huge = "x" * (1 << 20)
        with pytest.raises(InvalidInput, match=r"turn 2 is [\d,]+ bytes as JSON.*nothing was sent"):
            client.log_messages(owner, "t", [{"role": "user", "content": "first"}, {"role": "user", "content": huge}])
        with pytest.raises(InvalidInput, match=r"memory 1501 is [\d,]+ bytes as JSON.*nothing was sent"):
            client.remember_many(owner, [*memories, {"topic": "notes", "content": huge}])
        assert client.log_messages(owner, "t", turns[:3])[-1].content == "Turn 2."  # the check can pass
        assert client.forget_messages(owner, []) == served.shelf.forget_messages(owner, []) == Erased()
    assert [m.content for m in served.shelf.messages(owner, "t", limit=10)] == ["Turn 0.", "Turn 1.", "Turn 2."]
    assert served.shelf.list_memories(owner)[0] == []


def test_ids_of_only_dots_are_sent_as_ids_not_as_folders(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx resolves a path segment "." or ".." as a folder: forget_thread(owner, "..") was sent as
    DELETE /v1/users/{user} and erased the whole user, and the user "." read the records of whichever user the
    path's next segment named. memshelf now refuses such names when they are made; those an older version wrote
    (made here with the rule off) are still sent as names."""
    alice, dot, facts_user = Owner(TENANT, "alice"), Owner.stored(TENANT, "."), Owner(TENANT, "facts")
    with Client(served.url, served.secret) as client:
        with pytest.raises(InvalidInput, match="thread '..' is a step in a URL's path"):
            client.log_message(alice, "..", "user", "A thread named for the parent folder.")
        client.remember(alice, "office", "Alice's printer is on 192.168.1.40.")
        client.set_fact(alice, "city", "Lisbon")
        client.remember(facts_user, "private", "What only the user named facts said.")
        with monkeypatch.context() as older:
            older.setattr(model, "addressable", lambda kind, value: value)
            client.log_message(alice, "..", "user", "A thread named for the parent folder.")
            client.remember(dot, "notes", "The dot user's own note.")
            assert [m.content for m in client.list_memories(dot)[0]] == ["The dot user's own note."]
            with pytest.raises(NotFound):  # the dot user has no fact "memories" (the user "facts" has memories)
                client.get_fact(dot, "memories")
        assert client.forget_thread(alice, "..").messages == 1
        with pytest.raises(NotFound):  # no fact "..": nothing of Alice's goes
            client.forget_fact(alice, "..")
    assert [m.content for m in served.shelf.list_memories(alice)[0]] == ["Alice's printer is on 192.168.1.40."]
    assert [(f.key, f.value) for f in served.shelf.facts(alice)] == [("city", "Lisbon")]
    with Client(served.url, served.secret) as client, pytest.raises(InvalidInput, match="user '.' is a step"):
        client.list_memories(dot)  # the server makes no such Owner now: the library reaches it (Shelf.list_users)
    assert [m.content for m in served.shelf.list_memories(dot)[0]] == ["The dot user's own note."]
    assert [m.content for m in served.shelf.list_memories(facts_user)[0]] == ["What only the user named facts said."]


def test_a_busy_server_is_retried_then_reported() -> None:
    owner = Owner(TENANT, "kaleb")
    patient = Busy(2)
    with LiveServer(patient.app()) as live, Client(live.url, "ms_x", retries=3) as client:
        assert list(client.search(owner, "printer")) == [] and patient.calls == 3
    hasty = Busy(5)
    with LiveServer(hasty.app()) as live, Client(live.url, "ms_x", retries=1) as client:
        with pytest.raises(StoreUnavailable, match="busy"):
            client.search(owner, "printer")
        assert hasty.calls == 2


def test_the_async_client_has_the_same_verbs(served: Served) -> None:
    owner = Owner(TENANT, "cy")

    async def converse() -> tuple[list[str], str, int]:
        async with AsyncClient(served.url, served.secret) as memory:
            await memory.remember(owner, "office", "The printer is on 192.168.1.40.")
            await memory.set_fact(owner, "user_name", "Cy")
            hits = await memory.search(owner, "printer", mode="keyword")
            prompt = await memory.build_prompt("Base.", owner, "printer")
            exported = await memory.export(owner)
            return [h.memory.content for h in hits], prompt, len(exported)

    contents, prompt, records = asyncio.run(converse())
    assert contents == ["The printer is on 192.168.1.40."] and records == 4
    assert prompt == served.shelf.build_prompt("Base.", owner, "printer")
