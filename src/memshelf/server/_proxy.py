"""The memory proxy: `POST /v1/chat/completions` and `GET /v1/models` in the OpenAI chat API, forwarded to an
OpenAI-compatible upstream (Ollama's /v1, vLLM, llama.cpp's server, OpenAI) with the user's memory added.

For each chat request: the owner is the key's tenant and the user the request names (`X-Memshelf-User`, else the
body's `user`); the memory context for the last user message (what build_prompt adds: facts, then relevant
knowledge) is appended to the system message (or becomes one); nothing else in the body changes. The answer
passes through as the upstream sent it, chunk by chunk when streamed. After it has been sent, the user's turn and
the assistant's are logged to the thread (`X-Memshelf-Thread`, else DEFAULT_THREAD) and the thread is learned from
in the background; a learn that fails is logged and retried (the turns are already stored, so nothing is lost).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from ..errors import ConfigError, InvalidInput, MemshelfError
from ..model import MAX_CONTENT_CHARS, UNSTORABLE, Owner
from ..shelf import Shelf
from ._deps import KEY_SECURITY, TenantDep, checked_key, tenant_of
from ._errors import ApiError, text_header

__all__ = ["DEFAULT_THREAD", "THREAD_HEADER", "UPSTREAM_ENV", "UPSTREAM_KEY_ENV", "Upstream", "proxy_router"]

log = logging.getLogger("memshelf.proxy")

UPSTREAM_ENV = "MEMSHELF_UPSTREAM"
UPSTREAM_KEY_ENV = "MEMSHELF_UPSTREAM_KEY"
"""The upstream's API key (sent as `Authorization: Bearer`); OPENAI_API_KEY when unset; none when neither is."""
USER_HEADER = "X-Memshelf-User"
THREAD_HEADER = "X-Memshelf-Thread"
DEFAULT_THREAD = "chat"
"""The thread a user's proxied turns go to when the request names none."""
RETRY_SECONDS = 30.0
"""How long after a failed learn the proxy tries again (and again, doubling, up to RETRIES times)."""
RETRIES = 5
_FORWARDED_HEADERS = ("content-type", "cache-control", "x-request-id", "openai-processing-ms", "retry-after")
"""The upstream's response headers passed on (not its length or encoding: the body may be re-chunked)."""


@dataclass
class Upstream:
    """Where chat requests go: the upstream's base URL (its /v1) and key, one pooled HTTP client (aiohttp's, made
    on the server's event loop at the first request), and the background learning the proxy started (held so a
    task is not collected before it ends).

    aiohttp, not httpx: forwarding through httpx's async client cost 1.4 ms per request on loopback, aiohttp's
    0.65 ms (BENCHMARKS.md, "Memory proxy"), and the proxy's first streamed byte has 2 ms in all."""

    url: str
    key: str | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    locks: dict[tuple[str, str, str], asyncio.Lock] = field(default_factory=dict)
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"upstream {self.url!r} is not an http(s) URL: pass the chat API's base URL, e.g. "
                              "http://127.0.0.1:11434/v1 for Ollama")

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Generations can take minutes: only connecting is bounded tightly. trust_env: HTTP(S)_PROXY and
            # NO_PROXY apply, as they do to the openai client.
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=600.0)
            self._session = aiohttp.ClientSession(timeout=timeout, trust_env=True)
        return self._session

    @classmethod
    def from_env(cls, url: str | None = None) -> Upstream | None:
        url = url or os.environ.get(UPSTREAM_ENV) or None
        if url is None:
            return None
        return cls(url, os.environ.get(UPSTREAM_KEY_ENV) or os.environ.get("OPENAI_API_KEY") or None)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], bytes]:
        """One whole exchange with the upstream: its status, the headers passed on, and its body."""
        try:
            async with self.session.request(method, self.url + path, json=body, headers=self.headers()) as answer:
                return answer.status, _passed_on(answer), await answer.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self.unreachable(path, exc) from None

    def unreachable(self, path: str, exc: Exception) -> ApiError:
        return ApiError(502, "upstream_unreachable", f"the upstream {self.url + path} could not be reached "
                                                     f"({type(exc).__name__}: {exc}): check that the model server "
                                                     f"is running and that --upstream names its chat API")


def proxy_router(upstream: Upstream, shelf: Shelf) -> APIRouter:
    router = APIRouter(tags=["proxy"])

    @router.get("/v1/models")
    async def models(_: TenantDep) -> Response:
        """The upstream's models, as it lists them."""
        status, headers, content = await upstream.send("GET", "/models")
        return Response(content, status, headers=headers)

    # No FastAPI dependencies here: solving TenantDep's (the key's two documented headers, then the tenant) cost
    # 0.25 ms of the 2 ms the proxy may add before the first streamed byte. The key is the one ApiKeyAuth checked.
    @router.post("/v1/chat/completions", openapi_extra={"security": KEY_SECURITY})
    async def chat(request: Request) -> Response:
        """An OpenAI chat completion, with the user's memory in the system message; streamed when asked."""
        tenant = tenant_of(checked_key(request))
        body = await _chat_body(request)
        owner = Owner(tenant, _user_of(request, body))
        thread = _header(request, THREAD_HEADER) or DEFAULT_THREAD
        asked = _last_user_text(body["messages"])
        memory = await run_in_threadpool(_memory_for, shelf, owner, asked)
        if memory:
            body["messages"] = _with_memory(body["messages"], memory)
        # A request that ends with a tool result or an assistant message continues the exchange: the user said
        # nothing new, so no user turn is logged again.
        last = body["messages"][-1]
        said = asked if isinstance(last, dict) and last.get("role") == "user" else ""
        turns = Turns(upstream, shelf, owner, thread, said)
        if body.get("stream"):
            return await _stream(upstream, body, turns)
        status, headers, content = await upstream.send("POST", "/chat/completions", body)
        success = 200 <= status < 300
        if success:
            turns.answer = _answer_text(content)
        return Response(content, status, headers=headers, background=BackgroundTask(turns.keep) if success else None)

    return router


@dataclass
class Turns:
    """What one exchange leaves in memory, written after the answer went out: the user's turn, the assistant's,
    then learning on the thread."""

    upstream: Upstream
    shelf: Shelf
    owner: Owner
    thread: str
    said: str
    answer: str | None = None
    kept: bool = False

    async def keep(self) -> None:
        if self.kept:  # a stream the client left: the response's background task and later() may both ask
            return
        self.kept = True
        try:
            await run_in_threadpool(self._log)
        except MemshelfError as exc:  # e.g. a store that is busy: the client has its answer, so say it here
            log.error("could not log the turns of %s in thread %r: %s", self.owner, self.thread, exc)
            return
        self._spawn(self._learn(RETRIES))

    def later(self) -> None:
        """keep(), as a task of its own (when no response's background task will run it)."""
        self._spawn(self.keep())

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.upstream.tasks.add(task)
        task.add_done_callback(self.upstream.tasks.discard)

    def _log(self) -> None:
        """Both turns in one transaction: a question is never kept without the answer it got."""
        turns = [{"role": role, "content": piece}
                 for role, text in (("user", self.said), ("assistant", self.answer or "")) for piece in _pieces(text)]
        if turns:
            self.shelf.log_messages(self.owner, self.thread, turns)

    async def _learn(self, retries: int, wait: float | None = None) -> None:
        """Learn from the thread (what was not learned yet); on failure, try again later. One learn at a time per
        thread, so two answers in quick succession do not propose the same turn twice."""
        wait = RETRY_SECONDS if wait is None else wait
        lock = self.upstream.locks.setdefault((self.owner.tenant, self.owner.user, self.thread), asyncio.Lock())
        try:
            async with lock:
                await run_in_threadpool(self.shelf.learn, self.owner, thread=self.thread)
        except MemshelfError as exc:
            if retries <= 0:
                log.error("learning from thread %r of %s failed and will be retried with the thread's next "
                          "exchange: %s", self.thread, self.owner, exc)
                return
            log.warning("learning from thread %r of %s failed, retrying in %.0f s: %s", self.thread, self.owner,
                        wait, exc)
            await asyncio.sleep(wait)
            await self._learn(retries - 1, wait * 2)


async def _chat_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not JSON ({exc}): send a chat completion request, "
                                            '{"model": ..., "messages": [...]}') from None
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ApiError(422, "invalid_input", 'a chat completion needs "messages", a non-empty list of '
                                             '{"role", "content"}')
    return body


def _header(request: Request, name: str) -> str | None:
    try:
        return text_header(request.headers, name)
    except InvalidInput as exc:
        raise ApiError(400, "invalid_input", str(exc)) from None


def _user_of(request: Request, body: dict[str, Any]) -> str:
    user = _header(request, USER_HEADER) or body.get("user")
    if not isinstance(user, str) or not user.strip():
        raise ApiError(400, "missing_user", f"whose memory? send the user as the request's \"user\" field (user= "
                                            f"in the openai client) or the {USER_HEADER} header")
    return user


def _text(content: Any) -> str:
    """A message's text: its content string, or the text parts of a list of parts (images are left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
    return ""


def _memory_for(shelf: Shelf, owner: Owner, asked: str) -> str:
    """The memory block for the user's last message; facts alone when it has no text. The lookup reads at most the
    first MAX_CONTENT_CHARS characters of it, a NUL or lone surrogate read as U+FFFD: a long or odd message is still
    a valid chat request, and is forwarded whatever the lookup makes of it."""
    question = _loggable(asked)[:MAX_CONTENT_CHARS]
    try:
        return shelf.build_prompt("", owner, question if question.strip() else "")
    except InvalidInput as exc:
        log.warning("no memory block for a message of %s: %s", owner, exc)
        return ""


def _loggable(text: str) -> str:
    """Text as a message can hold it: no NUL, no lone surrogate (each becomes U+FFFD)."""
    return UNSTORABLE.sub("\ufffd", text)


def _pieces(text: str) -> list[str]:
    """A turn as messages: consecutive pieces of at most MAX_CONTENT_CHARS characters (a message's limit), so a
    long turn is logged whole and learned from, not dropped."""
    text = _loggable(text)
    return [piece for start in range(0, len(text), MAX_CONTENT_CHARS)
            if (piece := text[start:start + MAX_CONTENT_CHARS]).strip()]


def _last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def _with_memory(messages: list[Any], memory: str) -> list[Any]:
    """The messages with the memory block at the end of the first system (or developer) message, or in a new
    system message in front when there is none."""
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            content = message.get("content")
            if isinstance(content, list):
                added: Any = [*content, {"type": "text", "text": memory}]
            else:
                added = f"{content}\n\n{memory}" if isinstance(content, str) and content.strip() else memory
            return [*messages[:index], {**message, "content": added}, *messages[index + 1:]]
    return [{"role": "system", "content": memory}, *messages]


def _answer_text(content: bytes) -> str | None:
    try:
        return _text(json.loads(content)["choices"][0]["message"]["content"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def _passed_on(answer: aiohttp.ClientResponse) -> dict[str, str]:
    return {name: answer.headers[name] for name in _FORWARDED_HEADERS if name in answer.headers}


async def _stream(upstream: Upstream, body: dict[str, Any], turns: Turns) -> Response:
    """Send the request and pass the upstream's server-sent events on as they come, reading the assistant's text
    from them on the way; the turns are kept once the last chunk has gone out."""
    try:
        answer = await upstream.session.post(upstream.url + "/chat/completions", json=body,
                                             headers=upstream.headers())
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise upstream.unreachable("/chat/completions", exc) from None
    if not answer.ok:
        async with answer:
            return Response(await answer.read(), answer.status, headers=_passed_on(answer))
    events = _Events()

    async def chunks() -> AsyncIterator[bytes]:
        finished = False
        try:
            async for chunk in answer.content.iter_any():
                events.feed(chunk)
                yield chunk
            finished = True
        finally:
            turns.answer = events.text()
            if not finished:  # the client (or the upstream) went away mid-stream: keep what was said so far
                turns.later()
            answer.release()

    return StreamingResponse(chunks(), answer.status, headers=_passed_on(answer),
                             background=BackgroundTask(turns.keep))


class _Events:
    """The assistant's text, read from a chat completion's server-sent events as they pass."""

    def __init__(self) -> None:
        self._pending = b""
        self._parts: list[str] = []

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            data = line.strip()
            if not data.startswith(b"data:"):
                continue
            data = data[len(b"data:"):].strip()
            if data == b"[DONE]":
                continue
            try:
                delta = json.loads(data)["choices"][0].get("delta") or {}
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                continue
            if isinstance(delta.get("content"), str):
                self._parts.append(delta["content"])

    def text(self) -> str:
        self.feed(b"\n")
        return "".join(self._parts)
