"""The memory proxy, as its users call it: the official `openai` client (sync and async, streamed and not) against
a real `memshelf serve --upstream` on loopback, in front of a loopback upstream that speaks the chat API and keeps
what it received. The tests read what the upstream was sent (the memory added, nothing else changed), what memshelf
logged and learned, and that a second conversation recalls what the first one taught."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from memshelf import ConfigError, ExtractorUnavailable, Owner, Proposal, Shelf
from memshelf.learning import Extractor, register_extractor, resolve_extractor
from test_server import LiveServer, free_port, wait_healthy

openai = pytest.importorskip("openai")

ANSWER = "Noted, I will remember that."
LONG_ANSWER = "word " * 3_500  # 17,500 characters: more than one message holds
TENANT = "home"
GATE_SECONDS = 10.0


@dataclass
class FakeUpstream:
    """An OpenAI-compatible chat API that answers ANSWER (word by word when streaming) and keeps every request."""

    received: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    """Model "gated" streams its first chunk, then waits (up to GATE_SECONDS) for the gate before the rest."""
    gate_held: list[bool] = field(default_factory=list)

    def app(self) -> Starlette:
        async def completions(request: Request) -> Response:
            body = await request.json()
            self.received.append(body)
            self.keys.append(request.headers.get("authorization"))
            if body["model"] == "missing":
                return JSONResponse({"error": {"message": "model 'missing' not found", "type": "not_found"}}, 404)
            if not body.get("stream"):
                answer = LONG_ANSWER if body["model"] == "long" else ANSWER
                return JSONResponse({
                    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}})

            async def events() -> Any:
                words = ANSWER.split(" ")
                for n, word in enumerate(words):
                    delta = {"content": word + (" " if n < len(words) - 1 else "")}
                    if n == 0:
                        delta["role"] = "assistant"
                    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                             "model": body["model"], "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                    await asyncio.sleep(0.01)
                    if n == 0 and body["model"] == "gated":
                        self.gate_held.append(await asyncio.to_thread(self.gate.wait, GATE_SECONDS))
                done = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                yield f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode()

            return StreamingResponse(events(), media_type="text/event-stream")

        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model", "created": 1,
                                                              "owned_by": "fake"}]})

        return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                                 Route("/v1/models", models)])

    def system_of(self, n: int = -1) -> str:
        first = self.received[n]["messages"][0]
        return first["content"] if first["role"] == "system" else ""


@dataclass
class Proxy:
    url: str
    db: Path
    secret: str
    other_tenant: str
    upstream: FakeUpstream


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    fake = FakeUpstream()
    db = tmp_path_factory.mktemp("proxy") / "memory.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key(TENANT)[1]
        other = shelf.create_key("other")[1]
    with LiveServer(fake.app()) as upstream:
        port = free_port()
        env = {**os.environ, "MEMSHELF_EMBEDDER": "none", "MEMSHELF_ACCESS_LOG": "0",
               "MEMSHELF_UPSTREAM_KEY": "sk-upstream-secret"}
        process = subprocess.Popen([sys.executable, "-m", "memshelf", "--db", str(db), "serve", "--port", str(port),
                                    "--upstream", upstream.url + "/v1"], env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, process)
            yield Proxy(url, db, secret, other, fake)
        finally:
            process.terminate()
            process.wait(timeout=30)


def client(proxy: Proxy, key: str | None = None) -> Any:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=key or proxy.secret, max_retries=0)


def eventually(check: Any, seconds: float = 10.0) -> Any:
    """What check() returns once it is truthy: the proxy logs and learns after the answer has gone out."""
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def both_turns(proxy: Proxy, user: str, thread: str) -> list[tuple[str, str]]:
    """The thread once the exchange's two turns are in it (they are logged one after the other)."""
    def found() -> list[tuple[str, str]]:
        turns = thread_of(proxy, user, thread)
        return turns if len(turns) >= 2 else []

    return eventually(found)


def thread_of(proxy: Proxy, user: str, thread: str, tenant: str = TENANT) -> list[tuple[str, str]]:
    with Shelf.open(proxy.db, embedder=None) as shelf:
        return [(m.role, m.content) for m in shelf.messages(Owner(tenant, user), thread, limit=100)]


def facts_of(proxy: Proxy, user: str, tenant: str = TENANT) -> dict[str, str]:
    with Shelf.open(proxy.db, embedder=None) as shelf:
        return {f.key: f.value for f in shelf.facts(Owner(tenant, user))}


def test_a_conversation_is_logged_learned_and_recalled_by_the_next_one(proxy: Proxy) -> None:
    chat = client(proxy)
    first = chat.chat.completions.create(
        model="tiny", user="kaleb", extra_headers={"X-Memshelf-Thread": "monday"},
        messages=[{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "I live in Porto."}])
    assert first.choices[0].message.content == ANSWER and first.usage.total_tokens == 11
    sent = proxy.upstream.received[-1]
    assert sent["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}  # nothing known yet
    assert sent["messages"][1:] == [{"role": "user", "content": "I live in Porto."}]
    assert sent["user"] == "kaleb" and proxy.upstream.keys[-1] == "Bearer sk-upstream-secret"
    assert both_turns(proxy, "kaleb", "monday") == [("user", "I live in Porto."),
                                                                      ("assistant", ANSWER)]
    assert eventually(lambda: facts_of(proxy, "kaleb")) == {"home_city": "Porto"}

    second = chat.chat.completions.create(
        model="tiny", user="kaleb", temperature=0.2,
        messages=[{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "Which city do I live in?"}])
    assert second.choices[0].message.content == ANSWER
    sent = proxy.upstream.received[-1]
    system = sent["messages"][0]["content"]
    assert system.startswith("You are a helpful assistant.\n\nMemory context:\nKnown facts about the user:")
    assert "home_city: Porto" in system and sent["temperature"] == 0.2 and sent["model"] == "tiny"
    assert sent["messages"][1] == {"role": "user", "content": "Which city do I live in?"}
    assert both_turns(proxy, "kaleb", "chat")[0] == ("user", "Which city do I live in?")


def test_streaming_passes_chunks_through_and_keeps_the_whole_answer(proxy: Proxy) -> None:
    stream = client(proxy).chat.completions.create(
        model="tiny", stream=True, extra_headers={"X-Memshelf-User": "ana", "X-Memshelf-Thread": "s1"},
        messages=[{"role": "user", "content": "I'm allergic to peanuts."}])
    pieces = [chunk.choices[0].delta.content for chunk in stream if chunk.choices and chunk.choices[0].delta.content]
    assert len(pieces) == len(ANSWER.split(" ")) and "".join(pieces) == ANSWER
    assert both_turns(proxy, "ana", "s1") == [("user", "I'm allergic to peanuts."),
                                                                ("assistant", ANSWER)]
    with Shelf.open(proxy.db, embedder=None) as shelf:
        learned = eventually(lambda: shelf.list_memories(Owner(TENANT, "ana"))[0])
    assert [m.content for m in learned] == ["The user is allergic to peanuts."]

    again = client(proxy).chat.completions.create(
        model="tiny", stream=True, user="ana", messages=[{"role": "user", "content": "Can I eat peanuts?"}])
    assert "".join(c.choices[0].delta.content or "" for c in again if c.choices) == ANSWER
    sent = proxy.upstream.received[-1]
    assert sent["messages"][0]["role"] == "system" and "allergic to peanuts" in sent["messages"][0]["content"]
    assert sent["stream"] is True


def test_each_chunk_reaches_the_client_before_the_upstream_sends_the_next(proxy: Proxy) -> None:
    """No buffering: the upstream sends its second chunk only once the client holds the first (through the proxy);
    a proxy that waited for more would leave the gate shut until the upstream gave up on it."""
    proxy.upstream.gate.clear()
    stream = client(proxy).chat.completions.create(
        model="gated", stream=True, user="gus", messages=[{"role": "user", "content": "Hello there."}])
    chunks = iter(stream)
    first = next(chunks)
    assert first.choices[0].delta.content == "Noted, " and not proxy.upstream.gate_held
    proxy.upstream.gate.set()
    rest = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert "Noted, " + rest == ANSWER
    assert proxy.upstream.gate_held.pop() is True, "the upstream's wait for the gate timed out"


def test_a_client_that_leaves_mid_stream_still_has_its_turn_kept(proxy: Proxy) -> None:
    stream = client(proxy).chat.completions.create(
        model="tiny", stream=True, user="finn", extra_headers={"X-Memshelf-Thread": "cut"},
        messages=[{"role": "user", "content": "I live in Braga."}])
    first = next(iter(stream))
    stream.close()  # gone after the first chunk
    assert first.choices[0].delta.content == "Noted, "
    logged = both_turns(proxy, "finn", "cut")
    time.sleep(0.3)  # time enough for a turn logged twice to show
    assert thread_of(proxy, "finn", "cut") == logged
    assert len(logged) == 2 and logged[0] == ("user", "I live in Braga."), logged  # each turn once
    assert logged[1][0] == "assistant" and ANSWER.startswith(logged[1][1]), logged  # what was answered so far
    assert eventually(lambda: facts_of(proxy, "finn")) == {"home_city": "Braga"}


def test_the_async_client_works_the_same_way(proxy: Proxy) -> None:
    async def converse() -> tuple[str, str]:
        chat = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key=proxy.secret, max_retries=0)
        plain = await chat.chat.completions.create(model="tiny", user="cy",
                                                   messages=[{"role": "user", "content": "Call me Cy."}])
        streamed = await chat.chat.completions.create(model="tiny", user="cy", stream=True,
                                                      messages=[{"role": "user", "content": "Hello again."}])
        text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
        await chat.close()
        return plain.choices[0].message.content or "", text

    assert asyncio.run(converse()) == (ANSWER, ANSWER)
    assert eventually(lambda: len(thread_of(proxy, "cy", "chat")) == 4)


def test_owners_stay_apart_across_users_and_tenants(proxy: Proxy) -> None:
    for key, user, city in [(proxy.secret, "dan", "Lisbon"), (proxy.secret, "eve", "Madrid"),
                            (proxy.other_tenant, "dan", "Oslo")]:
        client(proxy, key).chat.completions.create(model="tiny", user=user, extra_headers={"X-Memshelf-Thread": "t"},
                                                   messages=[{"role": "user", "content": f"I live in {city}."}])
    assert eventually(lambda: facts_of(proxy, "dan") == {"home_city": "Lisbon"})
    assert eventually(lambda: facts_of(proxy, "eve") == {"home_city": "Madrid"})
    assert eventually(lambda: facts_of(proxy, "dan", tenant="other") == {"home_city": "Oslo"})
    client(proxy, proxy.other_tenant).chat.completions.create(
        model="tiny", user="dan", messages=[{"role": "user", "content": "Where do I live?"}])
    system = proxy.upstream.system_of()
    assert "Oslo" in system and "Lisbon" not in system and "Madrid" not in system


def test_long_turns_are_forwarded_logged_whole_and_learned_from(proxy: Proxy) -> None:
    """A message over a message's 16,000 characters (or with a NUL) is a valid chat request: it was refused with a
    422, and a long answer was not logged (nor the exchange learned from)."""
    chat = client(proxy)
    asked = "Summarise this: " + "lorem ipsum " * 2_000 + "\x00 the end."
    reply = chat.chat.completions.create(model="tiny", user="lena", messages=[{"role": "user", "content": asked}])
    assert reply.choices[0].message.content == ANSWER
    assert proxy.upstream.received[-1]["messages"][-1]["content"] == asked  # forwarded as it was
    turns = eventually(lambda: (t := thread_of(proxy, "lena", "chat")) and len(t) >= 3 and t)
    assert [role for role, _ in turns] == ["user", "user", "assistant"]
    assert "".join(text for role, text in turns if role == "user") == asked.replace("\x00", "\ufffd")
    long = chat.chat.completions.create(model="long", user="lena", messages=[
        {"role": "user", "content": "I live in Berlin. Write me a long essay."}])
    assert long.choices[0].message.content == LONG_ANSWER
    assert eventually(lambda: facts_of(proxy, "lena").get("home_city")) == "Berlin"
    logged = thread_of(proxy, "lena", "chat")[3:]
    assert [role for role, _ in logged] == ["user", "assistant", "assistant"]
    assert "".join(text for role, text in logged if role == "assistant") == LONG_ANSWER  # in two messages


def test_a_tool_call_round_trip_logs_the_users_turn_once(proxy: Proxy) -> None:
    chat = client(proxy)
    asked = {"role": "user", "content": "What is the weather in Oslo?"}
    chat.chat.completions.create(model="tiny", user="tove", messages=[asked])
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]}
    chat.chat.completions.create(model="tiny", user="tove", messages=[
        asked, call, {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}])
    turns = eventually(lambda: (t := thread_of(proxy, "tove", "chat")) and len(t) >= 3 and t)
    time.sleep(0.3)
    assert thread_of(proxy, "tove", "chat") == [("user", asked["content"]), ("assistant", ANSWER),
                                                 ("assistant", ANSWER)] == turns


def test_models_are_the_upstreams(proxy: Proxy) -> None:
    assert [m.id for m in client(proxy).models.list()] == ["tiny"]


def test_errors_say_what_to_do(proxy: Proxy) -> None:
    chat = client(proxy)
    with pytest.raises(openai.BadRequestError) as missing_user:
        chat.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi."}])
    assert "X-Memshelf-User" in str(missing_user.value) and "user" in str(missing_user.value)
    with pytest.raises(openai.AuthenticationError):
        client(proxy, "ms_wrong").chat.completions.create(model="tiny", user="kaleb",
                                                          messages=[{"role": "user", "content": "Hi."}])
    before = len(proxy.upstream.received)
    with pytest.raises(openai.NotFoundError) as upstream_error:  # the upstream's status and body, unchanged
        chat.chat.completions.create(model="missing", user="zoe", messages=[{"role": "user", "content": "Hi."}])
    assert upstream_error.value.body == {"message": "model 'missing' not found", "type": "not_found"}
    assert len(proxy.upstream.received) == before + 1
    time.sleep(0.3)
    assert thread_of(proxy, "zoe", "chat") == []  # no answer, nothing logged
    bad = httpx.post(proxy.url + "/v1/chat/completions", content=b"{not json",
                     headers={"Authorization": f"Bearer {proxy.secret}", "X-Memshelf-User": "kaleb"})
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
    picture = "data:image/png;base64," + "A" * (3 << 20)  # a conversation with an image is more than 1 MiB
    with_image = client(proxy).chat.completions.create(model="tiny", user="kaleb", messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": picture}}]}])
    assert with_image.choices[0].message.content == ANSWER
    assert proxy.upstream.received[-1]["messages"][-1]["content"][1]["image_url"]["url"] == picture
    latin1 = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "tiny", "messages": [
        {"role": "user", "content": "Hi."}]}, headers={"Authorization": f"Bearer {proxy.secret}",
                                                      "X-Memshelf-User": b"Zo\xeb"})
    assert latin1.status_code == 400 and "not UTF-8" in latin1.json()["error"]["message"]
    empty = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "tiny", "messages": []},
                       headers={"Authorization": f"Bearer {proxy.secret}", "X-Memshelf-User": "kaleb"})
    assert empty.status_code == 422 and '"messages"' in empty.json()["error"]["message"]


@contextmanager
def served_chat(db: Path, upstream: str) -> Iterator[Any]:
    """`memshelf serve --upstream` on a fresh port over db, and an openai client holding a key of TENANT."""
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key(TENANT)[1]
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "memshelf", "--db", str(db), "serve", "--port", str(port),
                                "--upstream", upstream], env={**os.environ, "MEMSHELF_EMBEDDER": "none"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process)
        yield openai.OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_an_unreachable_upstream_is_a_502_naming_it(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    nowhere = f"http://127.0.0.1:{free_port()}/v1"
    with served_chat(db, nowhere) as chat:
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as failed:
                chat.chat.completions.create(model="tiny", user="kaleb", stream=stream,
                                             messages=[{"role": "user", "content": "I live in Porto."}])
            assert failed.value.status_code == 502 and nowhere + "/chat/completions" in str(failed.value)
        with Shelf.open(db, embedder=None) as shelf:
            assert shelf.messages(Owner(TENANT, "kaleb"), "chat") == []


def test_a_compressing_upstream_is_read_and_passed_on_decompressed(tmp_path: Path) -> None:
    """An upstream may gzip its answer, streamed or not: the client gets plain text (the proxy does not pass the
    encoding on) and the assistant's turn is read from it. With httpx the proxy passed a gzipped stream on as it
    came, without its Content-Encoding, and the client could not read it."""
    fake = FakeUpstream()
    db = tmp_path / "memory.db"
    with LiveServer(GZipMiddleware(fake.app(), minimum_size=1, exclude_content_types=())) as upstream, \
            served_chat(db, upstream.url + "/v1") as chat:
        plain = chat.chat.completions.create(model="tiny", user="kaleb", extra_headers={"X-Memshelf-Thread": "z1"},
                                             messages=[{"role": "user", "content": "I live in Porto."}])
        streamed = chat.chat.completions.create(model="tiny", user="kaleb", stream=True,
                                                extra_headers={"X-Memshelf-Thread": "z2"},
                                                messages=[{"role": "user", "content": "I work at Acme."}])
        assert plain.choices[0].message.content == ANSWER
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == ANSWER
        with Shelf.open(db, embedder=None) as shelf:
            owner = Owner(TENANT, "kaleb")
            for thread, said in (("z1", "I live in Porto."), ("z2", "I work at Acme.")):
                turns = eventually(lambda t=thread: len(shelf.messages(owner, t)) == 2 and shelf.messages(owner, t))
                assert [(m.role, m.content) for m in turns] == [("user", said), ("assistant", ANSWER)]


def test_a_server_without_an_upstream_has_no_chat_endpoint(tmp_path: Path) -> None:
    from memshelf.server import create_app
    from fastapi.testclient import TestClient

    with Shelf.open(tmp_path / "m.db", embedder=None) as shelf:
        secret = shelf.create_key(TENANT)[1]
        answer = TestClient(create_app(shelf)).post("/v1/chat/completions", json={},
                                                    headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == 404
    with pytest.raises(ConfigError, match="not an http"):
        create_app(target=str(tmp_path / "n.db"), embedder=None, upstream="localhost:11434")


class FailsOnce(Extractor):
    """The rules, behind a model service that is down for the first call."""

    name = "fails-once"

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, turns: Any, known: Any = None) -> list[Proposal]:
        self.calls += 1
        if self.calls == 1:
            raise ExtractorUnavailable("the model service refused the connection")
        return resolve_extractor("rules").propose(turns, known)


def test_a_failing_learn_is_retried_and_the_turns_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    from memshelf.server import _proxy, create_app

    flaky = FailsOnce()
    register_extractor("test-fails-once", lambda model: flaky)
    monkeypatch.setenv("MEMSHELF_EXTRACTOR", "test-fails-once")
    monkeypatch.setattr(_proxy, "RETRY_SECONDS", 0.2)
    fake = FakeUpstream()
    db = tmp_path / "memory.db"
    with Shelf.open(db, embedder=None) as shelf:
        secret = shelf.create_key(TENANT)[1]
    with LiveServer(fake.app()) as upstream, \
            LiveServer(create_app(target=str(db), embedder=None, upstream=upstream.url + "/v1")) as served:
        chat = openai.OpenAI(base_url=served.url + "/v1", api_key=secret, max_retries=0)
        chat.chat.completions.create(model="tiny", user="kaleb",
                                     messages=[{"role": "user", "content": "I live in Faro."}])
        with Shelf.open(db, embedder=None) as shelf:
            owner = Owner(TENANT, "kaleb")
            assert eventually(lambda: len(shelf.messages(owner, "chat")) == 2)  # kept before learning was tried
            assert eventually(lambda: {f.key: f.value for f in shelf.facts(owner)} == {"home_city": "Faro"})
    assert flaky.calls == 2
    assert "retrying in 0 s" in caplog.text and "refused the connection" in caplog.text
