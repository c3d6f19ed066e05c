"""Provenance and integrity, on both backends: imports are checked like remember(), importing twice adds nothing,
a guess never replaces what the user said, expired records stay out of exports, dedup ignores whitespace, erasing
a tenant revokes its keys, and cursors are opaque and owner-scoped."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, UTC
from typing import Any

import httpx
import numpy as np
import pytest
from test_server import LiveServer, assert_error, bearer

from memshelf import InvalidInput, Owner, Shelf, UnknownSource
from memshelf.server import create_app

KALEB = Owner("home", "kaleb")
MAYA = Owner("acme", "maya")
EXPORT_HEADER = {"kind": "memshelf-export", "format": 1}


def memories(shelf, owner):
    return [r for r in shelf.export(owner) if r["kind"] == "memory"]


def memory_record(shelf, **fields: Any) -> dict[str, Any]:
    """A valid memory record stamped at the shelf's now, with `fields` replaced."""
    now = shelf.now().isoformat()
    return {"kind": "memory", "id": "m_0123456789abcdef", "topic": "network", "content": "The printer is on 10.0.0.7.",
            "source": "stated", "confidence": 1.0, "created_at": now, "last_seen": now, "observations": 1,
            "expires_at": None, "embed_model": None, "embedding": None, **fields}


def nested(depth: int = 100_000) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def vector_text(values) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


# ---------------------------------------------------------------- 1. import checks every field
@pytest.mark.parametrize("field, value", [
    ("observations", -5), ("observations", 1e30), ("observations", 0), ("observations", True), ("observations", "3"),
    ("created_at", "0999-01-01T00:00:00+00:00"), ("created_at", "2999-01-01T00:00:00+00:00"),
    ("created_at", "2026-01-01T12:00:00"), ("created_at", "yesterday"), ("created_at", 5),
    ("last_seen", "1999-01-01T00:00:00+00:00"), ("id", "../../x"), ("id", "m_1"), ("id", "msg_0123456789abcdef"),
    ("id", nested()), ("topic", nested()), ("content", "   "), ("expires_at", "2020-01-01T00:00:00+00:00"),
    ("embedding", "not base64!"), ("embedding", vector_text([1.0, float("nan"), 0.5])),
])
def test_a_bad_memory_record_is_refused_by_number_and_field(shelf, field, value):
    good = memory_record(shelf, id="m_aaaaaaaaaaaaaaaa", content="kept out too")
    bad = memory_record(shelf, **{field: value}, **({"embed_model": "local:x"} if field == "embedding" else {}))
    with pytest.raises(InvalidInput, match=f"record 3: field '{field}'.*nothing was imported"):
        shelf.import_(KALEB, [EXPORT_HEADER, good, bad])
    assert memories(shelf, KALEB) == []


def test_a_bad_message_or_fact_record_is_refused(shelf):
    now = shelf.now().isoformat()
    message = {"kind": "message", "id": "msg_0123456789abcdef", "thread": "t", "role": "user", "content": "hi",
               "created_at": now, "expires_at": None}
    for bad, field in [(dict(message, id="../x"), "id"), (dict(message, created_at="2999-01-01T00:00:00+00:00"),
                                                           "created_at"),
                       (dict(message, expires_at=now), "expires_at"),
                       ({"kind": "fact_change", "key": "k", "value": "v", "source": "stated", "set_at": "0999-01-01"
                                                                                                     "T00:00:00+00:00"},
                        "set_at")]:
        with pytest.raises(InvalidInput, match=f"record 1: field '{field}'"):
            shelf.import_(KALEB, [bad])
    with pytest.raises(InvalidInput, match="record 2 is nested too deeply|record 2: unknown record kind"):
        shelf.import_(KALEB, [EXPORT_HEADER, {"kind": nested()}])
    with pytest.raises(InvalidInput, match="record 1: field 'kind' is missing"):
        shelf.import_(KALEB, [{"topic": "t"}])
    assert list(shelf.export(KALEB)) == [EXPORT_HEADER]


@pytest.mark.parametrize("confidence", [1000, float("inf"), float("nan"), -3, "high"])
def test_confidence_comes_from_the_source_not_the_record(shelf, confidence):
    shelf.import_(KALEB, [memory_record(shelf, source="inferred", confidence=confidence)])
    [hit] = shelf.search(KALEB, "printer")
    assert hit.memory.confidence == 0.4
    assert [m.confidence for m in shelf.list_memories(KALEB)[0]] == [0.4]
    assert memories(shelf, KALEB)[0]["confidence"] == 0.4


def test_a_short_vector_stamped_with_the_embedders_model_is_embedded_again(open_shelf, clock, local_embedder):
    shelf = open_shelf(clock=clock, embedder=local_embedder)
    record = memory_record(shelf, embed_model=local_embedder.model, embedding=vector_text([0.1, 0.2, 0.3]))
    assert shelf.import_(KALEB, [record])["memories"] == 1
    [stored] = memories(shelf, KALEB)
    assert len(base64.b64decode(stored["embedding"])) == 4 * local_embedder.dimensions
    assert [h.memory.content for h in shelf.search(KALEB, "Where is the printer?", mode="semantic")] == [
        "The printer is on 10.0.0.7."]
    assert shelf.backfill() == 0


def test_a_vector_of_another_model_must_agree_with_that_models_length(shelf):
    shelf.import_(KALEB, [memory_record(shelf, embed_model="ollama:other", embedding=vector_text(np.ones(8)))])
    assert len(base64.b64decode(memories(shelf, KALEB)[0]["embedding"])) == 32  # consistent: kept
    short = memory_record(shelf, id="m_bbbbbbbbbbbbbbbb", content="The scanner is on 10.0.0.8.",
                          embed_model="ollama:other", embedding=vector_text([1.0, 2.0, 3.0]))
    assert shelf.import_(KALEB, [short])["memories"] == 1
    by_id = {m["id"]: m for m in memories(shelf, KALEB)}
    assert by_id["m_bbbbbbbbbbbbbbbb"]["embedding"] is None and by_id["m_bbbbbbbbbbbbbbbb"]["embed_model"] is None
    mixed = [memory_record(shelf, id=f"m_{c * 16}", content=f"line {c}", embed_model="ollama:new",
                           embedding=vector_text(np.ones(n))) for c, n in (("c", 4), ("d", 5))]
    shelf.import_(MAYA, mixed)
    assert [m["embedding"] for m in memories(shelf, MAYA)] == [None, None]  # no single length: both dropped


def test_import_through_http_and_cli_gives_one_clear_error(backend, target, tmp_path):
    with Shelf.open(target, embedder=None) as keys:
        secret = keys.create_key("acme")[1]
    deep = "[" * 100_000 + "]" * 100_000
    with LiveServer(create_app(target=target, embedder=None)) as live:
        with httpx.Client(base_url=live.url, headers=bearer(secret), timeout=60) as client:
            record = {"kind": "memory", "id": "../../x", "topic": "t", "content": "c", "source": "stated",
                      "created_at": "2026-01-01T00:00:00+00:00"}
            body = json.dumps(record) + "\n"
            error = assert_error(client.post("/v1/users/u/import", content=body), 422, "invalid_input")
            assert "record 1" in error["message"] and "'id'" in error["message"]
            error = assert_error(client.post("/v1/users/u/import", content=deep + "\n"), 422, "invalid_input")
            assert "nested too deeply" in error["message"]
    path = tmp_path / "deep.jsonl"
    path.write_text(deep + "\n")
    environment = {**os.environ, "MEMSHELF_DATABASE_URL": target, "MEMSHELF_TENANT": "home", "MEMSHELF_USER": "k",
                   "MEMSHELF_EMBEDDER": "none", "NO_COLOR": "1", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "memshelf.cli", "import", str(path)], capture_output=True, text=True,
                          env=environment, timeout=120)
    assert proc.returncode != 0 and "nested too deeply" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- 2. importing twice adds nothing
def test_importing_the_same_export_twice_adds_no_fact_history(shelf, clock):
    shelf.set_fact(KALEB, "user_name", "Kal")
    clock.advance(1)
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    shelf.set_fact(KALEB, "city", "Lyon")
    shelf.set_fact(KALEB, "city", "Lyon")  # the same change twice in one instant: history keeps both
    exported = list(shelf.export(KALEB))
    for _ in range(3):
        shelf.import_(MAYA, exported)
    assert shelf.fact_history(MAYA) == shelf.fact_history(KALEB)
    assert len(shelf.fact_history(MAYA)) == 4
    assert shelf.import_(KALEB, exported) == {"memories": 0, "facts": 0, "messages": 0}
    assert len(shelf.fact_history(KALEB)) == 4


# ---------------------------------------------------------------- 3. a guess never replaces what the user said
def test_an_inferred_value_never_replaces_a_stated_one(shelf, clock):
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    clock.advance(1)
    kept = shelf.set_fact(KALEB, "user_name", "Kal", source="inferred")
    assert (kept.value, kept.source) == ("Kaleb", "stated")
    assert kept.outranked is not None and (kept.outranked.value, kept.outranked.source) == ("Kal", "inferred")
    assert kept.note is not None and "kept the stated value 'Kaleb'" in kept.note and "'Kal'" in kept.note
    assert [(f.value, f.source) for f in shelf.facts(KALEB)] == [("Kaleb", "stated")]
    assert [c.value for c in shelf.fact_history(KALEB, "user_name")] == ["Kaleb", "Kal"]  # nothing lost
    clock.advance(1)
    replaced = shelf.set_fact(KALEB, "user_name", "Kaleb B.")  # equal confidence replaces, as before
    assert (replaced.value, replaced.outranked, replaced.note) == ("Kaleb B.", None, None)
    shelf.set_fact(KALEB, "city", "Lyon", source="inferred")
    assert shelf.set_fact(KALEB, "city", "Paris", source="mined").value == "Paris"  # stronger replaces
    assert shelf.set_fact(KALEB, "city", "Nice", source="inferred").value == "Paris"


def test_a_prompt_marks_facts_that_are_guesses(shelf, clock):
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    clock.advance(1)
    shelf.set_fact(KALEB, "city", "Lyon", source="inferred")
    prompt = shelf.build_prompt("Base.", KALEB, "")
    assert prompt == ("Base.\n\nMemory context:\nKnown facts about the user:\n"
                      "  - city: Lyon (unconfirmed: inferred)\n  - user_name: Kaleb")


def test_http_and_cli_say_when_a_value_was_kept_in_history_only(target):
    with Shelf.open(target, embedder=None) as keys:
        secret = keys.create_key("acme")[1]
    with LiveServer(create_app(target=target, embedder=None)) as live:
        with httpx.Client(base_url=live.url, headers=bearer(secret), timeout=60) as client:
            assert client.put("/v1/users/u/facts/name", json={"value": "Kaleb"}).json()["note"] is None
            answer = client.put("/v1/users/u/facts/name", json={"value": "Kal", "source": "inferred"}).json()
            assert answer["value"] == "Kaleb" and "history" in answer["note"]
    environment = {**os.environ, "MEMSHELF_DATABASE_URL": target, "MEMSHELF_TENANT": "acme", "MEMSHELF_USER": "u",
                   "MEMSHELF_EMBEDDER": "none", "NO_COLOR": "1", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "memshelf.cli", "set-fact", "name", "K.", "--source", "mined"],
                          capture_output=True, text=True, env=environment, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "name: Kaleb" and "kept the stated value 'Kaleb'" in proc.stderr


# ---------------------------------------------------------------- 4. expiry
def test_export_leaves_out_expired_memories_and_messages(shelf, clock):
    shelf.remember(KALEB, "wifi", "The guest password is tulip42.", ttl=60)
    shelf.remember(KALEB, "wifi", "The router is in the hall.")
    shelf.log_message(KALEB, "t", "user", "short-lived", ttl=60)
    shelf.log_message(KALEB, "t", "user", "kept")
    clock.advance(61)
    exported = list(shelf.export(KALEB))
    assert [r.get("content") for r in exported[1:]] == ["The router is in the hall.", "kept"]


def test_a_write_whose_expiry_has_passed_is_refused(shelf, clock):
    for when in (clock.now, clock.now - timedelta(days=1)):
        with pytest.raises(InvalidInput, match="expires_at .* has already passed"):
            shelf.remember(KALEB, "t", "already gone", expires_at=when)
    for ttl in (0, -1, timedelta(0)):
        with pytest.raises(InvalidInput, match="ttl"):
            shelf.log_message(KALEB, "t", "user", "already gone", ttl=ttl)
    assert memories(shelf, KALEB) == [] and shelf.messages(KALEB) == []
    assert shelf.remember(KALEB, "t", "later", expires_at=clock.now + timedelta(seconds=1)).content == "later"


# ---------------------------------------------------------------- 5. whitespace does not make another memory
def test_whitespace_is_ignored_for_dedup_and_kept_in_the_text(shelf):
    first = shelf.remember(KALEB, "sky", "The sky is blue.")
    again = shelf.remember(KALEB, " sky\t", "  The  sky\nis blue. ")
    assert again.id == first.id and again.observations == 2
    assert [(m["topic"], m["content"]) for m in memories(shelf, KALEB)] == [("sky", "The sky is blue.")]
    assert shelf.remember(KALEB, "sky", "The sky is blue!").id != first.id  # other words stay other memories


def _old_digest(topic: str, content: str) -> str:
    return hashlib.sha256(f"{topic}\x00{content}".encode()).hexdigest()


def _sql(backend: str, target: str, statements: list[tuple[str, tuple]]) -> None:
    """Run SQL on the database directly, as a user of an older memshelf would have left it."""
    if backend == "sqlite":
        from memshelf.stores.sqlite import sqlite3

        with sqlite3.connect(target) as conn:
            for statement, params in statements:
                conn.execute(statement, params)
        return
    import psycopg

    with psycopg.connect(target, autocommit=True) as conn:
        for statement, params in statements:
            conn.execute(statement.replace("?", "%s"), params)


def test_the_migration_recomputes_digests_and_keeps_colliding_rows(backend, target, open_shelf, clock):
    shelf = open_shelf(clock=clock)
    older = shelf.remember(KALEB, "sky", "The sky is blue.")
    clock.advance(1)
    newer = shelf.remember(KALEB, "sky", "The sky is  blue.", expires_at=clock.now + timedelta(days=1))
    assert newer.id == older.id  # dedup by today's rule; make the file look as an older memshelf wrote it
    _sql(backend, target, [
        ("UPDATE memories SET digest = ? WHERE id = ?", (_old_digest("sky", "The sky is blue."), older.id)),
        ("INSERT INTO memories (id, tenant, user_id, topic, content, digest, source, confidence, created_at,"
         " last_seen, observations" + (", owner_tag" if backend == "sqlite" else "") + ") SELECT 'm_fedcba9876543210',"
         " tenant, user_id, topic, 'The sky is blue. ', ?, source, confidence, created_at, last_seen, 1"
         + (", owner_tag" if backend == "sqlite" else "") + " FROM memories WHERE id = ?",
         (_old_digest("sky", "The sky is blue. "), older.id)),
        ("INSERT INTO memories (id, tenant, user_id, topic, content, digest, source, confidence, created_at,"
         " last_seen, observations" + (", owner_tag" if backend == "sqlite" else "") + ") SELECT 'm_0000000000000001',"
         " tenant, user_id, 'rain', 'It  rains.', ?, source, confidence, created_at, last_seen, 1"
         + (", owner_tag" if backend == "sqlite" else "") + " FROM memories WHERE id = ?",
         (_old_digest("rain", "It  rains."), older.id)),
        ("DELETE FROM memshelf_migrations WHERE name = ?", (_whitespace_migration(backend),)),
    ])
    reopened = open_shelf(clock=clock)
    assert reopened.remember(KALEB, "rain", "It rains.").id == "m_0000000000000001"  # the old row's digest moved
    assert reopened.remember(KALEB, "sky", "The sky is blue.").id == older.id  # the older of two colliding rows
    assert {m["id"] for m in memories(reopened, KALEB)} == {older.id, "m_fedcba9876543210", "m_0000000000000001"}
    open_shelf(clock=clock)  # the migration is recorded: opening again runs nothing twice


# ---------------------------------------------------------------- 6. erasing a tenant revokes its keys
def test_forget_tenant_revokes_its_api_keys(target):
    with Shelf.open(target, embedder=None) as keys:
        admin, acme, globex = (keys.create_key(t)[1] for t in (None, "acme", "globex"))
    with LiveServer(create_app(target=target, embedder=None)) as live:
        def get(secret: str) -> httpx.Response:
            return httpx.get(f"{live.url}/v1/users/u/facts", headers=bearer(secret), timeout=60)

        assert get(acme).status_code == 200
        erased = httpx.delete(f"{live.url}/v1/admin/tenants/acme", headers=bearer(admin), timeout=60)
        assert erased.status_code == 200, erased.text
        assert_error(get(acme), 401)
        assert get(globex).status_code == 200
    with Shelf.open(target, embedder=None) as shelf:
        assert [k.revoked_at is not None for k in shelf.list_keys("acme")] == [True]


# ---------------------------------------------------------------- 7. cursors are opaque and owner-scoped
@pytest.mark.parametrize("cursor", ["²", "①", "12", "bogus", "c1.", "c1.!!!", "c1.bm90IGpzb24", "\ud800", 7,
                                    "c1." + "A" * 300])
def test_a_malformed_cursor_says_pass_next_cursor_unchanged(shelf, cursor):
    shelf.log_message(KALEB, "t", "user", "hello")
    for call in (shelf.list_memories, shelf.list_messages):
        with pytest.raises(InvalidInput, match="pass next_cursor unchanged"):
            call(KALEB, cursor=cursor)


def test_http_lists_answer_422_to_a_malformed_cursor(target):
    with Shelf.open(target, embedder=None) as keys:
        secret = keys.create_key("acme")[1]
    with LiveServer(create_app(target=target, embedder=None)) as live:
        with httpx.Client(base_url=live.url, headers=bearer(secret), timeout=60) as client:
            for i in range(3):
                client.post("/v1/users/u/memories", json={"topic": "t", "content": f"line {i}"})
            first = client.get("/v1/users/u/memories", params={"limit": 2}).json()
            rest = client.get("/v1/users/u/memories", params={"limit": 2, "cursor": first["next_cursor"]}).json()
            assert [m["content"] for m in first["items"] + rest["items"]] == ["line 2", "line 1", "line 0"]
            for path in ("memories", "messages"):
                for cursor in ("²", "①", "12", first["next_cursor"][:-2]):
                    error = assert_error(client.get(f"/v1/users/u/{path}", params={"cursor": cursor}), 422)
                    assert "pass next_cursor unchanged" in error["message"]
            other = client.get("/v1/users/v/memories", params={"cursor": first["next_cursor"]})
            assert "pass next_cursor unchanged" in assert_error(other, 422)["message"]


def test_a_cursor_works_only_for_its_owner_and_its_list(shelf):
    for i in range(3):
        shelf.remember(KALEB, "t", f"line {i}")
        shelf.remember(MAYA, "t", f"line {i}")
        shelf.log_message(KALEB, "t", "user", f"turn {i}")
    _, mine = shelf.list_memories(KALEB, limit=1)
    _, theirs = shelf.list_memories(MAYA, limit=1)
    _, messages = shelf.list_messages(KALEB, limit=1)
    with pytest.raises(InvalidInput, match="pass next_cursor unchanged"):
        shelf.list_memories(KALEB, cursor=theirs)
    with pytest.raises(InvalidInput, match="pass next_cursor unchanged"):
        shelf.list_memories(KALEB, cursor=messages)
    assert len(shelf.list_memories(KALEB, cursor=mine)[0]) == 2


def test_a_cursor_does_not_count_other_owners_writes(shelf, clock):
    shelf.remember(KALEB, "t", "first")
    for i in range(50):
        shelf.remember(MAYA, "t", f"someone else's {i}")
    clock.advance(1)
    newest = shelf.remember(KALEB, "t", "second")
    page, cursor = shelf.list_memories(KALEB, limit=1)
    assert cursor is not None
    body = cursor.removeprefix("c1.")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert payload[1:] == [newest.created_at.isoformat(timespec="microseconds"), newest.id]


@pytest.mark.parametrize("same_instant", [False, True])
def test_paging_survives_deleting_the_record_a_page_ended_on(shelf, clock, same_instant):
    for i in range(7):
        shelf.remember(KALEB, "t", f"line {i}")
        clock.advance(0 if same_instant else 1)
    page, cursor = shelf.list_memories(KALEB, limit=3)
    shelf.forget(KALEB, page[-1].id)
    rest = []
    while cursor is not None:
        more, cursor = shelf.list_memories(KALEB, limit=3, cursor=cursor)
        rest += [m.content for m in more]
    seen = [m.content for m in page] + rest
    assert {f"line {i}" for i in range(7)} <= set(seen)  # never skipped
    if not same_instant:
        assert rest == ["line 3", "line 2", "line 1", "line 0"]


def test_pages_follow_creation_time_for_imported_records(shelf, clock):
    shelf.remember(KALEB, "t", "made now")
    old = (clock.now - timedelta(days=365)).astimezone(UTC).isoformat()
    shelf.import_(KALEB, [memory_record(shelf, content="made last year", created_at=old, last_seen=old)])
    assert [m.content for m in shelf.list_memories(KALEB)[0]] == ["made now", "made last year"]
    assert datetime.fromisoformat(old) < clock.now


def _whitespace_migration(backend: str) -> str:
    """The name of the migration that re-keys digests, which each backend numbers in its own sequence."""
    from memshelf.stores import _postgres_schema, _sqlite_schema

    return (_sqlite_schema if backend == "sqlite" else _postgres_schema).WHITESPACE_DIGESTS


@pytest.mark.parametrize("typed, meant", [("Stated", "stated"), (" MINED ", "mined"), ("infered", "inferred"),
                                          ("sensr", "sensor")])
def test_a_mistyped_source_gets_the_declared_one_it_most_likely_meant(typed, meant):
    """The error for an unknown source names the declared source a typo most likely meant (case, spaces, a letter)."""
    from memshelf.model import Sources

    with pytest.raises(UnknownSource, match=f"unknown source {typed!r} \\(did you mean {meant!r}\\?"):
        Sources({"sensor": 0.8}).confidence(typed)


def test_an_unrelated_source_gets_no_guess():
    from memshelf.model import Sources

    with pytest.raises(UnknownSource) as caught:
        Sources().confidence("gossip")
    assert "did you mean" not in str(caught.value) and "declare a new source first" in str(caught.value)
