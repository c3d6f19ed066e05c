"""Bad input to every public verb of Shelf, on both backends. Each refusal is one specific memshelf error whose
message gives the limit or the fix, and the store is exactly as it was afterwards. Then: values exactly at each
limit are stored and read back unchanged, random Unicode either round-trips or is InvalidInput, the PostgreSQL pool
setting, serve() and the caller's environment, and the same refusals over a real HTTP server (422, never 500)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, UTC
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from memshelf import ConfigError, InvalidInput, MemshelfError, Owner, Shelf, UnknownSource, model
from memshelf.model import (LATEST, MAX_CONTENT_CHARS, MAX_FACT_KEY_CHARS, MAX_FACT_VALUE_CHARS,
                            MAX_ID_CHARS, MAX_TOPIC_CHARS, MAX_TTL)
from memshelf.server import create_app
from test_server import LiveServer, bearer, free_port, wait_healthy

KALEB = Owner("home", "kaleb")
LONE = "\ud800"  # a lone surrogate: a str Python can hold but no UTF-8 encoder, SQLite or PostgreSQL accepts
EAST, WEST = timezone(timedelta(hours=5)), timezone(timedelta(hours=-5))
SURROGATE_FIX = "lone surrogate.*decode the input properly"
TTL_FIX = "over the limit of 3,153,600,000 seconds"
RANGE_FIX = "out of range: pass an instant between 1970-01-01 and 9000-01-01"


@dataclass
class Seed:
    memory_id: str
    key_id: str


def seed(shelf: Shelf) -> Seed:
    memory = shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    shelf.set_fact(KALEB, "user_name", "Kaleb")
    shelf.log_message(KALEB, "t1", "user", "where is the printer?")
    key, _ = shelf.create_key("home")
    return Seed(memory.id, key.id)


def state(shelf: Shelf) -> tuple[Any, ...]:
    """Everything a refused call could have touched: row counts of the whole store, every record of the seeded
    owner (observations and last_seen included), and the API keys."""
    return shelf.stats(), list(shelf.export(KALEB)), shelf.list_keys()


Call = Callable[[Shelf, Seed], object]
OK_MEMORY = {"topic": "a", "content": "a valid line"}
REPEAT = {"topic": "network", "content": "The office printer is on 192.168.1.40."}  # would bump observations


def remember(**item: Any) -> Call:
    fields = {"topic": "a", "content": "a valid line", **item}
    return lambda shelf, _: shelf.remember(KALEB, **fields)


def many(items: Any) -> Call:
    return lambda shelf, _: shelf.remember_many(KALEB, items)


def log(**fields: Any) -> Call:
    turn = {"thread": "t1", "role": "user", "content": "hello", **fields}
    return lambda shelf, _: shelf.log_message(KALEB, **turn)


def fact(key: Any = "k", value: Any = "v", source: Any = "stated") -> Call:
    return lambda shelf, _: shelf.set_fact(KALEB, key, value, source)


CASES: list[tuple[str, Call, type[MemshelfError], str]] = [
    # remember: text
    ("remember-lone-surrogate-topic", remember(topic=LONE), InvalidInput, "topic contains a " + SURROGATE_FIX),
    ("remember-lone-surrogate-content", remember(content="a" + LONE), InvalidInput, SURROGATE_FIX),
    ("remember-low-surrogate-content", remember(content="\udfff!"), InvalidInput, SURROGATE_FIX),
    ("remember-lone-surrogate-source", remember(source=LONE), UnknownSource, "declare a new source first"),
    ("remember-surrogate-tenant", lambda s, _: s.remember(Owner("home" + LONE, "kaleb"), "a", "b"), InvalidInput,
     "tenant contains a " + SURROGATE_FIX),
    ("remember-surrogate-user", lambda s, _: s.remember(Owner("home", LONE), "a", "b"), InvalidInput,
     "user contains a " + SURROGATE_FIX),
    ("remember-empty-topic", remember(topic=""), InvalidInput, "empty or only whitespace"),
    ("remember-blank-topic", remember(topic=" \t "), InvalidInput, "empty or only whitespace"),
    ("remember-blank-content", remember(content="\n\u3000 "), InvalidInput, "empty or only whitespace"),
    ("remember-topic-one-over", remember(topic="x" * (MAX_TOPIC_CHARS + 1)), InvalidInput, "the limit is 200"),
    ("remember-content-one-over", remember(content="x" * (MAX_CONTENT_CHARS + 1)), InvalidInput,
     "the limit is 16,000: split it"),
    ("remember-topic-not-text", remember(topic=5), InvalidInput, "topic must be a string.*such as .network."),
    ("remember-content-none", remember(content=None), InvalidInput, "content must be a string, got NoneType: pass"),
    ("remember-source-not-text", remember(source=5), UnknownSource, "declare a new source first"),
    ("remember-nul", remember(content="a\x00b"), InvalidInput, "NUL character: remove it"),
    ("owner-not-an-owner", lambda s, _: s.remember(("home", "kaleb"), "a", "b"), InvalidInput,
     r"owner must be memshelf.Owner\(tenant, user\)"),
    # remember: expiry
    ("ttl-1e300", remember(ttl=1e300), InvalidInput, TTL_FIX),
    ("ttl-huge-int", remember(ttl=10**400), InvalidInput, TTL_FIX),
    ("ttl-timedelta-max", remember(ttl=timedelta.max), InvalidInput, TTL_FIX),
    ("ttl-one-over", remember(ttl=MAX_TTL + timedelta(microseconds=1)), InvalidInput, TTL_FIX),
    ("ttl-infinite", remember(ttl=math.inf), InvalidInput, TTL_FIX),
    ("ttl-nan", remember(ttl=math.nan), InvalidInput, "positive number of seconds.*no ttl"),
    ("ttl-negative", remember(ttl=-1), InvalidInput, "positive number of seconds.*86400"),
    ("ttl-zero", remember(ttl=timedelta(0)), InvalidInput, "positive number of seconds"),
    ("ttl-text", remember(ttl="1 day"), InvalidInput, "ttl must be seconds .* or a timedelta, got str"),
    ("ttl-bool", remember(ttl=True), InvalidInput, "ttl must be seconds"),
    ("expires-year-9999-west", remember(expires_at=datetime(9999, 12, 31, 23, tzinfo=WEST)), InvalidInput,
     RANGE_FIX),
    ("expires-year-1-east", remember(expires_at=datetime(1, 1, 1, 1, tzinfo=EAST)), InvalidInput, RANGE_FIX),
    ("expires-year-999", remember(expires_at=datetime(999, 6, 1, tzinfo=UTC)), InvalidInput, RANGE_FIX),
    ("expires-after-9000", remember(expires_at=LATEST + timedelta(microseconds=1)), InvalidInput, RANGE_FIX),
    ("expires-naive", remember(expires_at=datetime(2030, 1, 1)), InvalidInput, "naive datetime: pass an aware"),
    ("expires-text", remember(expires_at="2030-01-01T00:00:00Z"), InvalidInput, "must be a datetime"),
    ("expires-and-ttl", remember(expires_at=datetime(2030, 1, 1, tzinfo=UTC), ttl=5), InvalidInput,
     "expires_at or ttl, not both"),
    # remember_many: nothing is written unless every item is valid
    ("many-none", many(None), InvalidInput, "memories must be a list of mappings, got NoneType"),
    ("many-one-mapping", many(OK_MEMORY), InvalidInput, "must be a list of mappings, got dict"),
    ("many-text", many("a valid line"), InvalidInput, "must be a list of mappings, got str"),
    ("many-number", many(5), InvalidInput, "must be a list of mappings"),
    ("many-none-item", many([OK_MEMORY, None]), InvalidInput, "each memory must be a mapping"),
    ("many-unknown-field", many([{**OK_MEMORY, "colour": "red"}]), InvalidInput, "unknown memory fields"),
    ("many-last-one-too-long", many([OK_MEMORY, REPEAT, {"topic": "a", "content": "x" * 16_001}]), InvalidInput,
     "limit is 16,000"),
    ("many-last-one-surrogate", many([REPEAT, {"topic": "a", "content": LONE}]), InvalidInput, SURROGATE_FIX),
    ("many-last-one-overflows", many([REPEAT, {**OK_MEMORY, "ttl": timedelta.max}]), InvalidInput, TTL_FIX),
    # memory ids
    ("get-id-number", lambda s, _: s.get(KALEB, 5), InvalidInput, "memory id must be a non-empty string"),
    ("get-id-surrogate", lambda s, _: s.get(KALEB, "m_" + LONE), InvalidInput, SURROGATE_FIX),
    ("get-id-one-over", lambda s, _: s.get(KALEB, "m" * (MAX_ID_CHARS + 1)), InvalidInput, "non-empty string"),
    ("forget-id-none", lambda s, _: s.forget(KALEB, None), InvalidInput, "memory id"),
    ("forget-id-surrogate", lambda s, _: s.forget(KALEB, LONE), InvalidInput, SURROGATE_FIX),
    ("forget-id-blank", lambda s, _: s.forget(KALEB, "  "), InvalidInput, "non-empty string"),
    ("list-limit-0", lambda s, _: s.list_memories(KALEB, limit=0), InvalidInput, "from 1 to 1000"),
    ("list-limit-huge", lambda s, _: s.list_memories(KALEB, limit=10**30), InvalidInput, "from 1 to 1000"),
    ("list-limit-text", lambda s, _: s.list_memories(KALEB, limit="5"), InvalidInput, "from 1 to 1000"),
    # search, context, build_prompt
    ("search-surrogate", lambda s, _: s.search(KALEB, "printer " + LONE), InvalidInput, SURROGATE_FIX),
    ("search-only-surrogate", lambda s, _: s.search(KALEB, LONE), InvalidInput, SURROGATE_FIX),
    ("search-blank", lambda s, _: s.search(KALEB, " \n"), InvalidInput, "empty or only whitespace"),
    ("search-none", lambda s, _: s.search(KALEB, None), InvalidInput, "question must be a string"),
    ("search-one-over", lambda s, _: s.search(KALEB, "x" * (MAX_CONTENT_CHARS + 1)), InvalidInput, "16,000"),
    ("search-limit-0", lambda s, _: s.search(KALEB, "printer", limit=0), InvalidInput, "from 1 to 1000"),
    ("search-limit-huge", lambda s, _: s.search(KALEB, "printer", limit=10**30), InvalidInput, "from 1 to 1000"),
    ("search-floor-text", lambda s, _: s.search(KALEB, "printer", floor="0.3"), InvalidInput,
     "floor must be a cosine from -1 to 1"),
    ("search-floor-nan", lambda s, _: s.search(KALEB, "printer", floor=math.nan), InvalidInput, "from -1 to 1"),
    ("search-mode", lambda s, _: s.search(KALEB, "printer", mode="psychic"), InvalidInput,
     "use one of auto, keyword, semantic, hybrid"),
    ("search-mode-none", lambda s, _: s.search(KALEB, "printer", mode=None), InvalidInput,
     "use one of"),
    ("context-surrogate", lambda s, _: s.context(KALEB, LONE + "printer"), InvalidInput, SURROGATE_FIX),
    ("context-limit", lambda s, _: s.context(KALEB, "printer", limit=-3), InvalidInput, "from 1 to 1000"),
    ("context-mode", lambda s, _: s.context(KALEB, "printer", mode="all"), InvalidInput, "use one of"),
    ("prompt-base-surrogate", lambda s, _: s.build_prompt("You help." + LONE, KALEB, "printer?"), InvalidInput,
     "base_prompt contains a " + SURROGATE_FIX),
    ("prompt-user-surrogate", lambda s, _: s.build_prompt("You help.", KALEB, LONE), InvalidInput,
     "user_text contains a " + SURROGATE_FIX),
    ("prompt-base-none", lambda s, _: s.build_prompt(None, KALEB, "printer?"), InvalidInput,
     "base_prompt must be a string"),
    ("prompt-user-number", lambda s, _: s.build_prompt("You help.", KALEB, 5), InvalidInput,
     "user_text must be a string"),
    ("prompt-limit", lambda s, _: s.build_prompt("You help.", KALEB, "printer?", limit=0), InvalidInput,
     "from 1 to 1000"),
    ("prompt-mode", lambda s, _: s.build_prompt("You help.", KALEB, "printer?", mode="x"), InvalidInput,
     "use one of"),
    # facts
    ("fact-key-surrogate", fact(key="name" + LONE), InvalidInput, "fact key contains a " + SURROGATE_FIX),
    ("fact-value-surrogate", fact(value=LONE), InvalidInput, "fact value contains a " + SURROGATE_FIX),
    ("fact-key-number", fact(key=5), InvalidInput, "fact key must be a string"),
    ("fact-value-none", fact(value=None), InvalidInput, "fact value must be a string"),
    ("fact-key-empty", fact(key=""), InvalidInput, "empty or only whitespace"),
    ("fact-value-blank", fact(value="   "), InvalidInput, "empty or only whitespace"),
    ("fact-key-one-over", fact(key="k" * (MAX_FACT_KEY_CHARS + 1)), InvalidInput, "the limit is 200"),
    ("fact-value-one-over", fact(value="v" * (MAX_FACT_VALUE_CHARS + 1)), InvalidInput, "the limit is 4,000"),
    ("fact-source", fact(source="rumour"), UnknownSource, "declare a new source first"),
    ("get-fact-number", lambda s, _: s.get_fact(KALEB, 5), InvalidInput, "fact key must be a string"),
    ("get-fact-surrogate", lambda s, _: s.get_fact(KALEB, LONE), InvalidInput, SURROGATE_FIX),
    ("fact-history-number", lambda s, _: s.fact_history(KALEB, 5), InvalidInput,
     "fact key must be a string"),
    ("fact-history-surrogate", lambda s, _: s.fact_history(KALEB, LONE), InvalidInput, SURROGATE_FIX),
    ("forget-fact-number", lambda s, _: s.forget_fact(KALEB, 5), InvalidInput,
     "fact key must be a string"),
    ("forget-fact-surrogate", lambda s, _: s.forget_fact(KALEB, "user_name" + LONE), InvalidInput, SURROGATE_FIX),
    ("facts-owner-text", lambda s, _: s.facts("home/kaleb"), InvalidInput, "owner must be memshelf.Owner"),
    # messages
    ("log-thread-surrogate", log(thread=LONE), InvalidInput, "thread contains a " + SURROGATE_FIX),
    ("log-role-surrogate", log(role="user" + LONE), InvalidInput, "is not one of user, assistant"),
    ("log-content-surrogate", log(content=LONE), InvalidInput, "content contains a " + SURROGATE_FIX),
    ("log-thread-empty", log(thread=""), InvalidInput, "empty or only whitespace"),
    ("log-role-blank", log(role=" "), InvalidInput, "is not one of user, assistant, system, developer, tool"),
    ("log-role-unknown", log(role="human"), InvalidInput, "the person's turns are 'user'"),
    ("log-role-number", log(role=1), InvalidInput, "role must be a string, one of user"),
    ("log-thread-one-over", log(thread="t" * (MAX_TOPIC_CHARS + 1)), InvalidInput, "the limit is 200"),
    ("log-content-one-over", log(content="c" * (MAX_CONTENT_CHARS + 1)), InvalidInput, "the limit is 16,000"),
    ("log-ttl-negative", log(ttl=-1), InvalidInput, "positive number of seconds"),
    ("log-ttl-1e300", log(ttl=1e300), InvalidInput, TTL_FIX),
    ("log-ttl-timedelta-max", log(ttl=timedelta.max), InvalidInput, TTL_FIX),
    ("log-ttl-text", log(ttl="forever"), InvalidInput, "ttl must be seconds"),
    ("messages-thread-number", lambda s, _: s.messages(KALEB, 5), InvalidInput,
     "thread must be a string"),
    ("messages-thread-surrogate", lambda s, _: s.messages(KALEB, LONE), InvalidInput, SURROGATE_FIX),
    ("messages-limit", lambda s, _: s.messages(KALEB, limit=10**30), InvalidInput, "from 1 to 1000"),
    ("list-messages-thread", lambda s, _: s.list_messages(KALEB, ["t1"]), InvalidInput,
     "thread must be a string"),
    ("list-messages-surrogate", lambda s, _: s.list_messages(KALEB, "t" + LONE), InvalidInput, SURROGATE_FIX),
    # erasure
    ("forget-user-none", lambda s, _: s.forget_user(None), InvalidInput, "owner must be"),
    ("forget-tenant-surrogate", lambda s, _: s.forget_tenant("home" + LONE), InvalidInput, SURROGATE_FIX),
    ("forget-tenant-blank", lambda s, _: s.forget_tenant(" "), InvalidInput, "empty: pass a non-empty"),
    ("forget-tenant-number", lambda s, _: s.forget_tenant(5), InvalidInput, "must be a string"),
    ("forget-tenant-one-over", lambda s, _: s.forget_tenant("t" * (MAX_ID_CHARS + 1)), InvalidInput,
     "the limit is 200"),
    # backfill (checked before it asks for an embedder)
    ("backfill-batch-huge", lambda s, _: s.backfill(batch_size=10**30), InvalidInput, "from 1 to 10,000"),
    ("backfill-batch-0", lambda s, _: s.backfill(batch_size=0), InvalidInput, "from 1 to 10,000"),
    ("backfill-batch-text", lambda s, _: s.backfill(batch_size="64"), InvalidInput, "from 1 to 10,000"),
    ("backfill-progress", lambda s, _: s.backfill(progress=5), InvalidInput, "progress must be a function"),
    # export / import
    ("export-owner", lambda s, _: list(s.export("kaleb")), InvalidInput, "owner must be"),
    ("import-none", lambda s, _: s.import_(KALEB, None), InvalidInput, "records must be a list of mappings"),
    ("import-one-mapping", lambda s, _: s.import_(KALEB, {"kind": "memshelf-export", "format": 1}), InvalidInput,
     "must be a list of mappings, got dict"),
    ("import-text", lambda s, _: s.import_(KALEB, "{}"), InvalidInput, "must be a list of mappings, got str"),
    ("import-none-record", lambda s, _: s.import_(KALEB, [None]), InvalidInput,
     "record 1: it is a NoneType, not a JSON object"),
    ("import-surrogate-fact", lambda s, _: s.import_(KALEB, [
        {"kind": "fact", "key": "k", "value": LONE, "source": "stated", "updated_at": "2026-01-01T00:00:00+00:00"}]),
     InvalidInput, SURROGATE_FIX),
    ("import-message-year-1", lambda s, _: s.import_(KALEB, [
        {"kind": "message", "id": "msg_0123456789abcdef", "thread": "t", "role": "user", "content": "hi",
         "created_at": "0001-01-01T01:00:00+05:00"}]), InvalidInput, "out of range"),
    # names that URLs and headers could not carry as they are
    ("user-spaces-around", lambda s, _: s.remember(Owner("home", "kaleb "), "a", "b"), InvalidInput,
     "user 'kaleb ' begins or ends with whitespace.*such as 'kaleb', which is another user.*Owner.stored"),
    ("user-dot-dot", lambda s, _: s.facts(Owner("home", "..")), InvalidInput, "user '..' is a step in a URL's path"),
    ("tenant-dot", lambda s, _: s.remember(Owner(".", "kaleb"), "a", "b"), InvalidInput, "tenant '.' is a step"),
    ("fact-key-dot-dot", fact(key=".."), InvalidInput, "fact key '..' is a step in a URL's path.*another character"),
    ("fact-key-spaces-around", fact(key="\u3000home_city"), InvalidInput,
     "such as 'home_city'.*still read and erased by its name"),
    ("log-thread-dot", log(thread="."), InvalidInput, "thread '.' is a step"),
    ("log-thread-tab-after", log(thread="t1\t"), InvalidInput, "begins or ends with whitespace"),
    ("log-many-thread-dot-dot", lambda s, _: s.log_messages(KALEB, "..", [{"role": "user", "content": "hi"}]),
     InvalidInput, "thread '..' is a step"),
    ("key-tenant-spaces-around", lambda s, _: s.create_key(" home"), InvalidInput,
     "such as 'home', which is another tenant"),
    # API keys
    ("key-tenant-surrogate", lambda s, _: s.create_key(LONE), InvalidInput, SURROGATE_FIX),
    ("key-name-surrogate", lambda s, _: s.create_key("home", "ops" + LONE), InvalidInput,
     "key name contains a " + SURROGATE_FIX),
    ("key-tenant-blank", lambda s, _: s.create_key(""), InvalidInput, "empty"),
    ("key-name-one-over", lambda s, _: s.create_key("home", "n" * (MAX_TOPIC_CHARS + 1)), InvalidInput,
     "the limit is 200"),
    ("list-keys-number", lambda s, _: s.list_keys(5), InvalidInput, "tenant must be a string"),
    ("list-keys-surrogate", lambda s, _: s.list_keys(LONE), InvalidInput, SURROGATE_FIX),
    ("revoke-key-number", lambda s, _: s.revoke_key(5), InvalidInput, "must be a non-empty string"),
    ("revoke-key-surrogate", lambda s, seed: s.revoke_key(seed.key_id + LONE), InvalidInput, SURROGATE_FIX),
]


@pytest.mark.parametrize("call, error, match", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_refused_and_nothing_is_written(shelf: Shelf, call: Call, error: type[MemshelfError],
                                                     match: str) -> None:
    seeded = seed(shelf)
    before = state(shelf)
    with pytest.raises(error, match=match) as refused:
        call(shelf, seeded)
    assert type(refused.value) is error  # the specific class, not just any subclass
    assert state(shelf) == before


def test_a_lone_surrogate_secret_is_simply_not_a_key(shelf: Shelf) -> None:
    shelf.create_key("home")
    assert shelf.authenticate("ms_" + LONE) is None


# ---------------------------------------------------------------- Shelf.open
OPEN_CASES: list[tuple[str, dict[str, Any], type[MemshelfError], str]] = [
    ("floor-text", {"floor": "0.3"}, ConfigError, "floor must be a cosine from -1 to 1"),
    ("floor-out-of-range", {"floor": 2}, ConfigError, "from -1 to 1"),
    ("floor-nan", {"floor": math.nan}, ConfigError, "from -1 to 1"),
    ("sources-text", {"sources": "x"}, InvalidInput, r"sources must be a mapping .* e.g. \{'sensor': 0.8\}"),
    ("sources-list", {"sources": [("sensor", 0.8)]}, InvalidInput, "sources must be a mapping"),
    ("source-name-surrogate", {"sources": {"sensor" + LONE: 0.8}}, InvalidInput, SURROGATE_FIX),
    ("source-worth", {"sources": {"sensor": 1.5}}, InvalidInput, r"worth a number in \(0, 1\]"),
    ("budget-text", {"budget": "4000"}, ConfigError, "at least 100"),
    ("budget-small", {"budget": 99}, ConfigError, "at least 100"),
    ("message-ttl-negative", {"message_ttl": -5}, ConfigError, "message_ttl must be a positive number"),
    ("message-ttl-1e300", {"message_ttl": 1e300}, ConfigError, "message_ttl 1e[+]300 is over the limit"),
    ("message-ttl-timedelta-max", {"message_ttl": timedelta.max}, ConfigError, "over the limit"),
    ("message-ttl-text", {"message_ttl": "30 days"}, ConfigError, "message_ttl must be seconds"),
]


@pytest.mark.parametrize("options, error, match", [case[1:] for case in OPEN_CASES],
                         ids=[case[0] for case in OPEN_CASES])
def test_open_refuses_bad_settings_before_creating_anything(tmp_path: Path, target: str, shelf: Shelf,
                                                            options: dict[str, Any], error: type[MemshelfError],
                                                            match: str) -> None:
    fresh = tmp_path / "never.db"
    with pytest.raises(error, match=match):
        Shelf.open(fresh, embedder=None, **options)
    assert not fresh.exists()
    seed(shelf)
    before = state(shelf)
    with pytest.raises(error, match=match) as refused:
        Shelf.open(target, embedder=None, **options)
    assert type(refused.value) is error
    assert state(shelf) == before


@pytest.mark.parametrize("target, match", [
    (123, "target must be a file path or a URL.*got int"),
    (b"memory.db", "got bytes"),
    ("", "target is empty"),
    ("  ", "target is empty"),
    ("memory" + LONE + ".db", "not valid UTF-8 cannot be opened: rename the file"),
], ids=["number", "bytes", "empty", "blank", "surrogate"])
def test_open_refuses_a_bad_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: Any,
                                   match: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=match):
        Shelf.open(target, embedder=None)
    assert list(tmp_path.iterdir()) == []


def test_a_bad_memshelf_floor_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSHELF_FLOOR", "7")
    with pytest.raises(ConfigError, match=r"from -1 to 1 .*\(from MEMSHELF_FLOOR\)"):
        Shelf.open(tmp_path / "x.db", embedder=None)
    monkeypatch.setenv("MEMSHELF_FLOOR", "high")
    with pytest.raises(ConfigError, match="MEMSHELF_FLOOR must be a number such as 0.3"):
        Shelf.open(tmp_path / "x.db", embedder=None)
    assert not (tmp_path / "x.db").exists()


def test_backfill_refuses_a_huge_batch_with_an_embedder(open_shelf, local_embedder) -> None:
    shelf = open_shelf(embedder=local_embedder)
    shelf.remember(KALEB, "network", "The office printer is on 192.168.1.40.")
    before = state(shelf)
    with pytest.raises(InvalidInput, match="batch_size must be a whole number from 1 to 10,000"):
        shelf.backfill(batch_size=10**30)
    assert state(shelf) == before


# ---------------------------------------------------------------- exactly at each limit
AT_LIMIT = "\U0001d11e"  # 𝄞: one character, four bytes of UTF-8, two UTF-16 units


@pytest.mark.parametrize("char", ["x", AT_LIMIT], ids=["ascii", "four-byte"])
def test_values_exactly_at_each_limit_are_stored_and_read_back(shelf: Shelf, char: str) -> None:
    owner = Owner(char * MAX_ID_CHARS, char * MAX_ID_CHARS)
    topic, content = char * MAX_TOPIC_CHARS, char * MAX_CONTENT_CHARS
    memory = shelf.remember(owner, topic, content, ttl=MAX_TTL)
    stored = shelf.get(owner, memory.id)
    assert (stored.topic, stored.content, stored.expires_at) == (topic, content, shelf.now() + MAX_TTL)
    assert isinstance(shelf.search(owner, content, mode="keyword"), list)  # one huge word: found or not, no error
    last = shelf.remember(owner, "far", "valid until the last instant", expires_at=LATEST.astimezone(WEST))
    assert shelf.get(owner, last.id).expires_at == LATEST
    assert [hit.memory.id for hit in shelf.search(owner, "last instant", mode="keyword")] == [last.id]
    key, value = char * MAX_FACT_KEY_CHARS, char * MAX_FACT_VALUE_CHARS
    shelf.set_fact(owner, key, value)
    assert shelf.get_fact(owner, key).value == value
    thread, role = char * MAX_TOPIC_CHARS, "assistant"
    shelf.log_message(owner, thread, " Assistant", content, ttl=MAX_TTL)  # the role in any case, spelt canonically
    [message] = shelf.messages(owner, thread)
    assert (message.thread, message.role, message.content) == (thread, role, content)
    key_record, _ = shelf.create_key(char * MAX_ID_CHARS, char * MAX_TOPIC_CHARS)
    assert key_record in shelf.list_keys(char * MAX_ID_CHARS)
    assert shelf.forget_user(owner).memories == 2


# ---------------------------------------------------------------- random Unicode: round-trip or InvalidInput
ANY_CHAR = st.characters(codec=None, exclude_categories=())  # surrogates (Cs) and controls (Cc) included
TRICKY = [LONE, "a\udfffb", " ", "\t\n", "\x00", "a\x00", "\x7f\x01", "Zürich café", "\u2028", "\ufeff", AT_LIMIT,
          "\u3000", "'\"; DROP TABLE memories; --", "*", "NEAR(", "printer:*", "a & b | !c"]
TEXT = st.one_of(st.text(ANY_CHAR, max_size=24), st.text(max_size=24), st.sampled_from(TRICKY))


def storable(text: str) -> bool:
    """What check_text accepts: non-blank, no NUL, valid Unicode (no lone surrogate)."""
    return bool(text.strip()) and "\x00" not in text and not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def addressable(name: str) -> bool:
    """What a fact key (a thread, an owner) must also be: no whitespace at its ends, not "." or ".."."""
    return name == name.strip() and name not in (".", "..")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(topic=TEXT, content=TEXT, key=TEXT, value=TEXT, question=TEXT)
def test_random_text_round_trips_or_is_invalid_input(shelf: Shelf, topic: str, content: str, key: str,
                                                     value: str, question: str) -> None:
    try:
        memory = shelf.remember(KALEB, topic, content)
    except InvalidInput:
        assert not (storable(topic) and storable(content))
    else:
        assert storable(topic) and storable(content)
        assert (memory.topic, memory.content) == (topic, content)
        stored = shelf.get(KALEB, memory.id)
        assert (stored.topic, stored.content) == (topic, content)
    try:
        shelf.set_fact(KALEB, key, value)
    except InvalidInput:
        assert not (storable(key) and storable(value) and addressable(key))
    else:
        assert storable(key) and storable(value) and addressable(key)
        assert shelf.get_fact(KALEB, key).value == value
    try:
        hits = shelf.search(KALEB, question)
    except InvalidInput:
        assert not storable(question)
    else:
        assert storable(question)
        assert all(hit.memory.content for hit in hits)


# ---------------------------------------------------------------- PostgreSQL pool size
@pytest.mark.parametrize("value", ["abc", "0", "-1", "1001", "1.5", "9" * 5000, "１０"],
                         ids=["text", "zero", "negative", "over", "fraction", "thousands-of-digits", "fullwidth"])
def test_a_bad_pool_size_variable_is_a_config_error(pg_server, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    import psycopg

    from memshelf.stores.postgres import PostgresStore

    empty = pg_server.empty_database()
    monkeypatch.setenv("MEMSHELF_PG_POOL_SIZE", value)
    with pytest.raises(ConfigError, match="MEMSHELF_PG_POOL_SIZE must be a whole number of connections from 1 to "
                                          "1,000.*set it to e.g. 10"):
        Shelf.open(empty, embedder=None)
    with pytest.raises(ConfigError, match="MEMSHELF_PG_POOL_SIZE"):
        PostgresStore(empty)
    with psycopg.connect(empty) as conn:  # refused before the migrations: not even their table exists
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
    pg_server.drop(empty)


def test_a_good_pool_size_is_used_and_a_bad_argument_refused(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from memshelf.stores.postgres import PostgresStore

    monkeypatch.setenv("MEMSHELF_PG_POOL_SIZE", " 3 ")
    store = PostgresStore(pg_url)
    try:
        assert store._pool.max_size == 3
    finally:
        store.close()
    for bad in (0, True, 2.5, 10**30):
        with pytest.raises(ConfigError, match="pool_size must be a whole number"):
            PostgresStore(pg_url, pool_size=bad)


# ---------------------------------------------------------------- serve() and the caller's environment
SERVE_AND_COMPARE = """
import os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: None)  # uvicorn re-raises the SIGTERM it handled: let serve() return
before = dict(os.environ)
from memshelf.server import serve
serve(port={port}, workers={workers}, db={db!r}, embedder="none", log_level="warning")
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print("CHANGED", changed, flush=True)
sys.exit(1 if changed else 0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_serve_leaves_the_callers_environment_as_it_was(tmp_path: Path, workers: int) -> None:
    db = tmp_path / "served.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key("acme")[1]
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MEMSHELF_DB": str(tmp_path / "other.db"),
           "MEMSHELF_EMBEDDER": "local"}
    env.pop("MEMSHELF_DATABASE_URL", None)
    code = SERVE_AND_COMPARE.format(port=port, workers=workers, db=str(db))
    process = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process)
        # the server serves the db it was given (the key lives there, not in MEMSHELF_DB's file)
        reply = httpx.get(url + "/v1/users/u/memories", headers=bearer(secret), timeout=30)
        assert reply.status_code == 200, reply.text
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    assert b"CHANGED []" in out, out
    assert process.returncode == 0
    assert not (tmp_path / "other.db").exists()


# ---------------------------------------------------------------- over HTTP: 422, never 500
def test_names_written_before_they_were_refused_are_still_read_exported_and_erased(shelf: Shelf,
                                                                                   monkeypatch: pytest.MonkeyPatch):
    """An older memshelf took a user "bob ", a fact key ".." and a thread " t": the store still lists that owner (an
    Owner made unchecked), and its records can be read, exported and erased by their names."""
    with monkeypatch.context() as older:
        older.setattr(model, "addressable", lambda kind, value: value)
        shelf.remember(Owner("home", "bob "), "a", "a line bob's old client wrote")
        shelf.set_fact(Owner("home", "bob "), "..", "v")
        shelf.log_message(Owner("home", "bob "), " t", "user", "hi")
    shelf.remember(KALEB, "a", "kaleb's own line")
    with pytest.raises(InvalidInput, match="such as 'bob'"):
        Owner("home", "bob ")

    [bob] = [owner for owner in shelf.store.owners() if owner.user == "bob "]
    assert [u.user for u in shelf.list_users("home", limit=1)[0]] == ["bob "]
    assert [u.user for u in shelf.list_users("home", cursor=shelf.list_users("home", limit=1)[1])[0]] == ["kaleb"]
    assert shelf.get_fact(bob, "..").value == "v" and [m.thread for m in shelf.messages(bob, " t")] == [" t"]
    assert {r["kind"] for r in shelf.export(bob)} == {"memshelf-export", "memory", "fact", "fact_change", "message"}
    assert shelf.forget_fact(bob, "..").facts == 1 and shelf.forget_thread(bob, " t").messages == 1
    assert shelf.forget_user(bob).memories == 1
    assert [o.user for o in shelf.store.owners()] == ["kaleb"]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("bad-input") / "memshelf.db"
    with Shelf.open(db, embedder=None) as keys:
        secret = keys.create_key("acme")[1]
    with LiveServer(create_app(target=str(db), embedder=None)) as server:
        with httpx.Client(base_url=server.url, headers=bearer(secret), timeout=30) as client:
            yield client


FACT_RECORD = {"kind": "fact", "key": "k", "value": "v", "source": "stated", "updated_at": "2026-01-01T00:00:00+00:00"}
MESSAGE_RECORD = {"kind": "message", "id": "msg_0123456789abcdef", "thread": "t", "role": "user", "content": "hi",
                  "created_at": "2026-01-01T00:00:00+00:00"}
HTTP_CASES = [  # each was a 500 before: an OverflowError or a UnicodeEncodeError escaped the Shelf
    ("expires-year-1-east", "/v1/users/u/memories",
     {"topic": "a", "content": "b", "expires_at": "0001-01-01T01:00:00+05:00"}, RANGE_FIX),
    ("expires-year-9999-west", "/v1/users/u/memories/batch", {"memories": [
        {"topic": "a", "content": "fine"}, {"topic": "a", "content": "b", "expires_at": "9999-12-31T23:00:00-05:00"}]},
     RANGE_FIX),
    ("import-surrogate", "/v1/users/u/import", [MESSAGE_RECORD, {**FACT_RECORD, "value": LONE}], SURROGATE_FIX),
    ("import-year-1", "/v1/users/u/import",
     [FACT_RECORD, {**MESSAGE_RECORD, "created_at": "0001-01-01T01:00:00+05:00"}], "out of range"),
]


@pytest.mark.slow
@pytest.mark.parametrize("path, body, match", [c[1:] for c in HTTP_CASES], ids=[c[0] for c in HTTP_CASES])
def test_bad_input_over_http_is_422_and_writes_nothing(live: httpx.Client, path: str, body: Any, match: str) -> None:
    lines = body if isinstance(body, list) else [body]  # ASCII JSON: a lone surrogate travels as the escape \\ud800
    payload = "\n".join(json.dumps(line) for line in lines).encode()
    response = live.post(path, content=payload, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_input"
    assert re.search(match, error["message"]), error["message"]
    assert_nothing_stored(live)


@pytest.mark.slow
def test_a_lone_surrogate_in_a_json_field_is_422(live: httpx.Client) -> None:
    payload = json.dumps({"topic": "a", "content": "x" + LONE}).encode()
    response = live.post("/v1/users/u/memories", content=payload, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert "unicode string" in response.json()["error"]["message"]
    assert_nothing_stored(live)


def assert_nothing_stored(client: httpx.Client) -> None:
    for what in ("memories", "facts", "messages"):
        assert client.get(f"/v1/users/u/{what}").json()["items"] == [], what
