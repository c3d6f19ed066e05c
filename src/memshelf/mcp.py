"""`memshelf mcp`: the tools an assistant calls, served with the official MCP Python SDK (`MCPServer`).

Tools: remember, recall, context, memories, forget, set_fact, facts, forget_fact, log_message, messages, learn.
Every result is bounded (recall returns at most MAX_RECALL hits, facts at most MAX_FACTS, a page of memories or
messages at most MAX_PAGE, learn reads at most MAX_LEARN_TURNS turns given to it, long contents are cut at
MAX_SHOWN_CHARS) so no tool returns the whole store. A tool refuses arguments it does not take, naming the ones it
does. Like the HTTP server this is thin: it resolves the owner, calls the Shelf, and formats.

Transports:
- stdio: `memshelf mcp --db PATH --tenant T --user U` (or `python -m memshelf.mcp ...`); the owner may also come
  from MEMSHELF_TENANT / MEMSHELF_USER.
- streamable HTTP at /mcp of `memshelf serve`: the tenant comes from the API key (`Authorization: Bearer <key>`),
  the user from the `X-Memshelf-User` header (or the `user` query parameter).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from datetime import datetime
from typing import Annotated, Any, TypeVar
from collections.abc import AsyncIterator, Callable, Sequence

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import MemshelfError
from .learning.base import Plan, Proposal
from .model import (MAX_CONTENT_CHARS, MAX_FACT_KEY_CHARS, MAX_FACT_VALUE_CHARS, MAX_TOPIC_CHARS, SOURCES_EXAMPLE, Fact,
                    Hit, Memory, Message, Owner, ROLES, sources_from_text)
from .server._errors import KEY_HINT, UNAUTHORIZED, error_response, problem, text_header
from .shelf import Shelf

MAX_RECALL = 20
MAX_FACTS = 100
MAX_LEARN_TURNS = 200
MAX_PAGE = 50
MAX_SHOWN_CHARS = 2_000
"""Longest content a listing shows; longer ones end with an ellipsis and `truncated: true`."""
USER_HEADER = "X-Memshelf-User"
OWNER_STATE = "memshelf_owner"

T = TypeVar("T")
OwnerResolver = Callable[[Context], Owner]
"""Finds who a tool call acts for: fixed for stdio, from the HTTP request for streamable HTTP."""

INSTRUCTIONS = """memshelf is this user's long-term memory. Call `recall` (or `context`) before answering questions
that may depend on what you learned earlier; call `remember` when the user tells you something worth keeping
(one short statement per call, with a topic); use `set_fact` for keyed state such as the user's name, which has
one current value. Facts are listed by `facts`, memories page by page (newest first, with ids) by `memories`.
`forget` erases a memory by its id and `forget_fact` a fact by its key: do it when the user says something is
wrong or asks you to forget it. When the user says a memory is right, `confirm` it; `set_expiry` changes when one is
forgotten. `log_message` keeps a conversation turn in a thread, `messages` reads them back and `forget_message`
erases one.
`learn` reads conversation turns (or a logged thread) and stores the facts and memories the user stated in them;
with dry_run it only says what it would store."""


# ---------------------------------------------------------------------------------------------- results

class Remembered(BaseModel):
    id: str
    topic: str
    source: str
    confidence: float = Field(description="set by the source: stated 1.0, mined 0.6, inferred 0.4")
    observations: int = Field(description="how many times this exact statement was remembered")


class MemoryItem(BaseModel):
    id: str
    topic: str
    content: str
    truncated: bool
    source: str
    confidence: float
    observations: int
    created_at: str
    expires_at: str | None = None


class Recalled(MemoryItem):
    score: float
    retriever: str = Field(description="keyword, semantic or hybrid (found by both)")


NEXT_CURSOR = "pass it as cursor to get the next page; null on the last page"


class MemoriesResult(BaseModel):
    memories: list[MemoryItem]
    next_cursor: str | None = Field(description=NEXT_CURSOR)


class MessageItem(BaseModel):
    id: str
    thread: str
    role: str
    content: str
    truncated: bool
    created_at: str


class MessagesResult(BaseModel):
    messages: list[MessageItem]
    next_cursor: str | None = Field(description=NEXT_CURSOR)


class RecallResult(BaseModel):
    mode: str
    degraded: bool = Field(description="true when meaning search was unavailable and keywords were used")
    hits: list[Recalled]


class FactItem(BaseModel):
    key: str
    value: str
    truncated: bool
    source: str
    updated_at: str
    note: str | None = None


class FactsResult(BaseModel):
    facts: list[FactItem]
    more: bool = Field(description="true when the user has more facts than were listed")


class Forgotten(BaseModel):
    forgotten: str
    scrub_pending: bool = False  # gone from every read; a copy may stay in the database's files a while


Role = Annotated[str, Field(min_length=1, max_length=64, description=f"who said it, one of {', '.join(ROLES)}: only "
                                                                      "the user's own turns teach anything")]
Said = Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS, description="what was said")]


class TurnArg(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Role
    content: Said


class Learned(BaseModel):
    op: str = Field(description="remember, set_fact or supersede when written (or, in a dry run, would be); skip "
                                "when not, with the reason")
    source: str
    key: str | None = None
    value: str | None = None
    topic: str | None = None
    content: str | None = None
    reason: str
    record: str | None = Field(None, description="the memory id or fact key written")


class LearnResult(BaseModel):
    dry_run: bool
    applied: int = Field(description="how many proposals were written (in a dry run: would be)")
    skipped: int
    watermark: str | None = Field(description="the last message of the thread now learned")
    proposals: list[Learned]


def learned(proposal: Proposal) -> Learned:
    value = None if proposal.value is None else shown(proposal.value)[0]
    content = None if proposal.content is None else shown(proposal.content)[0]
    return Learned(op=proposal.op, source=proposal.source, key=proposal.key, value=value, topic=proposal.topic,
                   content=content, reason=shown(proposal.reason)[0], record=proposal.record)


def learn_result(plan: Plan) -> LearnResult:
    return LearnResult(dry_run=plan.dry_run, applied=len(plan.applied), skipped=len(plan.skipped),
                       watermark=plan.watermark, proposals=[learned(p) for p in plan.proposals])


def shown(text: str) -> tuple[str, bool]:
    if len(text) <= MAX_SHOWN_CHARS:
        return text, False
    return text[:MAX_SHOWN_CHARS - 1] + "\u2026", True


def memory_item(memory: Memory) -> dict[str, Any]:
    content, truncated = shown(memory.content)
    return {"id": memory.id, "topic": memory.topic, "content": content, "truncated": truncated,
            "source": memory.source, "confidence": memory.confidence, "observations": memory.observations,
            "created_at": memory.created_at.isoformat(), "expires_at": _iso(memory.expires_at)}


def recalled(hit: Hit) -> Recalled:
    return Recalled(**memory_item(hit.memory), score=round(hit.score, 6), retriever=hit.retriever)


def message_item(message: Message) -> MessageItem:
    content, truncated = shown(message.content)
    return MessageItem(id=message.id, thread=message.thread, role=message.role, content=content,
                       truncated=truncated, created_at=message.created_at.isoformat())


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def fact_item(fact: Fact) -> FactItem:
    value, truncated = shown(fact.value)
    return FactItem(key=fact.key, value=value, truncated=truncated, source=fact.source,
                    updated_at=fact.updated_at.isoformat(), note=fact.note)


# ---------------------------------------------------------------------------------------------- the server

Topic = Annotated[str, Field(min_length=1, max_length=MAX_TOPIC_CHARS,
                             description="a short label the statement is about, e.g. 'printer' or 'diet'")]
Statement = Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS,
                                 description="one self-contained statement, e.g. 'The office printer is on "
                                             "192.168.1.40.'")]
Question = Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS,
                                description="what you want to know, in plain words")]
Source = Annotated[str, Field(min_length=1, max_length=64,
                              description="stated: the user said it (1.0); mined: extracted from a conversation "
                                          "(0.6); inferred: your own conclusion (0.4); or another source the server "
                                          "declares")]
FactKey = Annotated[str, Field(min_length=1, max_length=MAX_FACT_KEY_CHARS,
                               description="the name of the state, e.g. 'user_name'")]
Thread = Annotated[str, Field(min_length=1, max_length=MAX_TOPIC_CHARS,
                              description="the conversation's name, e.g. 'kitchen' or a chat id")]
MemoryId = Annotated[str, Field(min_length=1, max_length=200,
                                description="the id that remember, recall or memories returned")]
PageSize = Annotated[int, Field(strict=True, ge=1, le=MAX_PAGE, description="most items on this page")]
Cursor = Annotated[str | None, Field(min_length=1, max_length=200, description=(
    "the next_cursor of the previous page, unchanged; omit it for the first page"))]


class StrictTool(Tool):
    """A tool that refuses arguments it does not take, and says what is wrong with the others in plain words: the
    SDK alone drops unknown arguments silently and answers pydantic's text, links included."""

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> StrictTool:
        tool = cls.from_function(fn)
        assert isinstance(tool, cls)  # from_function builds the class it is called on
        tool.parameters["additionalProperties"] = False
        return tool

    async def run(self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False) -> Any:
        problems = self.problems(arguments)
        if problems:
            raise ToolError(f"{self.name} was not run: {'; '.join(problems[:5])}. It takes {self.takes()}")
        return await super().run(arguments, context, convert_result)

    def problems(self, arguments: dict[str, Any]) -> list[str]:
        unknown = [f"unknown argument {name!r}" for name in arguments if name not in self.parameters["properties"]]
        try:
            self.fn_metadata.validate_arguments(arguments)
        except ValidationError as exc:
            return unknown + [problem(".".join(str(part) for part in error["loc"]), error) for error in exc.errors()]
        return unknown

    def takes(self) -> str:
        required = set(self.parameters.get("required", ()))
        return ", ".join(f"{name} (required)" if name in required else name for name in self.parameters["properties"])


def build_mcp_server(shelf: Shelf, owner_resolver: OwnerResolver) -> MCPServer:
    """The MCP server with memshelf's tools; `owner_resolver` says whose memory each call reads and writes."""
    tools: list[Tool] = []

    def tool(fn: Callable[..., Any]) -> None:
        tools.append(StrictTool.of(fn))

    def owner(ctx: Context) -> Owner:
        try:
            return owner_resolver(ctx)
        except MemshelfError as exc:
            raise ToolError(str(exc)) from exc

    @tool
    def remember(topic: Topic, content: Statement, ctx: Context, source: Source = "stated",
                 ttl_seconds: Annotated[float | None, Field(strict=True, gt=0, description="forget it after this many "
                                                                              "seconds; omit to keep it")] = None
                 ) -> Remembered:
        """Store one statement in the user's long-term memory. Repeating a statement counts another observation
        instead of storing a copy."""
        memory = _call(lambda: shelf.remember(owner(ctx), topic, content, source, ttl=ttl_seconds))
        return Remembered(id=memory.id, topic=memory.topic, source=memory.source, confidence=memory.confidence,
                          observations=memory.observations)

    @tool
    def recall(question: Question, ctx: Context,
               limit: Annotated[int, Field(strict=True, ge=1, le=MAX_RECALL, description="most hits to return")] = 5
               ) -> RecallResult:
        """Search the user's memory for statements relevant to a question, best first, each with its confidence
        and the retriever that found it."""
        result = _call(lambda: shelf.search(owner(ctx), question, limit=limit))
        return RecallResult(mode=result.mode, degraded=result.degraded, hits=[recalled(h) for h in result])

    @tool
    def context(question: Question, ctx: Context,
                limit: Annotated[int, Field(strict=True, ge=1, le=MAX_RECALL,
                                            description="most statements to include")] = 3
                ) -> str:
        """The block of relevant knowledge to put in a prompt for this question (empty when nothing matches)."""
        return _call(lambda: shelf.context(owner(ctx), question, limit=limit))

    @tool
    def memories(ctx: Context, limit: PageSize = 20, cursor: Cursor = None) -> MemoriesResult:
        """List what you remember about the user, newest first, a page at a time, with ids. Call it to review or
        tidy the memory (then `forget` what is wrong or outdated) or when the user asks what you know; to answer a
        question, `recall` finds the relevant statements instead."""
        page, next_cursor = _call(lambda: shelf.list_memories(owner(ctx), limit=limit, cursor=cursor))
        return MemoriesResult(memories=[MemoryItem(**memory_item(m)) for m in page], next_cursor=next_cursor)

    @tool
    def forget(memory_id: MemoryId, ctx: Context) -> Forgotten:
        """Erase one memory for good (its text, index entries and vector): when it is wrong or outdated, or the
        user asks you to forget it."""
        erased = _call(lambda: shelf.forget(owner(ctx), memory_id))
        return Forgotten(forgotten=memory_id, scrub_pending=erased.scrub_pending)

    @tool
    def confirm(memory_id: MemoryId, ctx: Context) -> MemoryItem:
        """The user says a memory is right: one that was mined or guessed becomes stated, with stated's confidence,
        so it outranks guesses. Call it only on the user's word, never on your own."""
        return MemoryItem(**memory_item(_call(lambda: shelf.confirm(owner(ctx), memory_id))))

    @tool
    def set_expiry(memory_id: MemoryId, ctx: Context,
                   ttl_seconds: Annotated[float | None, Field(strict=True, gt=0, description=(
                       "forget it this many seconds from now; omit it to keep the memory for good"))] = None
                   ) -> MemoryItem:
        """Change when a memory is forgotten: in ttl_seconds, or never when it is omitted (e.g. the user says a
        temporary arrangement is now permanent, or that something only holds for a while)."""
        return MemoryItem(**memory_item(_call(lambda: shelf.set_expiry(owner(ctx), memory_id, ttl=ttl_seconds))))

    @tool
    def set_fact(key: FactKey, value: Annotated[str, Field(min_length=1, max_length=MAX_FACT_VALUE_CHARS)],
                 ctx: Context, source: Source = "stated") -> FactItem:
        """Set the one current value of a keyed fact about the user (e.g. user_name = Kaleb); the old value is
        kept in an audit trail."""
        return fact_item(_call(lambda: shelf.set_fact(owner(ctx), key, value, source)))

    @tool
    def facts(ctx: Context,
              limit: Annotated[int, Field(strict=True, ge=1, le=MAX_FACTS,
                                          description="most facts to list")] = MAX_FACTS
              ) -> FactsResult:
        """The user's current facts, most recently set first."""
        everything = _call(lambda: shelf.facts(owner(ctx)))
        return FactsResult(facts=[fact_item(f) for f in everything[:limit]], more=len(everything) > limit)

    @tool
    def forget_fact(key: FactKey, ctx: Context) -> Forgotten:
        """Erase a fact and its whole history, when it no longer holds or the user asks you to forget it. To change
        a value, call `set_fact` instead: it keeps the old value in the history."""
        erased = _call(lambda: shelf.forget_fact(owner(ctx), key))
        return Forgotten(forgotten=key, scrub_pending=erased.scrub_pending)

    @tool
    def log_message(thread: Thread, role: Role, content: Said, ctx: Context) -> MessageItem:
        """Keep one turn of a conversation in the user's history, in a named thread. History is not searched as
        knowledge: `messages` reads it back, and `learn` with the thread stores what the user stated in it."""
        return message_item(_call(lambda: shelf.log_message(owner(ctx), thread, role, content)))

    @tool
    def forget_message(message_id: Annotated[str, Field(min_length=1, max_length=200, description=(
                           "the id that log_message or messages returned"))], ctx: Context) -> Forgotten:
        """Erase one logged conversation turn for good, when the user asks; what was already learned from it
        stays (forget those memories or facts too if the user wants them gone)."""
        erased = _call(lambda: shelf.forget_message(owner(ctx), message_id))
        return Forgotten(forgotten=message_id, scrub_pending=erased.scrub_pending)

    @tool
    def messages(ctx: Context, thread: Annotated[Thread | None, Field(description=(
                     "one thread's turns; omit it for every thread's, each naming its thread"))] = None,
                 limit: PageSize = 20, cursor: Cursor = None) -> MessagesResult:
        """Read the user's logged conversation turns, newest first, a page at a time: to see what was said
        earlier, or which threads there are."""
        page, next_cursor = _call(lambda: shelf.list_messages(owner(ctx), thread, limit=limit, cursor=cursor))
        return MessagesResult(messages=[message_item(m) for m in page], next_cursor=next_cursor)

    @tool
    def learn(ctx: Context,
              messages: Annotated[list[TurnArg] | None, Field(min_length=1, max_length=MAX_LEARN_TURNS, description=(
                  "the recent turns to learn from, oldest first; or give thread instead"))] = None,
              thread: Annotated[str | None, Field(min_length=1, max_length=MAX_TOPIC_CHARS, description=(
                  "a thread logged through memshelf: its messages not learned yet"))] = None,
              dry_run: Annotated[bool, Field(description="only say what would be stored")] = False) -> LearnResult:
        """Learn from the conversation: store the facts (name, home city, allergies, ...) and memories the user
        stated, each with the reason it was or was not stored. A stronger source is never replaced by a weaker."""
        turns = None if messages is None else [turn.model_dump() for turn in messages]
        return learn_result(_call(lambda: shelf.learn(owner(ctx), turns, thread=thread, dry_run=dry_run)))

    for each in tools:  # the schema names the sources this shelf declares; the Shelf says "did you mean" to others
        if "source" in each.parameters["properties"]:
            each.parameters["properties"]["source"]["enum"] = list(shelf.sources)
    return MCPServer("memshelf", instructions=INSTRUCTIONS, version=_version(), log_level="WARNING", tools=tools)


ADVICE = {
    "memory_id": "call memories (or recall) for the ids",
    "message_id": "call messages for the ids",
    "fact_key": "call facts for the keys",
    "source": "use a declared source; a new one is declared where the memshelf MCP server is started, e.g. "
              "MEMSHELF_SOURCES={subject}=0.8",
}
"""What to do about an error, in the tools' terms, by the error's `fix` (memshelf.errors)."""


def _call(action: Callable[[], T]) -> T:
    """Run a Shelf verb; memshelf's errors become tool errors the model can read and act on."""
    try:
        return action()
    except MemshelfError as exc:
        raise ToolError(exc.in_terms(ADVICE)) from exc


def _version() -> str:
    from . import __version__

    return __version__


# ---------------------------------------------------------------------------------------------- stdio

def fixed_owner(owner: Owner) -> OwnerResolver:
    return lambda _ctx: owner


def run_stdio(shelf: Shelf, owner: Owner) -> None:
    """Serve the tools over stdin/stdout for one owner (blocks until the client disconnects)."""
    build_mcp_server(shelf, fixed_owner(owner)).run("stdio")


def owner_from(tenant: str | None, user: str | None) -> Owner:
    """--tenant/--user, else MEMSHELF_TENANT / MEMSHELF_USER."""
    tenant = tenant or os.environ.get("MEMSHELF_TENANT")
    user = user or os.environ.get("MEMSHELF_USER")
    if not tenant or not user:
        raise SystemExit("memshelf mcp needs an owner: pass --tenant and --user, or set MEMSHELF_TENANT and "
                         "MEMSHELF_USER")
    return Owner(tenant, user)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m memshelf.mcp --db PATH --tenant T --user U [--embedder none] [--sources crm=0.5]`."""
    parser = argparse.ArgumentParser(prog="memshelf mcp", description="Serve memshelf's MCP tools over stdio.")
    parser.add_argument("--db", help="SQLite file or postgresql:// URL (default MEMSHELF_DATABASE_URL/MEMSHELF_DB)")
    parser.add_argument("--tenant", help="tenant of the owner (default MEMSHELF_TENANT)")
    parser.add_argument("--user", help="user of the owner (default MEMSHELF_USER)")
    parser.add_argument("--embedder", help="local, static, ollama:<model>, openai:<model> or none (default "
                                           "MEMSHELF_EMBEDDER, else local when installed)")
    parser.add_argument("--sources", help=f"sources to declare beside stated, mined and inferred, as NAME=WORTH "
                                          f"pairs: {SOURCES_EXAMPLE} (default MEMSHELF_SOURCES)")
    args = parser.parse_args(argv)
    owner = owner_from(args.tenant, args.user)
    options: dict[str, Any] = {} if args.embedder is None else {"embedder": args.embedder}
    try:
        if args.sources is not None:
            options["sources"] = sources_from_text(args.sources, "--sources")
        shelf = Shelf.open(args.db, **options)
    except MemshelfError as exc:
        parser.exit(2, f"memshelf mcp: error: {exc}\n")
    with shelf:
        run_stdio(shelf, owner)


# ---------------------------------------------------------------------------------------------- streamable HTTP

def http_owner(ctx: Context) -> Owner:
    """The owner McpEndpoint put in the HTTP request's state after checking the key and the user."""
    request = ctx.request_context.request
    found = getattr(getattr(request, "state", None), OWNER_STATE, None)
    if not isinstance(found, Owner):
        raise ToolError("no owner for this request: call /mcp with an API key and the X-Memshelf-User header")
    return found


class McpEndpoint:
    """The ASGI app `memshelf serve` routes /mcp to: resolves the owner (the tenant from the key ApiKeyAuth checked,
    the user from X-Memshelf-User, else ?user=) and hands the request to the SDK's streamable HTTP transport.

    Stateless (no session kept between requests), so any worker process can answer any request. DNS rebinding
    protection is off because every request needs an API key, which a rebinding web page does not have.
    """

    def __init__(self, shelf: Shelf) -> None:
        self.server = build_mcp_server(shelf, http_owner)
        self.transport: ASGIApp = self.server.streamable_http_app(
            streamable_http_path="/mcp", stateless_http=True, json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.server.session_manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.transport_or_refusal(scope)(scope, receive, send)

    def transport_or_refusal(self, scope: Scope) -> ASGIApp:
        """The SDK's transport with the owner in the request state, or the error answer (a JSON-RPC error, which
        MCP clients report) that says what to send instead."""
        if scope["method"] != "POST":  # stateless: no event stream to GET, no session to DELETE
            return error_response(405, "method_not_allowed", "this MCP endpoint is stateless and answers POST only: "
                                  "send each JSON-RPC message as a POST (there is no event stream to GET and no "
                                  "session to DELETE)", {"Allow": "POST"}, rpc=True)
        key = scope.get("state", {}).get("memshelf_key")
        if key is None:  # ApiKeyAuth answers a request without a live key before it gets here
            return error_response(401, "unauthorized", f"missing API key: {KEY_HINT}",
                                  {"WWW-Authenticate": UNAUTHORIZED}, rpc=True)
        if key.tenant is None:
            return error_response(403, "forbidden", ("admin keys cannot use the memory tools: use a key bound "
                                                      f"to a tenant; {KEY_HINT}"), rpc=True)
        # The header wins over ?user= (README): a client config's fixed header is not overridden by a URL.
        try:
            user = text_header(Headers(scope=scope), USER_HEADER) or \
                QueryParams(scope.get("query_string", b"")).get("user")
            if not user:
                raise MemshelfError(f"no user: send the {USER_HEADER} header (or ?user=) naming whose memory "
                                    "the tools act on")
            scope["state"][OWNER_STATE] = Owner(key.tenant, user)
        except MemshelfError as exc:
            return error_response(422, "invalid_input", str(exc), rpc=True)
        return self.transport


if __name__ == "__main__":
    main(sys.argv[1:])
