"""An OpenAI Agents SDK session whose history is an owner's memshelf thread (`pip install memshelf[agents]`).

    from agents import Agent, Runner
    from memshelf import Owner, Shelf
    from memshelf.integrations.openai_agents import ShelfSession

    session = ShelfSession(Shelf.open("memory.db"), Owner("home", "kaleb"), thread="support")
    await Runner.run(Agent(name="Assistant"), "I live in Porto.", session=session)

The conversation lives in memshelf, under its retention (the shelf's message TTL, or `ttl`), erasure
(forget_thread, forget_user) and learning: `shelf.learn(owner, thread=...)` reads the user's turns as they were
said. A message item with text content is kept as its role and text, so it reads as the conversation it was (an
assistant's output parts become their text); any other item (a tool call, its output, reasoning) is kept whole as
JSON in a `tool` turn and comes back exactly. An item longer than a message holds (16,000 characters) is kept in
consecutive messages of its role, each after the first marked PART_PREFIX, and comes back whole. The shelf may be
a Shelf or a memshelf.Client; its calls run in a worker thread, so the event loop never waits on the database.
add_items writes all of the items or none on a Shelf (one transaction); through a Client in requests that each hold
whole items and are each kept whole or not at all.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents.memory.session_settings import SessionSettings, resolve_session_limit

from ..client import Client, whole_groups
from ..model import MAX_CONTENT_CHARS, ROLES, UNSTORABLE, Message, Owner

__all__ = ["ITEM_PREFIX", "PART_PREFIX", "ShelfSession"]

ITEM_PREFIX = "memshelf-agents-item:"
"""How a `tool` turn that holds a whole SDK item as JSON begins (a person's text never does)."""
PART_PREFIX = "memshelf-agents-part:"
"""How a turn that continues the one before it begins: the rest of an item too long for one message."""
_TEXT_PARTS = ("input_text", "output_text", "text")
PAGE = 1_000


class ShelfSession:
    """The SDK's Session protocol over one owner's thread. session_id is the thread's name."""

    def __init__(self, shelf: Any, owner: Owner, thread: str = "agents", *, ttl: float | None = None,
                 session_settings: SessionSettings | None = None) -> None:
        self.shelf, self.owner, self.thread, self.ttl = shelf, owner, thread, ttl
        self.session_id = thread
        self.session_settings = session_settings

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The thread's items oldest first: all of them, or the newest `limit`."""
        wanted = resolve_session_limit(limit, self.session_settings)
        return await asyncio.to_thread(self._items, wanted)

    async def add_items(self, items: list[Any]) -> None:
        await asyncio.to_thread(self._add, items)

    async def pop_item(self) -> Any | None:
        """Erase the newest item of the thread and return it (None when the thread is empty)."""
        return await asyncio.to_thread(self._pop)

    async def clear_session(self) -> None:
        """Erase the thread: its messages and learning watermark (what was learned from it stays)."""
        await asyncio.to_thread(self.shelf.forget_thread, self.owner, self.thread)

    # ---------------------------------------------------------------- the work, in a worker thread
    def _items(self, limit: int | None) -> list[Any]:
        return [item_of(head.role, text) for head, _, text in reversed(self._newest(limit))]

    def _newest(self, limit: int | None) -> list[tuple[Message, list[Message], str]]:
        """The newest `limit` items (all with None), newest first: each item's first message, all its messages,
        and its whole content."""
        found: list[tuple[Message, list[Message], str]] = []
        parts: list[Message] = []  # the continuations read so far of the item being read, newest first
        cursor: str | None = None
        while limit is None or len(found) < limit:
            page, cursor = self.shelf.list_messages(self.owner, self.thread, limit=PAGE, cursor=cursor)
            for message in page:
                if message.content.startswith(PART_PREFIX):
                    parts.append(message)
                    continue
                rest = "".join(part.content[len(PART_PREFIX):] for part in reversed(parts))
                found.append((message, [message, *parts], message.content + rest))
                parts = []
                if limit is not None and len(found) == limit:
                    break
            if cursor is None:
                break
        return found

    def _add(self, items: list[Any]) -> None:
        """The items are kept all or none in one transaction on a Shelf. Through a Client they go in one request,
        or in several when they are more than a request takes, each holding whole items (whole_groups), so a failed
        request never leaves an item's head without its later parts."""
        ttl = {} if self.ttl is None else {"ttl": self.ttl}
        turns = [[{"role": role, "content": piece} for piece in _split(content)]
                 for item in items for role, content in (turn_of(item),)]
        for chunk in whole_groups(turns) if isinstance(self.shelf, Client) else [[t for ts in turns for t in ts]]:
            self.shelf.log_messages(self.owner, self.thread, chunk, **ttl)

    def _pop(self) -> Any | None:
        newest = self._newest(1)
        if not newest:
            return None
        head, messages, content = newest[0]
        self.shelf.forget_messages(self.owner, [message.id for message in messages])  # all its parts, or none
        return item_of(head.role, content)


def _split(content: str) -> list[str]:
    """A turn's content as messages: the first MAX_CONTENT_CHARS characters, then the rest in parts marked
    PART_PREFIX."""
    if len(content) <= MAX_CONTENT_CHARS:
        return [content]
    size = MAX_CONTENT_CHARS - len(PART_PREFIX)
    return [content[:MAX_CONTENT_CHARS]] + [PART_PREFIX + content[start:start + size]
                                            for start in range(MAX_CONTENT_CHARS, len(content), size)]


def turn_of(item: Any) -> tuple[str, str]:
    """The (role, content) a session item is logged as: a message with text as its role and text, anything else
    as JSON in a `tool` turn."""
    if isinstance(item, dict) and item.get("role") in ROLES and item.get("type", "message") == "message":
        content = item.get("content")
        if isinstance(content, str) and _plain(content):
            return item["role"], content
        if isinstance(content, list) and content and all(
                isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)
                for part in content):
            text = "".join(part["text"] for part in content)
            if _plain(text):
                return item["role"], text
    whole = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
    if not whole.isascii() and UNSTORABLE.search(whole):  # a lone surrogate (JSON escapes a NUL): escaped too
        whole = json.dumps(item, separators=(",", ":"))
    return "tool", ITEM_PREFIX + whole


def _plain(text: str) -> bool:
    """Whether a message's text can be kept as the text itself: not blank, not looking like a kept item or part,
    and holding nothing a message cannot (a NUL, a lone surrogate): such text is kept as JSON, which escapes it."""
    return bool(text.strip()) and not text.startswith((ITEM_PREFIX, PART_PREFIX)) and not UNSTORABLE.search(text)


def item_of(role: str, content: str) -> Any:
    """The session item a logged turn holds (an item cut short, by a write through a Client that failed half way,
    comes back as the text that was kept rather than breaking every later read)."""
    if content.startswith(ITEM_PREFIX):
        try:
            return json.loads(content[len(ITEM_PREFIX):])
        except ValueError:
            pass
    return {"role": role, "content": content}
