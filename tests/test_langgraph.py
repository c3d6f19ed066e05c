"""ShelfStore, LangGraph's BaseStore over a Shelf, on both backends: random operation sequences give what
LangGraph's own InMemoryStore gives wherever the two define the same result; memshelf's rules (owners, expiry,
erasure) hold through it; search by meaning finds what InMemoryStore's vector search finds; LangMem's memory
tools work on it."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

pytest.importorskip("langgraph.store.base")

from langgraph.store.base import InvalidNamespaceError, PutOp  # noqa: E402
from langgraph.store.memory import InMemoryStore  # noqa: E402

from memshelf import Owner, Shelf  # noqa: E402
from memshelf.errors import InvalidInput  # noqa: E402
from memshelf.integrations.langgraph import ShelfStore  # noqa: E402

OWNERS = [("home", "kaleb"), ("home", "maya"), ("work", "kaleb")]
PATHS = [(), ("notes",), ("notes", "food"), ("prefs",)]
KEYS = ["a", "b", "c.d", "long key with spaces"]
FILTERS = [None, {"tag": "x"}, {"n": {"$gt": 2}}, {"nested": {"z": "p"}}, {"n": {"$ne": 3}, "tag": "y"},
           {"list": [1, 2]}]


def _value(rng: random.Random) -> dict[str, Any]:
    return {"n": rng.randrange(6), "tag": rng.choice("xy"), "nested": {"z": rng.choice("pq")},
            "list": rng.choice([[1, 2], [2, 1], []]), "text": rng.choice(["Porto", "Lisbon café", "naïve ✓"])}


def _seen(items: list[Any]) -> set[tuple[Any, ...]]:
    return {(tuple(i.namespace), i.key, repr(sorted(i.value.items()))) for i in items}


def _prune(reference: InMemoryStore) -> None:
    """InMemoryStore keeps listing a namespace once anything touched it, even a get, and even when it is empty;
    memshelf lists the namespaces that hold items. The reference is kept to those."""
    for namespace in [ns for ns, items in reference._data.items() if not items]:
        del reference._data[namespace]


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_match_langgraphs_in_memory_store(open_shelf: Any, seed: int) -> None:
    rng = random.Random(seed)
    store, reference = ShelfStore(open_shelf()), InMemoryStore()
    checked = 0
    for _ in range(100):
        tenant_user, path, key = rng.choice(OWNERS), rng.choice(PATHS), rng.choice(KEYS)
        namespace = (*tenant_user, *path)
        action = rng.choices(["put", "delete", "get", "search", "list"], weights=[5, 1, 3, 3, 2])[0]
        if action == "put":
            value = _value(rng)
            store.put(namespace, key, value)
            reference.put(namespace, key, value)
        elif action == "delete":
            store.delete(namespace, key)
            reference.delete(namespace, key)
        elif action == "get":
            got, expected = store.get(namespace, key), reference.get(namespace, key)
            if expected is None:
                assert got is None
            else:
                assert got is not None and (got.namespace, got.key, got.value) == (namespace, key, expected.value)
                assert got.created_at <= got.updated_at and got.created_at.tzinfo is not None
        elif action == "search":
            prefix = (*tenant_user, *path[:rng.randrange(len(path) + 1)])
            where = rng.choice(FILTERS)
            everything = store.search(prefix, filter=where, limit=100)
            assert _seen(everything) == _seen(reference.search(prefix, filter=where, limit=100))
            # unqueried order: InMemoryStore gives insertion order, memshelf the newest put first
            updated = [item.updated_at for item in everything]
            assert updated == sorted(updated, reverse=True)
            limit, offset = rng.randrange(1, 4), rng.randrange(3)
            assert store.search(prefix, filter=where, limit=limit, offset=offset) == everything[offset:offset + limit]
            checked += bool(everything)
        else:
            _prune(reference)
            options: dict[str, Any] = {"prefix": rng.choice([tenant_user[:1], tenant_user, namespace])}
            if rng.random() < 0.3:
                options["suffix"] = rng.choice([("food",), ("*",), ("notes", "*")])
            if rng.random() < 0.4:
                options["max_depth"] = rng.randrange(1, 5)
            options["limit"], options["offset"] = rng.randrange(1, 8), rng.randrange(3)
            assert store.list_namespaces(**options) == reference.list_namespaces(**options)
    assert checked >= 5  # the sequences did compare some non-empty searches


def test_the_same_calls_through_the_async_api(open_shelf: Any) -> None:
    store = ShelfStore(open_shelf())
    namespace = ("home", "kaleb", "notes")

    async def converse() -> tuple[Any, ...]:
        await store.aput(namespace, "printer", {"text": "The printer is on 192.168.1.40."})
        found = await store.asearch(("home", "kaleb"), query="printer address")
        got = await store.aget(namespace, "printer")
        await store.adelete(namespace, "printer")
        return found, got, await store.aget(namespace, "printer"), await store.alist_namespaces(prefix=("home",))

    found, got, gone, namespaces = asyncio.run(converse())
    assert [(i.key, i.value["text"]) for i in found] == [("printer", "The printer is on 192.168.1.40.")]
    assert found[0].score is not None and got.value == found[0].value
    assert gone is None and namespaces == []


def test_search_by_meaning_ranks_as_langgraphs_vector_search(open_shelf: Any, local_embedder: Any) -> None:
    fields = {"fields": ["text"]}
    store = ShelfStore(open_shelf(embedder=local_embedder), index=fields)
    reference = InMemoryStore(index={**fields, "dims": 384,
                                     "embed": lambda texts: [list(map(float, local_embedder.embed(t))) for t in texts]})
    notes = {"bakery": "There is a bakery around the corner that opens at seven.",
             "printer": "The office printer jams on thick paper.",
             "holiday": "We spent last summer hiking in the Alps."}
    for key, text in notes.items():
        # the metadata shares words with the questions: only the indexed field should decide the meaning
        value = {"text": text, "meta": "saved while talking about breakfast, printing and travel"}
        store.put(("home", "kaleb", "notes"), key, value)
        reference.put(("home", "kaleb", "notes"), key, value)
    for question, best in [("Where can I buy fresh bread in the morning?", "bakery"),
                           ("Which device keeps failing with heavy cardstock?", "printer"),
                           ("Where did we go walking in the mountains?", "holiday")]:
        ours = store.search(("home", "kaleb"), query=question, limit=3)
        theirs = reference.search(("home", "kaleb"), query=question, limit=3)
        assert ours[0].key == theirs[0].key == best, question
        assert ours[0].score is not None and ours[0].score >= (ours[1].score if len(ours) > 1 else 0)
    # the shelf's own search and context see the items too, under the owner
    shelf = store.shelf
    assert "bakery" in shelf.context(Owner("home", "kaleb"), "fresh bread in the morning")


def test_put_replaces_the_item_and_a_repeat_is_another_observation(open_shelf: Any) -> None:
    shelf = open_shelf()
    store = ShelfStore(shelf)
    namespace, owner = ("home", "kaleb", "prefs"), Owner("home", "kaleb")
    store.put(namespace, "food", {"likes": "pizza"})
    first = store.get(namespace, "food")
    store.put(namespace, "food", {"likes": "pizza"})
    again = store.get(namespace, "food")
    assert again.created_at == first.created_at and again.updated_at >= first.updated_at
    assert shelf.list_memories(owner)[0][0].observations == 2
    store.put(namespace, "food", {"likes": "pasta"})
    assert store.get(namespace, "food").value == {"likes": "pasta"}
    memories = shelf.list_memories(owner)[0]
    assert len(memories) == 1 and memories[0].topic == "prefs.food" and '"pasta"' in memories[0].content


def test_the_json_wrapping_matches_no_question(open_shelf: Any) -> None:
    store = ShelfStore(open_shelf())
    for key, text in [("a", "Kaleb likes pizza."), ("b", "The car is blue."), ("c", "Rent is due monthly.")]:
        store.put(("home", "kaleb"), key, {"content": text}, ttl=60)
    assert [i.key for i in store.search(("home", "kaleb"), query="what is the key to the car")] == ["b"]
    assert store.search(("home", "kaleb"), query="the path to the value, its ttl") == []


def test_a_put_stopped_half_way_reads_as_the_newest_value_and_the_next_put_tidies(open_shelf: Any,
                                                                                  clock: Any) -> None:
    shelf = open_shelf(clock=clock)
    store = ShelfStore(shelf)
    namespace, owner = ("home", "kaleb"), Owner("home", "kaleb")
    store.put(namespace, "city", {"name": "Porto"})
    clock.advance(1)
    # what a put leaves when it stops between writing the new memory and erasing the old one
    shelf.remember(owner, "city", '{"p":[],"k":"city","v":{"name":"Lisbon"}}')
    assert store.get(namespace, "city").value == {"name": "Lisbon"}
    assert [i.value for i in store.search(namespace)] == [{"name": "Lisbon"}, {"name": "Porto"}]
    clock.advance(1)
    store.put(namespace, "city", {"name": "Braga"})
    assert [i.value for i in store.search(namespace)] == [{"name": "Braga"}]


def test_items_expire_in_minutes_and_reads_start_the_ttl_again(open_shelf: Any, clock: Any) -> None:
    store = ShelfStore(open_shelf(clock=clock), ttl={"default_ttl": 2})
    namespace = ("home", "kaleb")
    store.put(namespace, "kept", {"text": "read now and then"})
    store.put(namespace, "left", {"text": "never read"})
    store.put(namespace, "forever", {"text": "no ttl"}, ttl=None)
    store.put(namespace, "short", {"text": "half a minute"}, ttl=0.5)
    clock.advance(90)
    assert store.get(namespace, "kept") is not None  # refreshed: 2 minutes from now
    assert store.get(namespace, "short") is None
    assert store.get(namespace, "left", refresh_ttl=False) is not None  # not refreshed
    clock.advance(60)
    assert {i.key for i in store.search(namespace)} == {"forever", "kept"}
    clock.advance(100)
    assert {i.key for i in store.search(namespace, refresh_ttl=False)} == {"forever", "kept"}  # refreshed above
    clock.advance(30)
    assert [i.key for i in store.search(namespace)] == ["forever"]
    with pytest.raises(InvalidInput, match="positive number of minutes"):
        store.put(namespace, "bad", {"text": "x"}, ttl=-1)


def test_owners_stay_apart_and_erasure_reaches_the_items(open_shelf: Any) -> None:
    shelf = open_shelf()
    store = ShelfStore(shelf)
    store.put(("home", "kaleb", "notes"), "wifi", {"text": "The wifi password is on the fridge."})
    store.put(("home", "maya", "notes"), "wifi", {"text": "Maya's wifi is called Garden."})
    store.put(("work", "kaleb", "notes"), "wifi", {"text": "The office wifi needs a badge."})
    shelf.remember(Owner("home", "kaleb"), "wifi", "The router is in the hall.")  # not a ShelfStore item
    found = store.search(("home", "kaleb"), query="wifi")
    assert [(i.namespace, i.value["text"]) for i in found] == [
        (("home", "kaleb", "notes"), "The wifi password is on the fridge.")]
    assert store.get(("home", "maya", "notes"), "wifi").value["text"] == "Maya's wifi is called Garden."
    assert store.list_namespaces(prefix=("home",)) == [("home", "kaleb", "notes"), ("home", "maya", "notes")]
    exported = [r for r in shelf.export(Owner("home", "kaleb")) if r.get("kind") == "memory"]
    assert len(exported) == 2
    shelf.forget_user(Owner("home", "kaleb"))
    assert store.get(("home", "kaleb", "notes"), "wifi") is None
    assert store.list_namespaces(prefix=("home",)) == [("home", "maya", "notes")]
    assert store.list_namespaces(prefix=("work", "kaleb")) == [("work", "kaleb", "notes")]


@pytest.mark.parametrize("call, error, words", [
    (lambda s: s.put(("home",), "k", {"a": 1}), InvalidInput, "names no user"),
    (lambda s: s.search(("home",)), InvalidInput, "names no user"),
    (lambda s: s.search(("home", "*")), InvalidInput, "names no user"),
    (lambda s: s.list_namespaces(), InvalidInput, "names no tenant"),
    (lambda s: s.list_namespaces(prefix=("*", "kaleb")), InvalidInput, "names no tenant"),
    (lambda s: s.put(("home", "kaleb"), "k", {"when": object()}), InvalidInput, "JSON-serialisable"),
    (lambda s: s.put(("home", "kaleb"), "k", {"n": float("nan")}), InvalidInput, "JSON-serialisable"),
    (lambda s: s.put(("home", "kaleb"), "k", {"text": "x" * 20_000}), InvalidInput, "at most 16,000"),
    (lambda s: s.put(("home", "kal\x00eb"), "k", {"a": 1}), InvalidNamespaceError, "NUL"),
    (lambda s: s.put(("home", "kaleb", "a.b"), "k", {"a": 1}), InvalidNamespaceError, "periods"),
    (lambda s: s.batch([PutOp(("home", "kaleb", "a.b"), "k", {"a": 1})]), InvalidNamespaceError, "not allowed"),
    (lambda s: s.search(("home", "kaleb"), filter={"n": {"$near": 1}}), InvalidInput, "unknown filter operator"),
    (lambda s: s.search(("home", "kaleb"), limit=0), InvalidInput, "limit must be"),
    (lambda s: ShelfStore(s.shelf, index={"dims": 3, "embed": lambda t: t}), InvalidInput, "only 'fields'"),
])
def test_bad_calls_are_refused_and_change_nothing(open_shelf: Any, call: Any, error: type, words: str) -> None:
    store = ShelfStore(open_shelf())
    store.put(("home", "kaleb"), "k", {"a": 1})
    store.put(("home", "kaleb"), "n", {"n": 2})
    with pytest.raises(error, match=words) as raised:
        call(store)
    if isinstance(raised.value, InvalidInput):
        assert str(raised.value)  # says what was wrong and what to do
    assert store.get(("home", "kaleb"), "k").value == {"a": 1}
    assert len(store.search(("home", "kaleb"))) == 2


def test_keys_and_paths_that_make_no_topic_still_round_trip(open_shelf: Any) -> None:
    store = ShelfStore(open_shelf())
    odd = [("home", "kaleb", "x" * 150), ("home", "kaleb", "y" * 150)]
    for namespace in odd:
        for key in ["k" * 120, "line\nbreak", "a"]:
            store.put(namespace, key, {"at": [*namespace, key]})
    for namespace in odd:
        for key in ["k" * 120, "line\nbreak", "a"]:
            assert store.get(namespace, key).value == {"at": [*namespace, key]}
    assert len(store.search(("home", "kaleb"), limit=50)) == 6
    # "a.b" under () and "b" under ("a",) share a topic and stay two items
    store.put(("home", "kaleb"), "a.b", {"v": 1})
    store.put(("home", "kaleb", "a"), "b", {"v": 2})
    assert store.get(("home", "kaleb"), "a.b").value == {"v": 1}
    assert store.get(("home", "kaleb", "a"), "b").value == {"v": 2}


def test_langmem_memory_tools_work_on_it(open_shelf: Any, local_embedder: Any) -> None:
    langmem = pytest.importorskip("langmem")
    store = ShelfStore(open_shelf(embedder=local_embedder), index={"fields": ["content"]})
    namespace = ("memories", "{langgraph_user_id}")
    manage = langmem.create_manage_memory_tool(namespace=namespace, store=store)
    search = langmem.create_search_memory_tool(namespace=namespace, store=store)
    kaleb, maya = ({"configurable": {"langgraph_user_id": user}} for user in ("kaleb", "maya"))

    said = manage.invoke({"content": "Kaleb is allergic to peanuts.", "action": "create"}, config=kaleb)
    manage.invoke({"content": "Kaleb plays the cello on Sundays.", "action": "create"}, config=kaleb)
    manage.invoke({"content": "Maya is allergic to cats.", "action": "create"}, config=maya)
    memory_id = said.split()[-1]
    found = search.invoke({"query": "food allergies"}, config=kaleb)
    assert "peanuts" in found and "cats" not in found
    assert store.search(("memories", "kaleb"), query="food allergies")[0].key == memory_id

    manage.invoke({"id": memory_id, "content": "Kaleb is allergic to peanuts and shellfish.", "action": "update"},
                  config=kaleb)
    assert store.get(("memories", "kaleb"), memory_id).value["content"] == "Kaleb is allergic to peanuts and shellfish."
    manage.invoke({"id": memory_id, "action": "delete"}, config=kaleb)
    assert store.get(("memories", "kaleb"), memory_id) is None
    assert [i.value["content"] for i in store.search(("memories", "kaleb"))] == ["Kaleb plays the cello on Sundays."]
    assert [i.value["content"] for i in store.search(("memories", "maya"))] == ["Maya is allergic to cats."]


def test_it_is_the_store_of_a_compiled_graph(open_shelf: Any) -> None:
    graph_module = pytest.importorskip("langgraph.graph")
    from langgraph.store.base import BaseStore

    store = ShelfStore(open_shelf())

    def remember_city(state: dict[str, Any], *, store: BaseStore) -> dict[str, Any]:
        store.put(("home", state["user"]), "city", {"text": state["said"]})
        return {"answer": store.get(("home", state["user"]), "city").value["text"]}

    from typing import TypedDict

    class State(TypedDict, total=False):
        user: str
        said: str
        answer: str

    builder = graph_module.StateGraph(State)
    builder.add_node("remember_city", remember_city)
    builder.add_edge(graph_module.START, "remember_city")
    graph = builder.compile(store=store)
    assert graph.invoke({"user": "kaleb", "said": "I live in Porto."})["answer"] == "I live in Porto."
    assert store.shelf.list_memories(Owner("home", "kaleb"))[0][0].topic == "city"
    assert isinstance(store.shelf, Shelf)


def test_over_a_client_it_answers_as_over_the_shelf(target: str) -> None:
    """The one-line move from embedded to served holds for the store too: the same calls through a Client to a
    real server give what they give on the Shelf."""
    from memshelf import Client
    from memshelf.server import create_app
    from test_server import LiveServer

    def scenario(store: ShelfStore) -> list[Any]:
        kaleb, maya = ("home", "kaleb", "notes"), ("home", "maya")
        store.put(kaleb, "printer", {"text": "The office printer is on 192.168.1.40."})
        store.put(kaleb, "desk", {"text": "I use a standing desk."}, ttl=60)
        store.put(maya, "cat", {"text": "Maya's cat is called Miso.", "n": 3})
        store.put(kaleb, "desk", {"text": "I use a standing desk at work."})
        seen = [store.get(kaleb, "desk").value, store.get(maya, "cat").value, store.get(maya, "printer")]
        seen.append([(i.key, i.value) for i in store.search(("home", "kaleb"), query="printer address")])
        seen.append(sorted(i.key for i in store.search(("home", "kaleb"))))
        seen.append([i.key for i in store.search(maya, filter={"n": {"$gte": 3}})])
        seen.append(store.list_namespaces(prefix=("home",)))
        store.delete(kaleb, "printer")
        seen.append([i.key for i in store.search(("home", "kaleb"))])
        for n in range(40):
            store.put(("home", "ivo"), f"note{n}", {"text": f"Printer note {n}."})
        # 30 wanted: the store asked the server for 120 hits, past its search limit of 100
        seen.append(len(store.search(("home", "ivo"), query="printer note", limit=30)))
        if isinstance(store.shelf, Client):  # past the server's search limit: said, not answered short
            with pytest.raises(InvalidInput, match="at most 100 items"):
                store.search(("home", "ivo"), query="printer note", offset=90, limit=20)
        return seen

    with Shelf.open(target, embedder=None) as shelf:
        embedded = scenario(ShelfStore(shelf))
        shelf.forget_tenant("home")
        secret = shelf.create_key("home")[1]
        with LiveServer(create_app(target=target, embedder=None)) as live, Client(live.url, secret) as client:
            served = scenario(ShelfStore(client))
    assert served == embedded
    assert embedded[3] == [("printer", {"text": "The office printer is on 192.168.1.40."})]
    assert embedded[6] == [("home", "kaleb", "notes"), ("home", "maya")] and embedded[7] == ["desk"]
