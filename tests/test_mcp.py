"""The MCP server, driven by the official SDK's own client: over stdio (a real `python -m memshelf.mcp` process) and
over streamable HTTP against the real uvicorn server. List tools, remember then recall, isolation between owners;
plus a schemathesis run against the HTTP API's OpenAPI spec."""

from __future__ import annotations

import json
import os
import sys
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import TextContent
from test_server import LiveServer, bearer

from memshelf import Shelf
from memshelf.mcp import MAX_LEARN_TURNS, MAX_PAGE, MAX_RECALL, MAX_SHOWN_CHARS
from memshelf.server import create_app

TOOLS = {"remember", "recall", "context", "memories", "forget", "confirm", "set_expiry", "set_fact", "facts",
         "forget_fact", "log_message", "messages", "forget_message", "learn"}
Session = Callable[[], Any]


def mcp_command(db: Path | str, tenant: str, user: str, entry: str = "module") -> list[str]:
    """`python -m memshelf.mcp ...`, or the CLI's `memshelf ... mcp`."""
    if entry == "cli":
        return ["-m", "memshelf.cli", "--db", str(db), "--tenant", tenant, "--user", user, "--embedder", "none",
                "mcp"]
    return ["-m", "memshelf.mcp", "--db", str(db), "--tenant", tenant, "--user", user, "--embedder", "none"]


@asynccontextmanager
async def stdio_session(db: Path | str, tenant: str, user: str, entry: str = "module") -> AsyncIterator[ClientSession]:
    # The SDK passes the server a minimal environment: PYTHONPATH makes it run the code under test.
    params = StdioServerParameters(command=sys.executable, args=mcp_command(db, tenant, user, entry),
                                   env={"PYTHONPATH": os.pathsep.join(path for path in sys.path if path)})
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def http_session(url: str, secret: str, user: str) -> AsyncIterator[ClientSession]:
    headers = {**bearer(secret), "X-Memshelf-User": user}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as client, \
            streamable_http_client(url + "/mcp", http_client=client) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> Any:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def call_error(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


async def check_tool_listing(session: ClientSession) -> None:
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 20
    remember = tools["remember"].input_schema
    assert remember["properties"]["topic"]["type"] == "string"
    assert remember["properties"]["content"]["type"] == "string"
    assert set(remember["required"]) == {"topic", "content"}
    assert "ctx" not in remember["properties"]
    assert tools["recall"].input_schema["properties"]["limit"]["maximum"] == MAX_RECALL
    assert tools["recall"].input_schema["properties"]["limit"]["type"] == "integer"
    assert tools["forget"].input_schema["required"] == ["memory_id"]
    assert tools["facts"].input_schema["properties"]["limit"]["maximum"] == 100
    assert set(tools["learn"].input_schema["properties"]) == {"messages", "thread", "dry_run"}
    assert tools["learn"].input_schema["properties"]["messages"]["anyOf"][0]["maxItems"] == MAX_LEARN_TURNS
    assert all(tool.input_schema["additionalProperties"] is False for tool in tools.values())
    for name in ("remember", "set_fact"):  # the schema names the sources the server declares
        assert tools[name].input_schema["properties"]["source"]["enum"] == ["stated", "mined", "inferred"]
    assert tools["memories"].input_schema["properties"]["limit"]["maximum"] == MAX_PAGE
    assert set(tools["messages"].input_schema["properties"]) == {"thread", "limit", "cursor"}
    assert tools["forget_fact"].input_schema["required"] == ["key"]
    assert set(tools["log_message"].input_schema["required"]) == {"thread", "role", "content"}


async def check_remember_then_recall(session: ClientSession) -> None:
    stored = await call(session, "remember", topic="printer", content="The office printer is on 192.168.1.40.")
    assert stored["confidence"] == 1.0 and stored["id"].startswith("m_")
    await call(session, "remember", topic="printer", content="The printer jams on A3.", source="inferred")
    found = await call(session, "recall", question="where is the printer?")
    assert [h["confidence"] for h in found["hits"]] == [1.0, 0.4]
    assert found["hits"][0]["content"] == "The office printer is on 192.168.1.40."
    assert found["hits"][0]["retriever"] == "keyword"

    reply = (await session.call_tool("context", {"question": "printer"})).content[0]
    assert isinstance(reply, TextContent)
    assert "192.168.1.40" in reply.text and "[1.0]" in reply.text

    await call(session, "set_fact", key="user_name", value="Kaleb")
    listed = await call(session, "facts")
    assert [(f["key"], f["value"]) for f in listed["facts"]] == [("user_name", "Kaleb")]

    assert await call(session, "forget", memory_id=stored["id"]) == {"forgotten": stored["id"], "scrub_pending": False}
    assert len((await call(session, "recall", question="printer"))["hits"]) == 1
    assert "no memory" in await call_error(session, "forget", memory_id=stored["id"])


async def check_bounds_and_errors(session: ClientSession) -> None:
    assert "unknown source" in await call_error(session, "remember", topic="t", content="c", source="gossip")
    assert await call_error(session, "recall", question="x", limit=MAX_RECALL + 1)
    assert await call_error(session, "recall", question="x", limit=0)
    await call(session, "remember", topic="essay", content="long " + "word " * 3000)
    hit = (await call(session, "recall", question="essay"))["hits"][0]
    assert hit["truncated"] and len(hit["content"]) == MAX_SHOWN_CHARS


async def check_arguments_are_strict_and_errors_plain(session: ClientSession) -> None:
    """Unknown arguments used to be dropped silently, and bad ones answered with pydantic's text and links."""
    error = await call_error(session, "remember", topic="diet", content="Kaleb is vegetarian.", tags=["food"])
    assert error == ("remember was not run: unknown argument 'tags'. It takes topic (required), content (required), "
                     "source, ttl_seconds")
    assert (await call(session, "recall", question="vegetarian"))["hits"] == []  # nothing was stored
    error = await call_error(session, "recall", query="printer", limit=MAX_RECALL + 1)
    assert error == ("recall was not run: unknown argument 'query'; question is missing; limit: input should be less "
                     f"than or equal to {MAX_RECALL}. It takes question (required), limit")
    error = await call_error(session, "learn", messages=[{"role": "user", "content": "I live in Porto.", "at": "x"}])
    assert "unknown field 'messages.0.at'" in error
    for bad in (error, await call_error(session, "memories", limit="many")):
        assert "pydantic" not in bad and "http" not in bad and "\n" not in bad


async def check_managing_what_it_knows(session: ClientSession, pending: bool = False) -> None:
    """An empty memory, then remember, list, page, set and forget a fact, log and read messages, learn a thread.
    pending: whether the backend leaves an erasure's scrub for later (PostgreSQL)."""
    assert await call(session, "memories") == {"memories": [], "next_cursor": None}
    assert await call(session, "messages") == {"messages": [], "next_cursor": None}
    ids = [(await call(session, "remember", topic="home", content=text))["id"]
           for text in ("The boiler is in the attic.", "The wifi password is on the fridge.", "x" * 3000)]
    first = await call(session, "memories", limit=2)
    assert [m["id"] for m in first["memories"]] == ids[:0:-1]  # newest first
    assert first["memories"][0]["truncated"] and len(first["memories"][0]["content"]) == MAX_SHOWN_CHARS
    assert first["memories"][1] | {"created_at": None} == {
        "id": ids[1], "topic": "home", "content": "The wifi password is on the fridge.", "truncated": False,
        "source": "stated", "confidence": 1.0, "observations": 1, "created_at": None, "expires_at": None}
    rest = await call(session, "memories", limit=2, cursor=first["next_cursor"])
    assert ([m["id"] for m in rest["memories"]], rest["next_cursor"]) == ([ids[0]], None)
    assert "cursor" in await call_error(session, "memories", cursor="not-a-cursor")
    await call(session, "forget", memory_id=ids[2])
    assert [m["id"] for m in (await call(session, "memories"))["memories"]] == ids[1::-1]

    await call(session, "set_fact", key="diet", value="vegetarian")
    await call(session, "set_fact", key="user_name", value="Kaleb")
    assert await call(session, "forget_fact", key="diet") == {"forgotten": "diet", "scrub_pending": pending}
    assert [f["key"] for f in (await call(session, "facts"))["facts"]] == ["user_name"]
    assert "no fact 'diet'" in await call_error(session, "forget_fact", key="diet")

    logged = await call(session, "log_message", thread="kitchen", role="user", content="I live in Porto.")
    assert (logged["thread"], logged["role"], logged["content"]) == ("kitchen", "user", "I live in Porto.")
    await call(session, "log_message", thread="garage", role="user", content="The car is blue.")
    await call(session, "log_message", thread="kitchen", role="assistant", content="Noted.")
    kitchen = await call(session, "messages", thread="kitchen")
    assert [(m["role"], m["content"]) for m in kitchen["messages"]] == [("assistant", "Noted."),
                                                                         ("user", "I live in Porto.")]
    page = await call(session, "messages", limit=2)
    assert [m["thread"] for m in page["messages"]] == ["kitchen", "garage"]
    older = await call(session, "messages", limit=2, cursor=page["next_cursor"])
    assert ([m["id"] for m in older["messages"]], older["next_cursor"]) == ([logged["id"]], None)
    plan = await call(session, "learn", thread="kitchen")
    assert [(p["op"], p["key"], p["value"]) for p in plan["proposals"]] == [("set_fact", "home_city", "Porto")]
    assert {f["key"]: f["value"] for f in (await call(session, "facts"))["facts"]} == {"home_city": "Porto",
                                                                                       "user_name": "Kaleb"}
    garage = (await call(session, "messages", thread="garage"))["messages"][0]["id"]
    assert await call(session, "forget_message", message_id=garage) == {"forgotten": garage, "scrub_pending": pending}
    assert [m["thread"] for m in (await call(session, "messages"))["messages"]] == ["kitchen", "kitchen"]
    assert "call messages for the ids" in await call_error(session, "forget_message", message_id=garage)
    assert "call messages for the ids" in await call_error(session, "forget_message", message_id="m_1")


async def check_confirming_and_expiring(session: ClientSession) -> None:
    """A guess the user vouches for becomes stated; a memory's expiry is set and cleared by the model."""
    guess = await call(session, "remember", topic="car", content="The car is due a service in May.",
                       source="inferred")
    assert guess["confidence"] < 1.0
    confirmed = await call(session, "confirm", memory_id=guess["id"])
    assert (confirmed["id"], confirmed["source"], confirmed["confidence"]) == (guess["id"], "stated", 1.0)
    hits = (await call(session, "recall", question="car service"))["hits"]
    assert [(h["id"], h["source"]) for h in hits] == [(guess["id"], "stated")]

    expiring = await call(session, "set_expiry", memory_id=guess["id"], ttl_seconds=3600)
    assert expiring["expires_at"] is not None and expiring["expires_at"] > expiring["created_at"]
    kept = await call(session, "set_expiry", memory_id=guess["id"])
    assert kept["expires_at"] is None
    for verb in ("confirm", "set_expiry"):
        assert "call memories (or recall) for the ids" in await call_error(session, verb, memory_id="m_nowhere")
    assert "ttl_seconds" in await call_error(session, "set_expiry", memory_id=guess["id"], ttl_seconds=-1)


HELLO = [{"role": "user", "content": "Hi, I'm Kaleb."}, {"role": "user", "content": "I live in Porto."},
         {"role": "assistant", "content": "Noted: you live in Madrid."},
         {"role": "user", "content": "I'm allergic to peanuts."}]


async def check_learn(session: ClientSession) -> None:
    preview = await call(session, "learn", messages=HELLO, dry_run=True)
    assert preview["dry_run"] is True and (preview["applied"], preview["skipped"]) == (2, 1)
    assert [(p["op"], p["key"], p["value"], p["topic"], p["content"], p["source"]) for p in preview["proposals"]] == [
        ("skip", "user_name", "Kaleb", None, None, "mined"),  # the introduction names whom the memory knows
        ("set_fact", "home_city", "Porto", None, None, "mined"),
        ("remember", None, None, "health", "The user is allergic to peanuts.", "mined")]
    before = (await call(session, "facts"))["facts"]
    assert "home_city" not in {f["key"] for f in before}

    applied = await call(session, "learn", messages=HELLO)
    assert applied["applied"] == 2 and applied["proposals"][2]["record"].startswith("m_")
    after = (await call(session, "facts"))["facts"]
    assert [(f["key"], f["value"], f["source"]) for f in after] == [("home_city", "Porto", "mined")] + [
        (f["key"], f["value"], f["source"]) for f in before]
    hits = (await call(session, "recall", question="peanuts"))["hits"]
    assert [h["id"] for h in hits] == [applied["proposals"][2]["record"]]
    again = await call(session, "learn", messages=HELLO)
    assert again["applied"] == 0 and {p["op"] for p in again["proposals"]} == {"skip"}

    assert "not both" in await call_error(session, "learn", messages=HELLO, thread="t1")
    assert "not both" in await call_error(session, "learn")
    assert await call_error(session, "learn", messages=[])
    assert await call_error(session, "learn", messages=[{"role": "user"}])


def scrubs_later(target: str) -> bool:
    """Whether an erasure on this backend leaves its scrub for later (PostgreSQL's is queued)."""
    return target.startswith(("postgres://", "postgresql://"))


def run(check: Callable[..., Awaitable[None]], opener: Callable[[], Any]) -> None:
    async def main() -> None:
        async with opener() as session:
            await check(session)

    anyio.run(main)


# ---------------------------------------------------------------------------------------------- stdio

@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "mcp.db"


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["module", "cli"])
def test_stdio_lists_remembers_recalls_and_bounds(db: Path, entry: str) -> None:
    async def everything(session: ClientSession) -> None:
        await check_tool_listing(session)
        await check_remember_then_recall(session)
        await check_bounds_and_errors(session)
        await check_arguments_are_strict_and_errors_plain(session)
        await check_learn(session)

    run(everything, lambda: stdio_session(db, "acme", "alice", entry))
    with Shelf.open(db, embedder=None) as shelf:
        from memshelf import Owner

        assert {f.key: f.value for f in shelf.facts(Owner("acme", "alice"))} == {"user_name": "Kaleb",
                                                                                  "home_city": "Porto"}


@pytest.mark.slow
def test_stdio_owners_are_isolated(db: Path) -> None:
    async def isolation() -> None:
        async with stdio_session(db, "acme", "alice") as alice, stdio_session(db, "acme", "bob") as bob, \
                stdio_session(db, "globex", "alice") as other:
            secret = await call(alice, "remember", topic="vault", content="The vault code is 1234.")
            await call(alice, "set_fact", key="vault_owner", value="Alice")
            for stranger in (bob, other):
                assert (await call(stranger, "recall", question="vault code"))["hits"] == []
                assert (await call(stranger, "facts"))["facts"] == []
                assert "no memory" in await call_error(stranger, "forget", memory_id=secret["id"])
            assert len((await call(alice, "recall", question="vault"))["hits"]) == 1

    anyio.run(isolation)


def test_stdio_without_an_owner_says_what_to_pass(db: Path) -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "memshelf.mcp", "--db", str(db)], capture_output=True, text=True,
                          timeout=60, env={"PATH": "", "PYTHONPATH": ":".join(sys.path)}, stdin=subprocess.DEVNULL)
    assert done.returncode != 0 and "--tenant" in done.stderr and "MEMSHELF_USER" in done.stderr


@pytest.mark.slow
def test_stdio_manages_what_it_knows(target: str) -> None:
    managing = partial(check_managing_what_it_knows, pending=scrubs_later(target))
    run(managing, lambda: stdio_session(target, "acme", "nora"))
    run(check_confirming_and_expiring, lambda: stdio_session(target, "acme", "nora"))


# ---------------------------------------------------------------------------------------------- streamable HTTP

@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    db = tmp_path_factory.mktemp("mcp-http") / "memshelf.db"
    with Shelf.open(db, embedder=None) as shelf:
        secrets = {"acme": shelf.create_key("acme")[1], "globex": shelf.create_key("globex")[1],
                   "admin": shelf.create_key(None)[1]}
    with LiveServer(create_app(target=str(db), embedder=None)) as live:
        yield live.url, secrets


def test_http_lists_remembers_recalls_and_bounds(http: tuple[str, dict[str, str]]) -> None:
    url, secrets = http

    async def everything(session: ClientSession) -> None:
        await check_tool_listing(session)
        await check_remember_then_recall(session)
        await check_bounds_and_errors(session)
        await check_arguments_are_strict_and_errors_plain(session)
        await check_a_guess_keeps_the_stated_fact(session)

    run(everything, lambda: http_session(url, secrets["acme"], "alice"))


def test_http_manages_what_it_knows(target: str) -> None:
    with Shelf.open(target, embedder=None) as shelf:
        secret = shelf.create_key("acme")[1]
    with LiveServer(create_app(target=target, embedder=None)) as live:
        managing = partial(check_managing_what_it_knows, pending=scrubs_later(target))
        run(managing, lambda: http_session(live.url, secret, "nora"))
        run(check_confirming_and_expiring, lambda: http_session(live.url, secret, "nora"))


def test_http_learns_a_thread_logged_through_the_rest_api(http: tuple[str, dict[str, str]]) -> None:
    url, secrets = http
    rest = httpx.Client(base_url=url, headers=bearer(secrets["acme"]), timeout=30)
    for content in ("I live in Porto.", "I'm allergic to peanuts."):
        rest.post("/v1/users/lena/messages", json={"thread": "kitchen", "role": "user", "content": content})

    async def learn_the_thread(session: ClientSession) -> None:
        await check_learn_thread(session, rest)

    run(learn_the_thread, lambda: http_session(url, secrets["acme"], "lena"))
    rest.close()


async def check_learn_thread(session: ClientSession, rest: httpx.Client) -> None:
    plan = await call(session, "learn", thread="kitchen")
    assert [(p["op"], p["key"] or p["topic"]) for p in plan["proposals"]] == [("set_fact", "home_city"),
                                                                             ("remember", "health")]
    assert rest.get("/v1/users/lena/facts/home_city").json()["value"] == "Porto"
    rest.post("/v1/users/lena/messages", json={"thread": "kitchen", "role": "user",
                                                "content": "I moved to Lisbon last month."})
    moved = await call(session, "learn", thread="kitchen")
    assert [(p["op"], p["key"], p["value"]) for p in moved["proposals"]] == [("set_fact", "home_city", "Lisbon")]
    assert moved["watermark"] != plan["watermark"]
    history = rest.get("/v1/users/lena/facts/home_city/history").json()["items"]
    assert [c["value"] for c in history] == ["Porto", "Lisbon"]
    again = await call(session, "learn", thread="kitchen")
    assert (again["applied"], again["proposals"], again["watermark"]) == (0, [], moved["watermark"])


async def check_a_guess_keeps_the_stated_fact(session: ClientSession) -> None:
    # Over HTTP only: the stdio server is a subprocess that gets no PYTHONPATH (the MCP SDK passes a minimal
    # environment), so it runs whichever memshelf is installed rather than the code under test.
    guess = await call(session, "set_fact", key="user_name", value="Kal", source="inferred")
    assert guess["value"] == "Kaleb" and "kept the stated value" in guess["note"]  # the guess went to history


def test_http_owners_are_isolated_and_match_the_rest_api(http: tuple[str, dict[str, str]]) -> None:
    url, secrets = http

    async def isolation() -> str:
        async with http_session(url, secrets["acme"], "carol") as carol:
            secret = await call(carol, "remember", topic="vault", content="The vault code is 5678.")
        async with http_session(url, secrets["acme"], "dave") as dave, \
                http_session(url, secrets["globex"], "carol") as other:
            for stranger in (dave, other):
                assert (await call(stranger, "recall", question="vault code"))["hits"] == []
                assert "no memory" in await call_error(stranger, "forget", memory_id=secret["id"])
        return secret["id"]

    async def main() -> str:
        return await isolation()

    memory_id = anyio.run(main)
    rest = httpx.get(f"{url}/v1/users/carol/memories/{memory_id}", headers=bearer(secrets["acme"]))
    assert rest.json()["content"] == "The vault code is 5678."
    assert httpx.get(f"{url}/v1/users/carol/memories/{memory_id}",
                     headers=bearer(secrets["globex"])).status_code == 404


async def sdk_refusal(url: str, headers: dict[str, str]) -> str:
    """What the SDK's client raises when /mcp refuses to start a session."""
    try:
        async with httpx2.AsyncClient(headers=headers, timeout=30) as client, \
                streamable_http_client(url + "/mcp", http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
    except BaseException as exc:  # the SDK's task group wraps it in exception groups
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
        assert isinstance(exc, MCPError), repr(exc)
        return str(exc)
    raise AssertionError("the session started")


@pytest.mark.parametrize("headers, status, says", [
    ({}, 401, "missing API key: create one with `memshelf keys create --tenant NAME` and send it as "
              "`Authorization: Bearer <key>`"),
    ({"Authorization": "Bearer ms_wrong", "X-Memshelf-User": "u"}, 401, "wrong or revoked API key"),
    ({"X-Memshelf-User": "u"}, 401, "missing API key"),
    ("admin", 403, "admin keys cannot use the memory tools: use a key bound to a tenant"),
    ("no-user", 422, "no user: send the X-Memshelf-User header (or ?user=)"),
    ("control-user", 422, "user contains control characters"),
])
def test_http_mcp_denials_reach_the_sdk_client_with_what_to_do(http: tuple[str, dict[str, str]], headers: Any,
                                                                status: int, says: str) -> None:
    url, secrets = http
    if isinstance(headers, str):
        headers = {"admin": {**bearer(secrets["admin"]), "X-Memshelf-User": "u"}, "no-user": bearer(secrets["acme"]),
                   "control-user": {**bearer(secrets["acme"]), "X-Memshelf-User": "u\x01"}}[headers]
    assert says in anyio.run(sdk_refusal, url, headers)

    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    response = httpx.post(url + "/mcp", json=ping, headers={**headers, "Accept": "application/json, text/event-stream"})
    assert response.status_code == status
    body = response.json()  # a JSON-RPC error, in the HTTP API's one error shape
    assert (body["jsonrpc"], body["id"], set(body["error"])) == ("2.0", None, {"code", "type", "message"})
    assert says in body["error"]["message"]
    assert (response.headers.get("WWW-Authenticate", "").startswith("Bearer ")) == (status == 401)


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT"])
def test_http_mcp_answers_only_post_and_says_so(http: tuple[str, dict[str, str]], method: str) -> None:
    """Stateless: a GET used to open an event stream that never ended."""
    url, secrets = http
    headers = {**bearer(secrets["acme"]), "X-Memshelf-User": "u", "Accept": "text/event-stream"}
    response = httpx.request(method, url + "/mcp", headers=headers, timeout=5)
    assert (response.status_code, response.headers["Allow"]) == (405, "POST")
    assert "answers POST only" in response.json()["error"]["message"]


@pytest.mark.parametrize("header, stored_for", [(None, "erin"), ("frank", "frank")])
def test_http_user_may_come_from_the_query_and_the_header_wins(http: tuple[str, dict[str, str]],
                                                               header: str | None, stored_for: str) -> None:
    url, secrets = http
    headers = bearer(secrets["acme"]) | ({} if header is None else {"X-Memshelf-User": header})

    async def main() -> None:
        async with httpx2.AsyncClient(headers=headers, timeout=30) as client, \
                streamable_http_client(url + "/mcp?user=erin", http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            await call(session, "remember", topic="desk", content=f"{stored_for} sits by the window.")

    anyio.run(main)
    listed = httpx.get(f"{url}/v1/users/{stored_for}/memories", headers=bearer(secrets["acme"])).json()["items"]
    assert [m["content"] for m in listed] == [f"{stored_for} sits by the window."]


def test_http_a_non_ascii_user_header_names_that_user(http: tuple[str, dict[str, str]]) -> None:
    """The header's bytes were read as Latin-1: "Zoë" sent as UTF-8 wrote to a user "ZoÃ«". Bytes that are not
    UTF-8 are refused with what to do instead."""
    url, secrets = http
    call_body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                 "params": {"name": "remember", "arguments": {"topic": "t", "content": "Zoë likes chess."}}}
    headers = {**bearer(secrets["acme"]), "Accept": "application/json, text/event-stream"}
    sent = httpx.post(url + "/mcp", json=call_body, headers={**headers, "X-Memshelf-User": "Zoë".encode()}, timeout=30)
    assert sent.status_code == 200, sent.text
    listed = httpx.get(f"{url}/v1/users/Zo%C3%AB/memories", headers=bearer(secrets["acme"])).json()["items"]
    assert [m["content"] for m in listed] == ["Zoë likes chess."]
    refused = httpx.post(url + "/mcp", json=call_body, headers={**headers, "X-Memshelf-User": b"Zo\xeb"}, timeout=30)
    assert refused.status_code == 422 and "not UTF-8" in refused.json()["error"]["message"]


# ---------------------------------------------------------------------------------------------- schemathesis

def probe_operation(operation: Any, url: str, key: str, failures: list[str]) -> None:
    """Send up to MAX_EXAMPLES generated requests to one operation; record any 5xx, check every error's shape."""
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              derandomize=True)
    @given(case=operation.as_strategy())
    def probe(case: Any) -> None:
        response = case.call(base_url=url, headers=bearer(key), timeout=30)
        if response.status_code >= 500:
            failures.append(f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:200]}")
            return
        assert "Traceback" not in response.text
        if response.status_code >= 400:
            assert set(json.loads(response.text)["error"]) == {"type", "message"}

    probe()


MAX_EXAMPLES = 25


@pytest.mark.slow
def test_schemathesis_finds_no_server_error(http: tuple[str, dict[str, str]]) -> None:
    """Property-based requests generated from /openapi.json (admin routes with the admin key, the rest with a
    tenant key): whatever they send, never a 5xx and never a traceback."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import strategies as st

    url, secrets = http
    records = st.lists(st.dictionaries(st.sampled_from(["kind", "id", "topic", "content", "source", "format"]),
                                       st.text(max_size=12) | st.integers() | st.none(), max_size=6), max_size=4)
    json_lines = records.map(lambda rows: "".join(json.dumps(row) + "\n" for row in rows).encode())
    schemathesis.openapi.media_type("application/x-ndjson", json_lines | st.binary(max_size=300))
    failures: list[str] = []
    for result in schemathesis.openapi.from_url(url + "/openapi.json").get_all_operations():
        operation = result.ok()
        key = secrets["admin"] if operation.path.startswith("/v1/admin") else secrets["acme"]
        probe_operation(operation, url, key, failures)
    assert failures == []
