"""The HTTP API, started for real (uvicorn on a loopback port, a temporary SQLite file) and driven with httpx:
every endpoint, every authentication case as denial evidence, and the bad-input table."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from memshelf import ExtractorError, ExtractorUnavailable, Owner, Proposal, Shelf
from memshelf.learning import Extractor, register_extractor
from memshelf.server import MAX_BODY_BYTES, create_app


class LiveServer:
    """uvicorn serving an app on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, app: Any) -> None:
        # proto=IPPROTO_TCP: asyncio then sets TCP_NODELAY on accepted connections (no 40 ms Nagle stalls)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start within 20 s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.socket.close()


@dataclass
class Deployment:
    url: str
    db: Path
    admin: str
    acme: str
    globex: str


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    db = tmp_path_factory.mktemp("server") / "memshelf.db"
    with Shelf.open(db, embedder=None) as keys:
        admin = keys.create_key(None, "ops")[1]
        acme = keys.create_key("acme")[1]
        globex = keys.create_key("globex")[1]
    with LiveServer(create_app(target=str(db), embedder=None)) as live:
        yield Deployment(live.url, db, admin, acme, globex)


@pytest.fixture
def acme(deployment: Deployment) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=deployment.url, headers=bearer(deployment.acme), timeout=30) as client:
        yield client


@pytest.fixture
def admin(deployment: Deployment) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=deployment.url, headers=bearer(deployment.admin), timeout=30) as client:
        yield client


@pytest.fixture
def anonymous(deployment: Deployment) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=deployment.url, timeout=30) as client:
        yield client


def assert_error(response: httpx.Response, status: int, kind: str | None = None) -> dict[str, str]:
    """The one error shape (at /mcp also a JSON-RPC error), a message that says what to do, and nothing of the
    server's insides."""
    assert response.status_code == status, response.text
    body = response.json()
    rpc = {"jsonrpc", "id", "code"} if response.request.url.path.startswith("/mcp") else set()
    assert set(body) | set(body["error"]) == {"error", "type", "message"} | rpc, body
    assert body["error"]["message"].strip()
    if kind is not None:
        assert body["error"]["type"] == kind, body
    for leak in ("Traceback", "File \"", "site-packages", "sqlite3."):
        assert leak not in response.text
    return body["error"]


def remember(client: httpx.Client, user: str, content: str, topic: str = "office", **extra: Any) -> dict[str, Any]:
    response = client.post(f"/v1/users/{user}/memories", json={"topic": topic, "content": content, **extra})
    assert response.status_code == 201, response.text
    return response.json()


# ---------------------------------------------------------------------------------------------- open endpoints

def test_health_needs_no_key(anonymous: httpx.Client) -> None:
    assert anonymous.get("/health").json() == {"status": "ok"}


def test_web_page_and_api_docs_are_served(anonymous: httpx.Client) -> None:
    page = anonymous.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert 'fetch("/v1"' in page.text and "Authorization" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert anonymous.get("/docs").status_code == 200
    paths = anonymous.get("/openapi.json").json()["paths"]
    for path in ("/v1/users/{user}/memories", "/v1/users/{user}/memories/batch", "/v1/users/{user}/search",
                 "/v1/users/{user}/context", "/v1/users/{user}/prompt", "/v1/users/{user}/facts/{key}",
                 "/v1/users/{user}/messages", "/v1/users/{user}/export", "/v1/users/{user}/import",
                 "/v1/users/{user}/learn", "/v1/users/{user}/threads/{thread}", "/v1/users/{user}/evidence",
                 "/v1/users/{user}/memories/{memory_id}/confirm", "/v1/admin/keys",
                 "/v1/admin/tenants/{tenant}", "/v1/admin/purge", "/v1/admin/scrub"):
        assert path in paths


# ---------------------------------------------------------------------------------------------- every endpoint

def test_remember_get_list_and_forget(acme: httpx.Client) -> None:
    first = remember(acme, "alice", "The office printer is on 192.168.1.40.", topic="printer")
    assert first["confidence"] == 1.0 and first["source"] == "stated" and first["observations"] == 1
    again = remember(acme, "alice", "The office printer is on 192.168.1.40.", topic="printer")
    assert again["id"] == first["id"] and again["observations"] == 2
    mined = remember(acme, "alice", "Alice prefers tea.", topic="drinks", source="mined", ttl=3600)
    assert mined["confidence"] == 0.6 and mined["expires_at"] is not None

    assert acme.get(f"/v1/users/alice/memories/{first['id']}").json()["content"].endswith("192.168.1.40.")
    listed = acme.get("/v1/users/alice/memories", params={"limit": 1000}).json()
    assert [m["id"] for m in listed["items"]] == [mined["id"], first["id"]] and listed["next_cursor"] is None

    assert acme.delete(f"/v1/users/alice/memories/{first['id']}").status_code == 204
    assert_error(acme.get(f"/v1/users/alice/memories/{first['id']}"), 404, "not_found")
    assert_error(acme.delete(f"/v1/users/alice/memories/{first['id']}"), 404, "not_found")


def test_batch_is_all_or_nothing_and_lists_page_with_cursors(acme: httpx.Client) -> None:
    items = [{"topic": "n", "content": f"note number {i}"} for i in range(7)]
    stored = acme.post("/v1/users/pager/memories/batch", json={"memories": items})
    assert stored.status_code == 201 and len(stored.json()) == 7

    bad = items[:2] + [{"topic": "n", "content": "from a sensor", "source": "sensor"}]
    assert_error(acme.post("/v1/users/pager2/memories/batch", json={"memories": bad}), 422, "unknown_source")
    assert acme.get("/v1/users/pager2/memories").json() == {"items": [], "next_cursor": None}

    seen, cursor = [], None
    while True:
        page = acme.get("/v1/users/pager/memories", params={"limit": 3, **({"cursor": cursor} if cursor else {})})
        body = page.json()
        seen += [m["content"] for m in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"note number {i}" for i in reversed(range(7))]


def test_search_context_and_prompt(acme: httpx.Client) -> None:
    remember(acme, "bob", "The office printer is on 192.168.1.40.", topic="printer")
    remember(acme, "bob", "The printer jams on A3 paper.", topic="printer", source="inferred")
    result = acme.post("/v1/users/bob/search", json={"question": "where is the printer?", "limit": 5}).json()
    assert result["mode"] == "keyword" and result["degraded"] is False
    assert [h["memory"]["confidence"] for h in result["hits"]] == [1.0, 0.4]
    assert all(h["retriever"] == "keyword" and isinstance(h["score"], float) for h in result["hits"])

    block = acme.post("/v1/users/bob/context", json={"question": "printer"}).json()["context"]
    assert "Relevant knowledge" in block and "[1.0]" in block and "192.168.1.40" in block
    assert acme.post("/v1/users/bob/context", json={"question": "bananas"}).json() == {"context": ""}

    acme.put("/v1/users/bob/facts/user_name", json={"value": "Bob"})
    prompt = acme.post("/v1/users/bob/prompt", json={"base_prompt": "You are helpful.",
                                                      "user_text": "where is the printer"}).json()["prompt"]
    assert prompt.startswith("You are helpful.") and "Bob" in prompt and "192.168.1.40" in prompt

    needs_model = acme.post("/v1/users/bob/search", json={"question": "printer", "mode": "semantic"})
    assert_error(needs_model, 400, "not_configured")


def test_facts_set_get_history_page_and_forget(acme: httpx.Client) -> None:
    assert acme.put("/v1/users/carol/facts/user_name", json={"value": "Carol"}).json()["value"] == "Carol"
    guess = acme.put("/v1/users/carol/facts/user_name", json={"value": "Caro", "source": "mined"})
    assert guess.status_code == 200 and guess.json()["value"] == "Carol" and "history" in guess.json()["note"]
    for key in ("city", "team"):
        acme.put(f"/v1/users/carol/facts/{key}", json={"value": key.upper()})
    assert acme.get("/v1/users/carol/facts/user_name").json()["value"] == "Carol"  # a guess never replaces it

    first = acme.get("/v1/users/carol/facts", params={"limit": 2}).json()
    rest = acme.get("/v1/users/carol/facts", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [f["key"] for f in first["items"] + rest["items"]] == ["team", "city", "user_name"]
    assert rest["next_cursor"] is None

    history = acme.get("/v1/users/carol/facts/user_name/history").json()["items"]
    assert [c["value"] for c in history] == ["Carol", "Caro"]
    assert acme.delete("/v1/users/carol/facts/city").status_code == 204
    assert_error(acme.get("/v1/users/carol/facts/city"), 404, "not_found")
    assert_error(acme.delete("/v1/users/carol/facts/city"), 404, "not_found")


def test_messages_log_filter_and_page(acme: httpx.Client) -> None:
    for i in range(5):
        thread = "t1" if i % 2 == 0 else "t2"
        logged = acme.post("/v1/users/dave/messages", json={"thread": thread, "role": "user", "content": f"m{i}"})
        assert logged.status_code == 201
    page = acme.get("/v1/users/dave/messages", params={"limit": 2}).json()
    more = acme.get("/v1/users/dave/messages", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [m["content"] for m in page["items"] + more["items"]] == ["m4", "m3", "m2", "m1"]
    thread = acme.get("/v1/users/dave/messages", params={"thread": "t2"}).json()
    assert [m["content"] for m in thread["items"]] == ["m3", "m1"] and thread["next_cursor"] is None
    assert acme.post("/v1/users/dave/search", json={"question": "m1"}).json()["hits"] == []


def test_export_import_roundtrip_and_forget_user(acme: httpx.Client) -> None:
    remember(acme, "erin", "Erin's desk is by the window.", topic="desk")
    acme.put("/v1/users/erin/facts/user_name", json={"value": "Erin"})
    acme.post("/v1/users/erin/messages", json={"thread": "t", "role": "user", "content": "hello"})
    exported = acme.get("/v1/users/erin/export")
    assert exported.headers["content-type"].startswith("application/x-ndjson")
    kinds = [json.loads(line)["kind"] for line in exported.text.splitlines()]
    assert kinds[0] == "memshelf-export" and {"memory", "fact", "message"} <= set(kinds)

    headers = {"Content-Type": "application/x-ndjson"}
    counts = acme.post("/v1/users/erin2/import", content=exported.content, headers=headers).json()
    assert counts == {"memories": 1, "facts": 1, "messages": 1}
    again = acme.post("/v1/users/erin2/import", content=exported.content, headers=headers).json()
    assert again == {"memories": 0, "facts": 0, "messages": 0}
    assert_error(acme.post("/v1/users/erin2/import", content=b"{not json\n", headers=headers), 422)
    assert_error(acme.post("/v1/users/erin2/import", content=b"[1]\n", headers=headers), 422)

    erased = acme.delete("/v1/users/erin").json()
    assert erased["memories"] == 1 and erased["facts"] == 1 and erased["messages"] == 1
    assert acme.get("/v1/users/erin/memories").json()["items"] == []
    assert acme.get("/v1/users/erin2/memories").json()["items"] != []


def test_admin_creates_lists_and_revokes_keys(admin: httpx.Client, deployment: Deployment) -> None:
    created = admin.post("/v1/admin/keys", json={"tenant": "initech", "name": "bot"})
    assert created.status_code == 201
    secret, key = created.json()["secret"], created.json()["key"]
    assert key["tenant"] == "initech" and secret.startswith("ms_")
    with httpx.Client(base_url=deployment.url, headers=bearer(secret), timeout=30) as initech:
        assert remember(initech, "frank", "Initech uses TPS reports.")["id"]
        listed = admin.get("/v1/admin/keys", params={"tenant": "initech"}).json()["items"]
        assert [k["id"] for k in listed] == [key["id"]]
        assert secret not in json.dumps(listed)

        assert admin.delete(f"/v1/admin/keys/{key['id']}").status_code == 204
        assert_error(initech.get("/v1/users/frank/memories"), 401, "unauthorized")
    assert_error(admin.delete(f"/v1/admin/keys/{key['id']}"), 404, "not_found")
    paged = admin.get("/v1/admin/keys", params={"limit": 1}).json()
    assert len(paged["items"]) == 1 and paged["next_cursor"] is not None


def test_admin_erases_a_tenant_and_purges(admin: httpx.Client, deployment: Deployment) -> None:
    secret = admin.post("/v1/admin/keys", json={"tenant": "umbrella"}).json()["secret"]
    with httpx.Client(base_url=deployment.url, headers=bearer(secret), timeout=30) as umbrella:
        remember(umbrella, "gus", "Umbrella keeps samples in the basement.")
        remember(umbrella, "hal", "Hal likes the night shift.")
        erased = admin.delete("/v1/admin/tenants/umbrella").json()
        assert erased["memories"] == 2
        assert_error(umbrella.get("/v1/users/gus/memories"), 401, "unauthorized")  # its keys went with it
    purged = admin.post("/v1/admin/purge")
    assert purged.status_code == 200 and set(purged.json()) == {"memories", "facts", "fact_changes", "messages",
                                                                  "scrub_pending"}
    assert "memories" in admin.get("/v1/admin/stats").json()
    assert admin.post("/v1/admin/scrub").json() == {"scrub_pending": False}
    assert admin.post("/v1/admin/scrub", json={"full": True}).json() == {"scrub_pending": False}
    assert_error(admin.post("/v1/admin/scrub", json={"full": "yes please"}), 422, "validation_error")
    assert_error(admin.post("/v1/admin/scrub", json={"fully": True}), 422, "validation_error")


# ---------------------------------------------------------------------------------------------- a tenant's users

def test_users_of_the_keys_tenant_page_with_their_counts_and_filter(served: httpx.Client, target: str) -> None:
    names = ["ana", "ben", "bob", "cy", "dan_b"]
    for user in names:
        remember(served, user, f"{user}'s desk is by the window.")
    assert served.put("/v1/users/bob/facts/city", json={"value": "Lisbon"}).status_code == 200
    log(served, "cy", "hello", "again")
    with Shelf.open(target, embedder=None) as shelf:
        shelf.remember(Owner("globex", "bea"), "office", "Another tenant's user.")
    pages = [served.get("/v1/users", params={"limit": 2})]
    while pages[-1].json()["next_cursor"] is not None:
        pages.append(served.get("/v1/users", params={"limit": 2, "cursor": pages[-1].json()["next_cursor"]}))
    assert [r.status_code for r in pages] == [200, 200, 200]
    listed = [u for page in pages for u in page.json()["items"]]
    assert [u["user"] for u in listed] == names
    assert {k: v for k, v in listed[2].items() if k != "newest_at"} == {"user": "bob", "memories": 1, "facts": 1,
                                                                         "messages": 0}
    assert (listed[3]["memories"], listed[3]["messages"]) == (1, 2) and listed[3]["newest_at"]
    by_filter = served.get("/v1/users", params={"contains": "N_"}).json()
    assert [u["user"] for u in by_filter["items"]] == ["dan_b"] and by_filter["next_cursor"] is None
    assert served.get("/v1/users", params={"contains": ""}).json()["items"] == listed
    error = assert_error(served.get("/v1/users", params={"cursor": "ana"}), 422, "invalid_input")
    assert "pass next_cursor unchanged" in error["message"]


def test_an_admin_key_lists_no_users(admin: httpx.Client) -> None:
    error = assert_error(admin.get("/v1/users"), 403, "forbidden")
    assert "use a key bound to a tenant" in error["message"]


# ---------------------------------------------------------------------------------------------- learning

@pytest.fixture
def served(target: str) -> Iterator[httpx.Client]:
    """A server on a fresh store of the backend under test, and a client with a tenant key."""
    with Shelf.open(target, embedder=None) as shelf:
        secret = shelf.create_key("acme")[1]
    with LiveServer(create_app(target=target, embedder=None)) as live, \
            httpx.Client(base_url=live.url, headers=bearer(secret), timeout=30) as client:
        yield client


def log(client: httpx.Client, user: str, *turns: str, thread: str = "t1", role: str = "user") -> list[str]:
    ids = []
    for content in turns:
        logged = client.post(f"/v1/users/{user}/messages", json={"thread": thread, "role": role, "content": content})
        assert logged.status_code == 201, logged.text
        ids.append(logged.json()["id"])
    return ids


def learn(client: httpx.Client, user: str, **body: Any) -> dict[str, Any]:
    response = client.post(f"/v1/users/{user}/learn", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_learn_a_thread_previews_applies_and_adds_nothing_twice(served: httpx.Client) -> None:
    said = log(served, "kaleb", "Hi, I'm Kaleb.", "I live in Porto.", "I'm allergic to peanuts.")
    said += log(served, "kaleb", "Noted: you live in Madrid.", role="assistant")

    preview = learn(served, "kaleb", thread="t1", dry_run=True)
    assert preview["dry_run"] is True and preview["thread"] == "t1" and preview["extractor"] == "rules"
    assert [(p["op"], p["source"], p["key"], p["value"], p["topic"], p["content"], p["evidence"], p["record"])
            for p in preview["proposals"]] == [
        ("set_fact", "mined", "user_name", "Kaleb", None, None, [said[0]], None),
        ("set_fact", "mined", "home_city", "Porto", None, None, [said[1]], None),
        ("remember", "mined", None, None, "health", "The user is allergic to peanuts.", [said[2]], None)]
    assert all(p["reason"] and p["at"] for p in preview["proposals"])
    assert set(preview) >= {"owner", "messages", "watermark", "usage", "latency_ms"}
    assert preview["latency_ms"] >= 0
    assert served.get("/v1/users/kaleb/facts").json()["items"] == []
    assert served.get("/v1/users/kaleb/memories").json()["items"] == []

    applied = learn(served, "kaleb", thread="t1")
    memory_id = applied["proposals"][2]["record"]
    assert [p["op"] for p in applied["proposals"]] == ["set_fact", "set_fact", "remember"]
    assert memory_id.startswith("m_")
    assert sorted((f["key"], f["value"], f["source"]) for f in served.get("/v1/users/kaleb/facts").json()["items"]) \
        == [("home_city", "Porto", "mined"), ("user_name", "Kaleb", "mined")]
    hits = served.post("/v1/users/kaleb/search", json={"question": "peanuts"}).json()["hits"]
    assert [(h["memory"]["id"], h["memory"]["confidence"]) for h in hits] == [(memory_id, 0.6)]

    assert applied["messages"] == said and applied["watermark"] == said[-1] and preview["watermark"] is None
    again = learn(served, "kaleb", thread="t1")
    assert (again["proposals"], again["messages"], again["watermark"]) == ([], [], applied["watermark"])
    moved_id = log(served, "kaleb", "I moved to Lisbon last month.")[0]
    moved = learn(served, "kaleb", thread="t1")
    assert moved["messages"] == [moved_id] and moved["watermark"] == moved_id
    assert [(p["op"], p["key"], p["value"], p["evidence"]) for p in moved["proposals"]] == [
        ("set_fact", "home_city", "Lisbon", [moved_id])]
    history = served.get("/v1/users/kaleb/facts/home_city/history").json()["items"]
    assert [c["value"] for c in history] == ["Porto", "Lisbon"]
    assert served.get("/v1/users/someone_else/facts").json()["items"] == []

    kept = served.delete("/v1/users/kaleb/threads/t1")
    assert kept.status_code == 200 and kept.json()["messages"] == 5 and kept.json()["memories"] == 0
    assert served.get("/v1/users/kaleb/facts/home_city").json()["value"] == "Lisbon"
    log(served, "kaleb", "I'm vegetarian.", thread="t2")
    assert learn(served, "kaleb", thread="t2")["proposals"][0]["op"] in ("remember", "set_fact")
    erased = served.delete("/v1/users/kaleb/threads/t2", params={"cascade": "true"}).json()
    assert erased["messages"] == 1 and erased["memories"] + erased["facts"] == 1
    assert served.get("/v1/users/kaleb/messages", params={"thread": "t2"}).json()["items"] == []


def test_learn_turns_given_in_the_body(acme: httpx.Client) -> None:
    turns = [{"role": "user", "content": "My name is Lin.", "id": "c1", "at": "2026-05-01T09:30:00+02:00"},
             {"role": "assistant", "content": "Hello Lin, you live in Oslo."},
             {"role": "user", "content": "Remember that the [b]x[/b] closing [/] tag matters."}]
    plan = learn(acme, "lin", messages=turns)
    assert plan["thread"] is None and plan["messages"] == []
    assert [(p["op"], p["key"], p["value"], p["evidence"], p["at"]) for p in plan["proposals"]][0] == (
        "set_fact", "user_name", "Lin", ["c1"], "2026-05-01T07:30:00Z")
    assert plan["proposals"][1]["source"] == "stated"
    assert plan["proposals"][1]["content"] == "The [b]x[/b] closing [/] tag matters"
    assert acme.get("/v1/users/lin/facts/user_name").json()["value"] == "Lin"


class Unreachable(Extractor):
    """An extractor whose model service is down, as a model extractor reports it."""

    name = "unreachable"

    def propose(self, turns: Any, known: Any = None) -> list[Proposal]:
        raise ExtractorError("the model service at http://127.0.0.1:9 refused the connection: start it, or "
                             "choose another extractor")


def test_an_extractor_that_fails_is_502_and_writes_nothing(acme: httpx.Client) -> None:
    register_extractor("test-unreachable", lambda model: Unreachable())
    log(acme, "mo", "I live in Porto.")
    error = assert_error(acme.post("/v1/users/mo/learn", json={"thread": "t1", "extractor": "test-unreachable"}),
                         502, "extractor_error")
    assert "refused" in error["message"]
    assert acme.get("/v1/users/mo/facts").json()["items"] == []
    assert learn(acme, "mo", thread="t1", extractor="rules")["proposals"][0]["value"] == "Porto"


class Busy(Extractor):
    """An extractor whose model service is busy (HTTP 503 upstream), as a model extractor reports it."""

    name = "busy"

    def propose(self, turns: Any, known: Any = None) -> list[Proposal]:
        raise ExtractorUnavailable("the model service answered HTTP 503, so nothing was learned: wait, then learn "
                                   "again (the same messages are read)")


def test_an_extractor_whose_service_is_down_is_503_with_retry_after(acme: httpx.Client) -> None:
    """Down or busy means try again: 503 and Retry-After, like a store or embedder that cannot answer now; the
    watermark stays, so the retry reads the same turns."""
    register_extractor("test-busy", lambda model: Busy())
    log(acme, "bo", "I live in Faro.")
    response = acme.post("/v1/users/bo/learn", json={"thread": "t1", "extractor": "test-busy"})
    error = assert_error(response, 503, "extractor_unavailable")
    assert response.headers["Retry-After"] == "1" and "learn again" in error["message"]
    assert learn(acme, "bo", thread="t1", extractor="rules")["proposals"][0]["value"] == "Faro"


# ---------------------------------------------------------------------------------------------- authentication

@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer"}, {"Authorization": "Bearer ms_wrong"}, {"Authorization": "Basic dXNlcjpwdw=="},
    {"X-API-Key": "ms_not_a_key"}, {"Authorization": "Bearer " + "x" * 5000},
], ids=["none", "empty-bearer", "wrong", "basic", "wrong-x-api-key", "huge"])
@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/users/alice/memories"), ("POST", "/v1/users/alice/search"), ("DELETE", "/v1/users/alice"),
    ("GET", "/v1/users"), ("GET", "/v1/admin/keys"), ("POST", "/mcp"), ("GET", "/v1/nowhere"),
])
def test_missing_or_wrong_key_is_401(anonymous: httpx.Client, headers: dict[str, str], method: str,
                                     path: str) -> None:
    response = anonymous.request(method, path, headers=headers, json={"question": "x"})
    assert_error(response, 401, "unauthorized")
    assert response.headers["WWW-Authenticate"].startswith('Bearer realm="memshelf"')


def test_x_api_key_header_works_too(deployment: Deployment) -> None:
    with httpx.Client(base_url=deployment.url, headers={"X-API-Key": deployment.acme}) as client:
        assert client.get("/v1/users/alice/memories").status_code == 200


def test_revoked_key_is_401(admin: httpx.Client, deployment: Deployment) -> None:
    made = admin.post("/v1/admin/keys", json={"tenant": "acme", "name": "short-lived"}).json()
    with httpx.Client(base_url=deployment.url, headers=bearer(made["secret"])) as client:
        assert client.get("/v1/users/alice/memories").status_code == 200
        admin.delete(f"/v1/admin/keys/{made['key']['id']}")
        assert_error(client.get("/v1/users/alice/memories"), 401, "unauthorized")


@pytest.mark.parametrize("quick", [True, False], ids=["sqlite-file", "in-memory"])
def test_keys_are_checked_on_the_event_loop_only_where_reads_are_quick(tmp_path: Path, quick: bool) -> None:
    """A SQLite file answers a key lookup in microseconds and its readers never wait for a writer, so the key is
    checked on the event loop (a worker-thread hop costs more than the lookup); elsewhere in a worker thread. Either
    way nothing is cached: a key revoked through another connection is refused by the next request."""
    from fastapi.testclient import TestClient

    target = str(tmp_path / "memory.db") if quick else ":memory:"
    shelf = Shelf.open(target, embedder=None)
    made, secret = shelf.create_key("acme")
    threads: list[str] = []
    lookup = shelf.authenticate
    shelf.authenticate = lambda given: (threads.append(threading.current_thread().name), lookup(given))[1]
    try:
        with TestClient(create_app(shelf)) as client:
            assert client.get("/v1/users", headers=bearer(secret)).status_code == 200
            if quick:
                with Shelf.open(target, embedder=None) as other:
                    other.revoke_key(made.id)
            else:
                shelf.revoke_key(made.id)
            assert_error(client.get("/v1/users", headers=bearer(secret)), 401, "unauthorized")
    finally:
        shelf.close()
    assert shelf.store.quick_reads is quick
    assert len(threads) == 2 and all((name == "AnyIO worker thread") is not quick for name in threads), threads


def test_another_tenants_record_is_404_like_a_missing_one(acme: httpx.Client, deployment: Deployment) -> None:
    theirs = remember(acme, "ivy", "Acme's vault code is 1234.")
    missing = assert_error(acme.get("/v1/users/ivy/memories/m_0000000000000000"), 404, "not_found")
    with httpx.Client(base_url=deployment.url, headers=bearer(deployment.globex)) as globex:
        for response in (globex.get(f"/v1/users/ivy/memories/{theirs['id']}"),
                         globex.delete(f"/v1/users/ivy/memories/{theirs['id']}")):
            error = assert_error(response, 404, "not_found")
            assert error["message"].replace(theirs["id"], "ID").split(":")[0] == \
                missing["message"].replace("m_0000000000000000", "ID").replace("acme", "globex").split(":")[0]
        assert globex.post("/v1/users/ivy/search", json={"question": "vault code"}).json()["hits"] == []
        assert globex.get("/v1/users/ivy/memories").json()["items"] == []
        assert globex.get("/v1/users/ivy/export").text.count("\n") == 1  # the header line only
    assert acme.get(f"/v1/users/ivy/memories/{theirs['id']}").status_code == 200


def test_another_users_record_is_404(acme: httpx.Client) -> None:
    theirs = remember(acme, "jack", "Jack's locker is 42.")
    assert_error(acme.get(f"/v1/users/jill/memories/{theirs['id']}"), 404, "not_found")
    assert_error(acme.delete(f"/v1/users/jill/memories/{theirs['id']}"), 404, "not_found")
    assert acme.post("/v1/users/jill/search", json={"question": "locker"}).json()["hits"] == []
    assert acme.get(f"/v1/users/jack/memories/{theirs['id']}").status_code == 200


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/v1/admin/keys", None), ("POST", "/v1/admin/keys", {"tenant": "acme"}),
    ("DELETE", "/v1/admin/keys/key_0000", None), ("DELETE", "/v1/admin/tenants/globex", None),
    ("POST", "/v1/admin/purge", None), ("GET", "/v1/admin/stats", None), ("POST", "/v1/admin/scrub", None),
])
def test_tenant_key_on_admin_endpoints_is_403(acme: httpx.Client, method: str, path: str, body: Any) -> None:
    assert_error(acme.request(method, path, json=body), 403, "forbidden")


def test_tenant_key_cannot_mint_keys_for_itself_via_body(acme: httpx.Client, admin: httpx.Client) -> None:
    assert_error(acme.post("/v1/admin/keys", json={"tenant": None}), 403, "forbidden")
    assert_error(admin.get("/v1/users/alice/memories"), 403, "forbidden")  # admin keys hold no user data


def test_tenant_in_body_is_rejected_not_obeyed(acme: httpx.Client, deployment: Deployment) -> None:
    sneaky = {"topic": "t", "content": "planted", "tenant": "globex"}
    assert_error(acme.post("/v1/users/kim/memories", json=sneaky), 422, "validation_error")
    with httpx.Client(base_url=deployment.url, headers=bearer(deployment.globex)) as globex:
        assert globex.get("/v1/users/kim/memories").json()["items"] == []


# ---------------------------------------------------------------------------------------------- bad input

BAD_INPUT = [
    ("malformed-json", "POST", "/v1/users/u/memories", b'{"topic": "a", "content": ', 400, "malformed_json"),
    ("not-utf8-json", "POST", "/v1/users/u/memories", b'{"topic": "a", "content": "\xff"}', 400, "malformed_json"),
    ("json-nested-too-deep", "POST", "/v1/users/u/search", b"[" * 5_000 + b"]" * 5_000, 400, "malformed_json"),
    ("not-an-object", "POST", "/v1/users/u/memories", b'["a", "b"]', 422, "validation_error"),
    ("ttl-true", "POST", "/v1/users/u/memories", {"topic": "a", "content": "b", "ttl": True}, 422,
     "validation_error"),
    ("ttl-text", "POST", "/v1/users/u/memories", {"topic": "a", "content": "b", "ttl": "10"}, 422,
     "validation_error"),
    ("ttl-under-a-microsecond", "POST", "/v1/users/u/memories", {"topic": "a", "content": "b", "ttl": 1e-9}, 422,
     "invalid_input"),
    ("search-limit-true", "POST", "/v1/users/u/search", {"question": "q", "limit": True}, 422, "validation_error"),
    ("wrong-type", "POST", "/v1/users/u/memories", {"topic": 5, "content": ["x"]}, 422, "validation_error"),
    ("missing-field", "POST", "/v1/users/u/memories", {"topic": "a"}, 422, "validation_error"),
    ("empty-content", "POST", "/v1/users/u/memories", {"topic": "a", "content": ""}, 422, "validation_error"),
    ("blank-content", "POST", "/v1/users/u/memories", {"topic": "a", "content": "   "}, 422, "invalid_input"),
    ("unknown-source", "POST", "/v1/users/u/memories", {"topic": "a", "content": "b", "source": "gossip"}, 422,
     "unknown_source"),
    ("negative-ttl", "POST", "/v1/users/u/memories", {"topic": "a", "content": "b", "ttl": -5}, 422,
     "validation_error"),
    ("naive-expiry", "POST", "/v1/users/u/memories", {"topic": "a", "content": "b",
                                                      "expires_at": "2030-01-01T00:00:00"}, 422, "validation_error"),
    ("nul-in-content", "POST", "/v1/users/u/memories", {"topic": "a", "content": "b\u0000c"}, 422, "invalid_input"),
    ("too-long-content", "POST", "/v1/users/u/memories", {"topic": "a", "content": "x" * 16_001}, 422,
     "validation_error"),
    ("empty-batch", "POST", "/v1/users/u/memories/batch", {"memories": []}, 422, "validation_error"),
    ("search-limit-0", "POST", "/v1/users/u/search", {"question": "q", "limit": 0}, 422, "validation_error"),
    ("search-limit-negative", "POST", "/v1/users/u/search", {"question": "q", "limit": -1}, 422, "validation_error"),
    ("search-limit-huge", "POST", "/v1/users/u/search", {"question": "q", "limit": 10**9}, 422, "validation_error"),
    ("search-limit-bigger-than-int64", "POST", "/v1/users/u/search", {"question": "q", "limit": 10**30}, 422,
     "validation_error"),
    ("search-limit-string", "POST", "/v1/users/u/search", {"question": "q", "limit": "many"}, 422,
     "validation_error"),
    ("search-unknown-mode", "POST", "/v1/users/u/search", {"question": "q", "mode": "psychic"}, 422,
     "validation_error"),
    ("search-floor-out-of-range", "POST", "/v1/users/u/search", {"question": "q", "floor": 7}, 422,
     "validation_error"),
    ("empty-question", "POST", "/v1/users/u/search", {"question": ""}, 422, "validation_error"),
    ("list-limit-0", "GET", "/v1/users/u/memories?limit=0", None, 422, "validation_error"),
    ("list-limit-negative", "GET", "/v1/users/u/memories?limit=-1", None, 422, "validation_error"),
    ("list-limit-huge", "GET", "/v1/users/u/memories?limit=1000000000", None, 422, "validation_error"),
    ("list-limit-text", "GET", "/v1/users/u/messages?limit=ten", None, 422, "validation_error"),
    ("forged-cursor", "GET", "/v1/users/u/memories?cursor=abc", None, 422, "invalid_input"),
    ("forged-offset-cursor", "GET", "/v1/users/u/facts?cursor=!!!", None, 422, "invalid_input"),
    ("user-with-control-char", "GET", "/v1/users/a%01b/memories", None, 422, "invalid_input"),
    ("fact-unknown-source", "PUT", "/v1/users/u/facts/k", {"value": "v", "source": "rumour"}, 422,
     "unknown_source"),
    ("fact-empty-value", "PUT", "/v1/users/u/facts/k", {"value": ""}, 422, "validation_error"),
    ("message-missing-role", "POST", "/v1/users/u/messages", {"thread": "t", "content": "c"}, 422,
     "validation_error"),
    ("import-empty", "POST", "/v1/users/u/import", b"", 422, "invalid_input"),
    ("import-bad-record", "POST", "/v1/users/u/import", b'{"kind": "memory", "id": "m_1"}\n', 422, "invalid_input"),
    ("learn-neither", "POST", "/v1/users/u/learn", {"dry_run": True}, 422, "invalid_input"),
    ("learn-both", "POST", "/v1/users/u/learn", {"thread": "t", "messages": [{"role": "user", "content": "hi"}]},
     422, "invalid_input"),
    ("learn-no-messages", "POST", "/v1/users/u/learn", {"messages": []}, 422, "validation_error"),
    ("learn-turn-without-role", "POST", "/v1/users/u/learn", {"messages": [{"content": "I live in Porto."}]}, 422,
     "validation_error"),
    ("learn-naive-time", "POST", "/v1/users/u/learn", {"messages": [{"role": "user", "content": "I live in Porto.",
                                                                     "at": "2026-05-01T09:30:00"}]}, 422,
     "validation_error"),
    ("learn-time-out-of-range", "POST", "/v1/users/u/learn", {"messages": [
        {"role": "user", "content": "I live in Porto.", "at": "0001-01-01T00:00:00+05:00"}]}, 422, "validation_error"),
    ("learn-unknown-extractor", "POST", "/v1/users/u/learn", {"thread": "t", "extractor": "psychic"}, 422,
     "invalid_input"),
    ("learn-empty-thread", "POST", "/v1/users/u/learn", {"thread": ""}, 422, "validation_error"),
    ("forget-thread-cascade-not-bool", "DELETE", "/v1/users/u/threads/t?cascade=maybe", None, 422,
     "validation_error"),
    ("users-bad-cursor", "GET", "/v1/users?cursor=c1.bogus", None, 422, "invalid_input"),
    ("users-limit-zero", "GET", "/v1/users?limit=0", None, 422, "validation_error"),
    ("users-filter-with-a-control-character", "GET", "/v1/users?contains=a%01b", None, 422, "invalid_input"),
    ("users-filter-too-long", "GET", "/v1/users?contains=" + "x" * 201, None, 422, "validation_error"),
    ("path-not-utf8", "POST", "/v1/users/a%FF/memories", {"topic": "a", "content": "b"}, 400, "invalid_path"),
    ("path-latin-1", "GET", "/v1/users/Zo%EB/memories", None, 400, "invalid_path"),
    ("query-not-utf8", "GET", "/v1/users?contains=Zo%EB", None, 400, "invalid_path"),
    ("unknown-route", "GET", "/v1/users/u/nothing-here", None, 404, "not_found"),
    ("wrong-method", "PATCH", "/v1/users/u/memories", None, 405, "method_not_allowed"),
]


@pytest.mark.parametrize("method, path, body, status, kind", [case[1:] for case in BAD_INPUT],
                         ids=[case[0] for case in BAD_INPUT])
def test_bad_input_is_a_4xx_json_error(acme: httpx.Client, method: str, path: str, body: Any, status: int,
                                       kind: str) -> None:
    if isinstance(body, bytes):
        response = acme.request(method, path, content=body, headers={"Content-Type": "application/json"})
    else:
        response = acme.request(method, path, json=body)
    error = assert_error(response, status, kind)
    if status == 422 and kind == "validation_error":
        assert "/docs" in error["message"]


def test_a_422_names_the_field_and_the_problem_in_plain_words(acme: httpx.Client) -> None:
    response = acme.post("/v1/users/u/messages", json={"thread": "t", "content": 5, "sender": "me"})
    message = assert_error(response, 422, "validation_error")["message"]
    assert message.startswith("role is missing; content: input should be a valid string; unknown field 'sender'. ")
    assert "pydantic" not in message and "http" not in message


@pytest.mark.parametrize("body, content_type", [
    (b'{"question": "printer"}', "text/plain"), (b"question=printer", "application/x-www-form-urlencoded"),
    (b'["printer"]', "application/json"), (b'"printer"', "application/json")])
def test_a_body_that_is_not_a_json_object_says_to_send_one(acme: httpx.Client, body: bytes,
                                                            content_type: str) -> None:
    """A body the server does not read as a JSON object is named as such, with the header to send, instead of
    pydantic's "body: input should be a valid dictionary"; nothing is written."""
    for path in ("/v1/users/plain-text/search", "/v1/users/plain-text/memories"):
        response = acme.post(path, content=body, headers={"Content-Type": content_type})
        message = assert_error(response, 422, "validation_error")["message"]
        assert message.startswith("the request body is not a JSON object: ")
        assert "Content-Type: application/json" in message and "/docs" in message
    assert acme.get("/v1/users/plain-text/memories").json()["items"] == []


@pytest.mark.parametrize("method, path, allow", [
    ("PATCH", "/v1/users/u/memories", "GET, POST"), ("PUT", "/v1/users/u/memories/m_1", "DELETE, GET, PATCH"),
    ("POST", "/v1/users/u/facts/k", "DELETE, GET, PUT"), ("POST", "/health", "GET"),
    ("PUT", "/v1/admin/keys", "GET, POST"),
])
def test_405_says_every_method_the_path_takes(acme: httpx.Client, method: str, path: str, allow: str) -> None:
    """Starlette's Allow named only the first route's methods at a path several routes share."""
    response = acme.request(method, path)
    assert f"takes {allow}, not {method}" in assert_error(response, 405, "method_not_allowed")["message"]
    assert response.headers["Allow"] == allow


SCHEMA_EDGES = [  # (what, method, path template, path parameters, body)
    ("user with a control character", "GET", "/v1/users/{user}/memories", {"user": "a\x01b"}, None),
    ("user of spaces", "GET", "/v1/users/{user}/memories", {"user": "  "}, None),
    ("user of a no-break space", "GET", "/v1/users/{user}/memories", {"user": "\xa0"}, None),
    ("user of a next-line character", "GET", "/v1/users/{user}/memories", {"user": "\x85"}, None),
    ("user with spaces and accents", "GET", "/v1/users/{user}/memories", {"user": "zoë o'brien"}, None),
    ("user with a zero-width space", "GET", "/v1/users/{user}/memories", {"user": "a\u200bb"}, None),
    ("undeclared source", "POST", "/v1/users/{user}/memories", {"user": "u"},
     {"topic": "t", "content": "c", "source": "gossip"}),
    ("built-in source", "POST", "/v1/users/{user}/memories", {"user": "u"},
     {"topic": "t", "content": "c", "source": "mined"}),
    ("content of spaces", "POST", "/v1/users/{user}/memories", {"user": "u"}, {"topic": "t", "content": " \t "}),
    ("content with NUL", "POST", "/v1/users/{user}/memories", {"user": "u"}, {"topic": "t", "content": "a\x00b"}),
    ("content with lines, tabs and a BOM", "POST", "/v1/users/{user}/memories", {"user": "u"},
     {"topic": "t", "content": "\ufeffone\n\ttwo"}),
    ("topic of a separator", "POST", "/v1/users/{user}/memories", {"user": "u"}, {"topic": "\x1c", "content": "c"}),
    ("fact key of spaces", "PUT", "/v1/users/{user}/facts/{key}", {"user": "u", "key": " "}, {"value": "v"}),
    ("fact value with NUL", "PUT", "/v1/users/{user}/facts/{key}", {"user": "u", "key": "k"}, {"value": "v\x00"}),
    ("role of a tab", "POST", "/v1/users/{user}/messages", {"user": "u"},
     {"thread": "t", "role": "\t", "content": "c"}),
    ("role no chat API has", "POST", "/v1/users/{user}/messages", {"user": "u"},
     {"thread": "t", "role": "human", "content": "c"}),
    ("role in capitals, spaced", "POST", "/v1/users/{user}/messages", {"user": "u"},
     {"thread": "t", "role": " Assistant ", "content": "c"}),
    ("turn of a role no chat API has", "POST", "/v1/users/{user}/learn", {"user": "u"},
     {"messages": [{"role": "bot", "content": "I live in Porto."}], "dry_run": True}),
    ("memory id of spaces", "GET", "/v1/users/{user}/memories/{memory_id}", {"user": "u", "memory_id": "  "}, None),
    ("memory id unknown", "GET", "/v1/users/{user}/memories/{memory_id}", {"user": "u", "memory_id": "m_x"}, None),
    ("prompt text with NUL", "POST", "/v1/users/{user}/prompt", {"user": "u"},
     {"base_prompt": "b", "user_text": "a\x00"}),
]


def schema_allows(openapi: dict[str, Any], method: str, template: str, params: dict[str, str], body: Any) -> bool:
    from jsonschema import Draft202012Validator

    def allows(value: Any, schema: dict[str, Any]) -> bool:
        return Draft202012Validator({**schema, "components": openapi["components"]}).is_valid(value)

    operation = openapi["paths"][template][method.lower()]
    if not all(allows(params[p["name"]], p["schema"]) for p in operation["parameters"] if p["name"] in params):
        return False
    return body is None or allows(body, operation["requestBody"]["content"]["application/json"]["schema"])


@pytest.mark.parametrize("method, template, params, body", [case[1:] for case in SCHEMA_EDGES],
                         ids=[case[0] for case in SCHEMA_EDGES])
def test_the_openapi_schema_allows_what_the_server_accepts(acme: httpx.Client, method: str, template: str,
                                                           params: dict[str, str], body: Any) -> None:
    """An undeclared source and a user with a control character passed the schema, then came back 422."""
    from urllib.parse import quote

    path = template.format(**{name: quote(value, safe="") for name, value in params.items()})
    response = acme.request(method, path, json=body)
    allowed = schema_allows(acme.get("/openapi.json").json(), method, template, params, body)
    assert (response.status_code != 422) == allowed, response.text
    if not allowed:
        assert_error(response, 422)


def test_the_schema_names_the_sources_the_server_declares(tmp_path: Path) -> None:
    with Shelf.open(tmp_path / "s.db", embedder=None, sources={"sensor": 0.8}) as shelf:
        secret = shelf.create_key("acme")[1]
        with LiveServer(create_app(shelf)) as live, \
                httpx.Client(base_url=live.url, headers=bearer(secret), timeout=30) as client:
            schemas = client.get("/openapi.json").json()["components"]["schemas"]
            for model in ("MemoryIn", "FactIn"):
                assert schemas[model]["properties"]["source"]["enum"] == ["stated", "mined", "inferred", "sensor"]
            assert "enum" not in schemas["MemoryOut"]["properties"]["source"]  # what was stored may predate it
            stored = client.post("/v1/users/u/memories", json={"topic": "t", "content": "c", "source": "sensor"})
            assert stored.json()["confidence"] == 0.8


def test_the_schemas_text_rules_are_memshelfs() -> None:
    """The patterns the schema shows are the checks model.py makes, character by character (JSON Schema's \\s is
    not Python's whitespace, so the schema spells it out)."""
    import re

    from memshelf import InvalidInput, Owner
    from memshelf.model import check_text
    from memshelf.server._schemas import IDENTIFIER, NOT_BLANK, TEXT

    def accepts(check: Any, value: str) -> bool:
        try:
            check(value)
        except InvalidInput:
            return False
        return True

    rules = [(TEXT, lambda v: check_text("t", v)), (IDENTIFIER, lambda v: Owner("t", v)),
             (NOT_BLANK, lambda v: Shelf._check_id(v))]
    names = [" a", "a\u3000", "a b", ".", "..", "...", ".a", "a.", "a..b", "\t"]
    for value in [chr(n) for n in range(0x3100)] + ["\ufeff", "\U0001f600"] + names:
        for rule, check in rules:
            assert bool(re.search(rule["pattern"], value)) == accepts(check, value), (rule, value)


def test_oversized_body_is_413(acme: httpx.Client) -> None:
    huge = json.dumps({"topic": "a", "content": "x" * (MAX_BODY_BYTES + 10)}).encode()
    assert_error(acme.post("/v1/users/u/memories", content=huge, headers={"Content-Type": "application/json"}),
                 413, "payload_too_large")


def test_only_an_import_gets_the_import_limit(acme: httpx.Client) -> None:
    """The 64 MiB limit is POST .../import's: a fact named "import" (or a user "x/import") has the usual one."""
    over = json.dumps({"value": "x" * (MAX_BODY_BYTES + 10)}).encode()
    for path in ("/v1/users/u/facts/import", "/v1/users/x%2Fimport/facts/k"):
        assert_error(acme.put(path, content=over, headers={"Content-Type": "application/json"}),
                     413, "payload_too_large")


def test_oversized_chunked_body_without_length_is_413(acme: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"topic": "a", "content": "'
        for _ in range(20):
            yield b"x" * 65_536
        yield b'"}'

    response = acme.post("/v1/users/u/memories", content=chunks(), headers={"Content-Type": "application/json"})
    assert "content-length" not in {k.lower() for k in response.request.headers}
    assert_error(response, 413, "payload_too_large")


def test_lying_content_length_is_413_and_server_stays_up(deployment: Deployment) -> None:
    with socket.create_connection(("127.0.0.1", int(deployment.url.rsplit(":", 1)[1])), timeout=10) as raw:
        raw.sendall(b"POST /v1/users/u/memories HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    + deployment.acme.encode() + b"\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 99999999999\r\n\r\n{}")
        received = b""
        while chunk := raw.recv(4096):  # the server closes the connection after refusing
            received += chunk
    reply = received.decode(errors="replace")
    assert reply.startswith("HTTP/1.1 413") and "payload_too_large" in reply
    assert httpx.get(deployment.url + "/health").status_code == 200


# ---------------------------------------------------------------------------------------------- memshelf serve

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[bytes], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"memshelf serve exited with {process.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"memshelf serve did not answer /health within {seconds} s")


@pytest.mark.slow
def test_serve_with_two_workers_shares_one_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key("acme")[1]
    port = free_port()
    code = f"from memshelf.server import serve; serve(port={port}, workers=2, db={str(db)!r}, embedder='none', " \
           "log_level='warning')"
    process = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process)
        with httpx.Client(base_url=url, headers=bearer(secret), timeout=30) as client:
            ids = {remember(client, "w", f"fact number {i}")["id"] for i in range(20)}
            listed = client.get("/v1/users/w/memories", params={"limit": 100}).json()["items"]
            assert {m["id"] for m in listed} == ids
    finally:
        process.terminate()
        process.wait(timeout=30)



def _listening_workers(parent: int, port: int) -> dict[int, int]:
    """The serving processes under `parent` (those listening on `port`), each with its established connections."""
    import psutil

    found: dict[int, int] = {}
    for child in psutil.Process(parent).children(recursive=True):
        try:
            sockets = [c for c in child.net_connections(kind="tcp") if c.laddr and c.laddr.port == port]
        except psutil.NoSuchProcess:
            continue
        if any(c.status == psutil.CONN_LISTEN for c in sockets):
            found[child.pid] = sum(c.status == psutil.CONN_ESTABLISHED for c in sockets)
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT spreads connections on Linux only")
def test_two_workers_each_listen_take_connections_and_a_dead_one_is_replaced(tmp_path: Path) -> None:
    db = tmp_path / "spread.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key("acme")[1]
    port = free_port()
    code = f"from memshelf.server import serve; serve(port={port}, workers=2, db={str(db)!r}, embedder='none', " \
           "log_level='warning', access_log=False); print('RETURNED', flush=True)"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    clients: list[httpx.Client] = []
    try:
        wait_healthy(url, process)
        for _ in range(24):  # connections kept open: Linux picks a worker's socket by a hash of each one's ports
            client = httpx.Client(base_url=url, headers=bearer(secret), timeout=30)
            assert client.get("/health").status_code == 200
            clients.append(client)
        workers = _listening_workers(process.pid, port)
        assert len(workers) == 2 and all(count > 0 for count in workers.values()), workers

        os.kill(next(iter(workers)), 9)  # a worker dies: another takes its place, and no write is lost
        deadline = time.monotonic() + 60
        while (now := _listening_workers(process.pid, port)).keys() == workers.keys() or len(now) < 2:
            assert time.monotonic() < deadline and process.poll() is None, now
            time.sleep(0.2)
        with httpx.Client(base_url=url, headers=bearer(secret), timeout=30) as client:
            ids = {remember(client, "w", f"fact number {i}")["id"] for i in range(10)}
        with httpx.Client(base_url=url, headers=bearer(secret), timeout=30) as client:
            assert {m["id"] for m in client.get("/v1/users/w/memories").json()["items"]} == ids
    finally:
        for client in clients:
            client.close()
        process.terminate()  # SIGTERM: every worker stops, and serve() returns to its caller
        out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and b"RETURNED" in out
    assert _listening_workers(os.getpid(), port) == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT spreads connections on Linux only")
def test_several_workers_refuse_a_port_another_server_has(tmp_path: Path) -> None:
    from memshelf.errors import ConfigError
    from memshelf.server import serve

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}.*pass another --port"):
            serve(port=port, workers=2, db=str(tmp_path / "m.db"), embedder="none", log_level="warning")
    assert not (tmp_path / "m.db").exists()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT spreads connections on Linux only")
def test_workers_that_cannot_start_stop_the_server_with_an_error(tmp_path: Path) -> None:
    from memshelf.errors import MemshelfError
    from memshelf.server import serve

    started = time.monotonic()
    with pytest.raises(MemshelfError, match="exited with 1 before it could serve: read the log above"):
        serve(port=free_port(), workers=2, db=str(tmp_path), embedder="none", log_level="critical")
    assert time.monotonic() - started < 60  # not restarted again and again


# ---------------------------------------------------------------------------------------------- the inspector

def test_memories_list_by_topic_source_text_and_confidence(served: httpx.Client) -> None:
    for content, topic, source in [("The printer is on 192.168.1.40.", "network", "inferred"),
                                   ("The router is an ASUS.", "network", "stated"),
                                   ("Kaleb likes green tea.", "food", "mined")]:
        remember(served, "kaleb", content, topic, source=source)

    def listed(**params: Any) -> list[str]:
        response = served.get("/v1/users/kaleb/memories", params=params)
        assert response.status_code == 200, response.text
        return [m["content"] for m in response.json()["items"]]

    assert listed(topic="network", source="inferred") == ["The printer is on 192.168.1.40."]
    assert listed(contains="TEA") == ["Kaleb likes green tea."]
    assert listed(order="confident") == ["The router is an ASUS.", "Kaleb likes green tea.",
                                         "The printer is on 192.168.1.40."]
    first = served.get("/v1/users/kaleb/memories", params={"order": "confident", "limit": 2}).json()
    rest = served.get("/v1/users/kaleb/memories",
                      params={"order": "confident", "limit": 2, "cursor": first["next_cursor"]}).json()
    assert [m["content"] for m in rest["items"]] == ["The printer is on 192.168.1.40."]
    error = assert_error(served.get("/v1/users/kaleb/memories", params={"cursor": first["next_cursor"]}), 422)
    assert "pass next_cursor unchanged" in error["message"]
    assert "newest" in assert_error(served.get("/v1/users/kaleb/memories", params={"order": "oldest"}), 422)["message"]
    error = assert_error(served.get("/v1/users/kaleb/memories", params={"source": "crm"}), 422, "unknown_source")
    assert "MEMSHELF_SOURCES" in error["message"]


def test_confirm_a_guess_change_its_expiry_and_see_the_working_of_a_search(served: httpx.Client) -> None:
    guess = remember(served, "kaleb", "The printer is on 192.168.1.40.", source="inferred")
    assert (guess["confirmed_at"], guess["confirmed_from"]) == (None, None)
    confirmed = served.post(f"/v1/users/kaleb/memories/{guess['id']}/confirm")
    assert confirmed.status_code == 200, confirmed.text
    body = confirmed.json()
    assert (body["source"], body["confidence"], body["confirmed_from"]) == ("stated", 1.0, "inferred")
    assert body["confirmed_at"] and body["content"] == guess["content"]
    assert served.post(f"/v1/users/kaleb/memories/{guess['id']}/confirm").json() == body  # unchanged
    assert_error(served.post("/v1/users/kaleb/memories/m_0000000000000000/confirm"), 404, "not_found")
    assert_error(served.post(f"/v1/users/maya/memories/{guess['id']}/confirm"), 404, "not_found")

    path = f"/v1/users/kaleb/memories/{guess['id']}"
    moved = served.patch(path, json={"ttl": 3600})
    assert moved.status_code == 200, moved.text
    assert moved.json()["expires_at"] > guess["created_at"]
    assert served.patch(path, json={"expires_at": "2099-01-01T00:00:00Z"}).json()["expires_at"].startswith("2099")
    assert served.patch(path, json={"expires_at": None}).json()["expires_at"] is None
    for bad in ({}, {"ttl": 60, "expires_at": None}, {"ttl": None}, {"ttl": -5}, {"colour": "red"},
                {"expires_at": "2099-01-01T00:00:00"}):
        assert_error(served.patch(path, json=bad), 422)
    error = assert_error(served.patch(path, json={"expires_at": "2001-01-01T00:00:00Z"}), 422, "invalid_input")
    assert "already passed" in error["message"]
    assert_error(served.patch("/v1/users/maya/memories/" + guess["id"], json={"ttl": 5}), 404, "not_found")

    for mode in ("keyword", "auto"):
        hit = served.post("/v1/users/kaleb/search", json={"question": "printer", "mode": mode}).json()["hits"][0]
        assert (hit["retriever"], hit["details"]["keyword_rank"]) == ("keyword", 1)
        assert hit["details"]["keyword_score"] == pytest.approx(hit["score"], abs=1e-6)


def test_a_superseded_memory_is_listed_on_request_and_cannot_be_confirmed(served: httpx.Client, target: str) -> None:
    old = remember(served, "kaleb", "Kaleb lives in Porto.", "home", source="inferred")
    new = remember(served, "kaleb", "Kaleb lives in Lisbon.", "home")
    with Shelf.open(target, embedder=None) as shelf:
        shelf.store.supersede_memory(Owner("acme", "kaleb"), old["id"], new["id"], shelf.now())
    listed = served.get("/v1/users/kaleb/memories", params={"include_superseded": "true"}).json()["items"]
    assert [(m["content"], m["superseded_by"]) for m in listed] == [
        ("Kaleb lives in Lisbon.", None), ("Kaleb lives in Porto.", new["id"])]
    error = assert_error(served.post(f"/v1/users/kaleb/memories/{old['id']}/confirm"), 409, "conflict")
    assert new["id"] in error["message"] and "confirm the memory that replaced it" in error["message"]


def test_evidence_links_what_was_learned_to_the_messages(served: httpx.Client) -> None:
    said = log(served, "kaleb", "I live in Porto.")
    learn(served, "kaleb", thread="t1")
    everything = served.get("/v1/users/kaleb/evidence")
    assert everything.status_code == 200, everything.text
    rows = everything.json()
    assert rows and {r["message_id"] for r in rows} == set(said) and {r["thread"] for r in rows} == {"t1"}
    one = rows[0]
    by_record = served.get("/v1/users/kaleb/evidence",
                           params={"memory_id" if one["kind"] == "memory" else "key": one["record"]}).json()
    assert one in by_record
    assert served.get("/v1/users/maya/evidence").json() == []
    error = assert_error(served.get("/v1/users/kaleb/evidence", params={"memory_id": "m_1", "key": "city"}), 422)
    assert "not both" in error["message"]
