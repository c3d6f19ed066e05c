"""The assistant's loop, in the order assistants call it, through every face on both backends.

Two scenarios (`assistant_loop`, and `curation_loop`: confirm, expiry, erasing a logged turn) are written once
and driven through small adapters: the library (Shelf), the CLI (a real `memshelf` process per verb), the HTTP API
(a real uvicorn server on loopback) and MCP (a real `python -m memshelf.mcp` process over stdio, and streamable
HTTP at /mcp of the real server). Each runs on a SQLite
file and on the real PostgreSQL, keyword-only and, where it matters, with the real embedding model: the
empty-then-remember crash of issue 9 only shows when there are vectors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from memshelf import Owner, Shelf
from memshelf.server import create_app

TENANT, USER = "home", "kaleb"
KALEB = Owner(TENANT, USER)
TOPIC, STATEMENT = "network", "The office printer is on 192.168.1.40."
QUESTION = "Where is the office printer?"
PERSONA = "You are GLaDOS. Be sardonic and brief."
TOKYO = "東京の事務所は3階です。"
KNOWLEDGE = ("Relevant knowledge (confidence in brackets, 1.0 means the user said so):\n"
             f"  - [1.0] {STATEMENT}")
FACTS = "Memory context:\nKnown facts about the user:\n  - user_name: Kaleb"

Recalled = list[tuple[float, str]]
"""What a recall shows: (confidence, content) per hit, best first."""


class Face(Protocol):
    """One way an assistant reaches memshelf, acting for KALEB. `prompt` is None where the face builds none."""

    prompt: Callable[[str, str], str] | None

    def recall(self, question: str) -> Recalled: ...
    def context(self, question: str) -> str: ...
    def remember(self, topic: str, content: str, source: str = "stated") -> str: ...
    def set_fact(self, key: str, value: str) -> None: ...
    def facts(self) -> list[tuple[str, str]]: ...
    def forget(self, memory_id: str) -> None: ...
    def erase_user(self) -> None: ...
    def confirm(self, memory_id: str) -> None: ...
    def set_expiry(self, memory_id: str, ttl: float | None) -> bool:
        """Whether the memory now has an expiry."""
    def log(self, thread: str, content: str) -> str:
        """The user's turn, logged; its id."""
    def messages(self, thread: str) -> list[str]: ...
    def forget_message(self, message_id: str) -> None: ...


def assistant_loop(face: Face) -> None:
    """recall on an empty memory, remember, recall, set a fact, build a prompt, forget, recall, erase, recall,
    build a prompt; then a first memory again, after the erasure."""
    assert face.recall(QUESTION) == []  # a new user: every assistant's first turn
    assert face.context(QUESTION) == ""

    memory_id = face.remember(TOPIC, STATEMENT)
    assert face.recall(QUESTION) == [(1.0, STATEMENT)]
    assert face.context(QUESTION) == KNOWLEDGE

    face.set_fact("user_name", "Kaleb")
    assert_prompt(face, facts=True, knowledge=True)

    face.forget(memory_id)
    assert face.recall(QUESTION) == []  # forgetting a user's only memory leaves an empty memory again

    face.erase_user()
    assert face.recall(QUESTION) == []
    assert_prompt(face, facts=False, knowledge=False)

    face.remember(TOPIC, STATEMENT)  # the erased user starts again from an empty memory
    assert face.recall(QUESTION) == [(1.0, STATEMENT)]

    face.remember("office", TOKYO)  # words of a script without spaces are found too (README, "Search text")
    assert face.recall("東京の事務所は何階ですか")[0] == (1.0, TOKYO)


def curation_loop(face: Face) -> None:
    """What keeps a memory right, in the order an assistant meets it: a guess recalled below what the user said,
    then confirmed by the user; a memory kept for good, then for a moment, then gone; a logged turn the user wants
    erased."""
    guess = face.remember(TOPIC, STATEMENT, source="inferred")
    assert face.recall(QUESTION) == [(0.4, STATEMENT)]
    face.confirm(guess)
    assert face.recall(QUESTION) == [(1.0, STATEMENT)]

    assert face.set_expiry(guess, None) is False
    assert face.set_expiry(guess, 0.5) is True
    assert eventually(lambda: face.recall(QUESTION) == [])  # expired: gone from search at once, purged later

    said = face.log("chat", "Please forget that I mentioned my landlord.")
    assert face.messages("chat") == ["Please forget that I mentioned my landlord."]
    face.forget_message(said)
    assert face.messages("chat") == []


def eventually(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def assert_prompt(face: Face, *, facts: bool, knowledge: bool) -> None:
    """The exact prompt (spec 000's layout) where the face builds one; else the facts a prompt would carry."""
    if face.prompt is None:
        assert face.facts() == ([("user_name", "Kaleb")] if facts else [])
        return
    blocks = [PERSONA, *([FACTS] if facts else []), *([KNOWLEDGE] if knowledge else [])]
    assert face.prompt(PERSONA, QUESTION) == "\n\n".join(blocks)


# ---------------------------------------------------------------------------------------------- the faces

class LibraryFace:
    """The Shelf, called in process."""

    def __init__(self, shelf: Shelf) -> None:
        self.shelf = shelf
        self.prompt = lambda base, text: shelf.build_prompt(base, KALEB, text)

    def recall(self, question: str) -> Recalled:
        return [(h.memory.confidence, h.memory.content) for h in self.shelf.search(KALEB, question)]

    def context(self, question: str) -> str:
        return self.shelf.context(KALEB, question)

    def remember(self, topic: str, content: str, source: str = "stated") -> str:
        return self.shelf.remember(KALEB, topic, content, source=source).id

    def set_fact(self, key: str, value: str) -> None:
        self.shelf.set_fact(KALEB, key, value)

    def facts(self) -> list[tuple[str, str]]:
        return [(f.key, f.value) for f in self.shelf.facts(KALEB)]

    def forget(self, memory_id: str) -> None:
        self.shelf.forget(KALEB, memory_id)

    def erase_user(self) -> None:
        self.shelf.forget_user(KALEB)

    def confirm(self, memory_id: str) -> None:
        self.shelf.confirm(KALEB, memory_id)

    def set_expiry(self, memory_id: str, ttl: float | None) -> bool:
        return self.shelf.set_expiry(KALEB, memory_id, ttl=ttl).expires_at is not None

    def log(self, thread: str, content: str) -> str:
        return self.shelf.log_message(KALEB, thread, "user", content).id

    def messages(self, thread: str) -> list[str]:
        return [m.content for m in self.shelf.messages(KALEB, thread)]

    def forget_message(self, message_id: str) -> None:
        self.shelf.forget_message(KALEB, message_id)


class CliFace:
    """`memshelf` run as a real process for every verb, as a script would: --json where it parses the output, the
    human output where a person reads it (context and prompt print exactly the text, then a newline)."""

    def __init__(self, target: str, embedder: str) -> None:
        self.env = {**os.environ, "MEMSHELF_TENANT": TENANT, "MEMSHELF_USER": USER, "MEMSHELF_EMBEDDER": embedder,
                    "NO_COLOR": "1", "COLUMNS": "200"}
        self.env.pop("MEMSHELF_DATABASE_URL", None)
        self.target = target
        self.prompt = lambda base, text: self._printed("prompt", base, text)

    def _run(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "memshelf.cli", "--db", self.target, *args], env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        return done.stdout

    def _json(self, *args: str) -> Any:
        return json.loads(self._run("--json", *args))

    def _printed(self, *args: str) -> str:
        printed = self._run(*args)
        assert printed == "" or printed.endswith("\n"), printed
        return printed[:-1] if printed else ""

    def recall(self, question: str) -> Recalled:
        return [(h["memory"]["confidence"], h["memory"]["content"]) for h in self._json("search", question)["hits"]]

    def context(self, question: str) -> str:
        return self._printed("context", question)

    def remember(self, topic: str, content: str, source: str = "stated") -> str:
        return str(self._json("remember", topic, content, "--source", source)["id"])

    def set_fact(self, key: str, value: str) -> None:
        self._run("set-fact", key, value)

    def facts(self) -> list[tuple[str, str]]:
        return [(f["key"], f["value"]) for f in self._json("facts")]

    def forget(self, memory_id: str) -> None:
        self._run("forget", memory_id)

    def erase_user(self) -> None:
        self._run("forget-user", "--yes")

    def confirm(self, memory_id: str) -> None:
        self._run("confirm", memory_id)

    def set_expiry(self, memory_id: str, ttl: float | None) -> bool:
        changed = self._json("expire", memory_id, *(("--never",) if ttl is None else ("--ttl", str(ttl))))
        return changed["expires_at"] is not None

    def log(self, thread: str, content: str) -> str:
        return str(self._json("log", thread, "user", content)["id"])

    def messages(self, thread: str) -> list[str]:
        return [m["content"] for m in self._json("messages", thread)]

    def forget_message(self, message_id: str) -> None:
        self._run("forget-message", message_id)


class HttpFace:
    """The JSON API of a real server, with a key bound to the tenant."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.base = f"/v1/users/{USER}"
        self.prompt = lambda base, text: self._post("prompt", {"base_prompt": base, "user_text": text})["prompt"]

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.client.post(f"{self.base}/{path}", json=body)
        assert response.status_code in (200, 201), response.text
        return response.json()

    def recall(self, question: str) -> Recalled:
        hits = self._post("search", {"question": question})["hits"]
        return [(h["memory"]["confidence"], h["memory"]["content"]) for h in hits]

    def context(self, question: str) -> str:
        return str(self._post("context", {"question": question})["context"])

    def remember(self, topic: str, content: str, source: str = "stated") -> str:
        return str(self._post("memories", {"topic": topic, "content": content, "source": source})["id"])

    def set_fact(self, key: str, value: str) -> None:
        assert self.client.put(f"{self.base}/facts/{key}", json={"value": value}).status_code == 200

    def facts(self) -> list[tuple[str, str]]:
        response = self.client.get(f"{self.base}/facts")
        assert response.status_code == 200, response.text
        return [(f["key"], f["value"]) for f in response.json()["items"]]

    def forget(self, memory_id: str) -> None:
        response = self.client.delete(f"{self.base}/memories/{memory_id}")
        assert response.status_code == 204, response.text

    def erase_user(self) -> None:
        response = self.client.delete(self.base)
        assert response.status_code == 200, response.text

    def confirm(self, memory_id: str) -> None:
        self._post(f"memories/{memory_id}/confirm", {})

    def set_expiry(self, memory_id: str, ttl: float | None) -> bool:
        response = self.client.patch(f"{self.base}/memories/{memory_id}",
                                     json={"expires_at": None} if ttl is None else {"ttl": ttl})
        assert response.status_code == 200, response.text
        return response.json()["expires_at"] is not None

    def log(self, thread: str, content: str) -> str:
        return str(self._post("messages", {"thread": thread, "role": "user", "content": content})["id"])

    def messages(self, thread: str) -> list[str]:
        response = self.client.get(f"{self.base}/messages", params={"thread": thread})
        assert response.status_code == 200, response.text
        return [m["content"] for m in response.json()["items"]]

    def forget_message(self, message_id: str) -> None:
        response = self.client.delete(f"{self.base}/messages/{message_id}")
        assert response.status_code == 204, response.text


class McpFace:
    """The MCP tools through the official SDK's client session, driven from synchronous code through a blocking
    portal. MCP builds no prompts and erases no users: those steps go through `erase` (the operator's way for
    that transport)."""

    prompt = None

    def __init__(self, portal: BlockingPortal, session: Any, erase: Callable[[], None]) -> None:
        self.portal, self.session, self.erase = portal, session, erase

    def _call(self, tool: str, **arguments: Any) -> Any:
        result = self.portal.call(self.session.call_tool, tool, arguments)
        assert not result.is_error, result.content
        return result

    def recall(self, question: str) -> Recalled:
        hits = self._call("recall", question=question).structured_content["hits"]
        return [(h["confidence"], h["content"]) for h in hits]

    def context(self, question: str) -> str:
        return str(self._call("context", question=question).structured_content["result"])

    def remember(self, topic: str, content: str, source: str = "stated") -> str:
        return str(self._call("remember", topic=topic, content=content, source=source).structured_content["id"])

    def set_fact(self, key: str, value: str) -> None:
        self._call("set_fact", key=key, value=value)

    def facts(self) -> list[tuple[str, str]]:
        return [(f["key"], f["value"]) for f in self._call("facts").structured_content["facts"]]

    def forget(self, memory_id: str) -> None:
        self._call("forget", memory_id=memory_id)

    def erase_user(self) -> None:
        self.erase()

    def confirm(self, memory_id: str) -> None:
        self._call("confirm", memory_id=memory_id)

    def set_expiry(self, memory_id: str, ttl: float | None) -> bool:
        changed = self._call("set_expiry", memory_id=memory_id, **({} if ttl is None else {"ttl_seconds": ttl}))
        return changed.structured_content["expires_at"] is not None

    def log(self, thread: str, content: str) -> str:
        return str(self._call("log_message", thread=thread, role="user", content=content).structured_content["id"])

    def messages(self, thread: str) -> list[str]:
        return [m["content"] for m in self._call("messages", thread=thread).structured_content["messages"]]

    def forget_message(self, message_id: str) -> None:
        self._call("forget_message", message_id=message_id)


# ---------------------------------------------------------------------------------------------- servers

def start_server(stack: ExitStack, target: str, embedder: Any) -> tuple[str, str]:
    """A real server on loopback over `target`, and a key bound to the tenant; both end with `stack`."""
    from test_server import LiveServer

    with Shelf.open(target, embedder=None) as keys:
        secret = keys.create_key(TENANT, "scenario")[1]
    live = stack.enter_context(LiveServer(create_app(target=target, embedder=embedder)))
    return live.url, secret


def http_face(stack: ExitStack, target: str, embedder: Any) -> HttpFace:
    from test_server import bearer

    url, secret = start_server(stack, target, embedder)
    return HttpFace(stack.enter_context(httpx.Client(base_url=url, headers=bearer(secret), timeout=60)))


def mcp_http_face(stack: ExitStack, target: str, embedder: Any) -> McpFace:
    from test_mcp import http_session
    from test_server import bearer

    url, secret = start_server(stack, target, embedder)
    portal = stack.enter_context(start_blocking_portal())
    session = stack.enter_context(portal.wrap_async_context_manager(http_session(url, secret, USER)))

    def erase() -> None:  # the REST API of the same server, with the same key
        assert httpx.delete(f"{url}/v1/users/{USER}", headers=bearer(secret), timeout=60).status_code == 200

    return McpFace(portal, session, erase)


def mcp_stdio_face(stack: ExitStack, target: str, embedder: str) -> McpFace:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    args = ["-m", "memshelf.mcp", "--db", target, "--tenant", TENANT, "--user", USER, "--embedder", embedder]

    @asynccontextmanager
    async def session() -> Any:
        params = StdioServerParameters(command=sys.executable, args=args, env=dict(os.environ))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as opened:
            await opened.initialize()
            yield opened

    portal = stack.enter_context(start_blocking_portal())
    opened = stack.enter_context(portal.wrap_async_context_manager(session()))

    def erase() -> None:  # another process on the same database, as `memshelf forget-user` would
        with Shelf.open(target, embedder=None) as shelf:
            shelf.forget_user(KALEB)

    return McpFace(portal, opened, erase)


# ---------------------------------------------------------------------------------------------- the matrix

KEYWORD_ONLY = "none"
WITH_MODEL = "local"


def cases(face: str, embedders: tuple[str, ...], *, slow: bool = False) -> list[Any]:
    """(face, backend, embedder) on both backends; SQLite with the model is where issue 9's first-loop crash was."""
    params = []
    for backend in ("sqlite", "postgres"):
        for embedder in embedders:
            marks = [pytest.mark.slow] if slow or embedder == WITH_MODEL else []
            params.append(pytest.param(face, backend, embedder, marks=marks, id=f"{face}-{backend}-{embedder}"))
    return params


MATRIX = [
    *cases("library", (KEYWORD_ONLY, WITH_MODEL)),
    *cases("http", (KEYWORD_ONLY, WITH_MODEL)),
    *cases("mcp-http", (KEYWORD_ONLY, WITH_MODEL)),
    # Processes stay keyword-only, to keep the suite's time down: the CLI is one process per verb, and loading
    # the model in each would cost seconds a step; a stdio MCP server would load it once, but costs 15 to 40 s
    # here for what mcp-http above already drives through the same MCP tools with the model.
    *cases("cli", (KEYWORD_ONLY,), slow=True),
    *cases("mcp-stdio", (KEYWORD_ONLY,), slow=True),
]


@pytest.fixture
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    def target(backend: str) -> str:
        return str(tmp_path / "memory.db") if backend == "sqlite" else str(request.getfixturevalue("pg_fresh_url"))
    return target


@pytest.fixture
def model(request: pytest.FixtureRequest) -> Callable[[str], Any]:
    """The embedder an in-process face gets: None, or the session's real model (loaded once)."""
    return lambda name: None if name == KEYWORD_ONLY else request.getfixturevalue("local_embedder")


@pytest.fixture
def open_face(where: Callable[[str], str], model: Callable[[str], Any]) -> Iterator[Callable[[str, str, str], Face]]:
    with ExitStack() as stack:
        def build(face: str, backend: str, embedder: str) -> Face:
            target = where(backend)
            if face == "library":
                return LibraryFace(stack.enter_context(Shelf.open(target, embedder=model(embedder))))
            if face == "http":
                return http_face(stack, target, model(embedder))
            if face == "mcp-http":
                return mcp_http_face(stack, target, model(embedder))
            if face == "cli":
                return CliFace(target, embedder)
            return mcp_stdio_face(stack, target, embedder)
        yield build


@pytest.mark.parametrize("face, backend, embedder", MATRIX)
def test_assistant_loop(open_face: Callable[[str, str, str], Face], face: str, backend: str, embedder: str) -> None:
    assistant_loop(open_face(face, backend, embedder))


@pytest.mark.parametrize("face, backend, embedder", [case for case in MATRIX if case.values[2] == KEYWORD_ONLY])
def test_curation_loop(open_face: Callable[[str, str, str], Face], face: str, backend: str, embedder: str) -> None:
    curation_loop(open_face(face, backend, embedder))
