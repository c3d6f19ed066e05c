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
JSON in a `tool` turn and comes back exactly. The shelf may be a Shelf or a memshelf.Client; its calls run in a
worker thread, so the event loop never waits on the database.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents.memory.session_settings import SessionSettings, resolve_session_limit

from ..model import ROLES, Message, Owner

__all__ = ["ITEM_PREFIX", "ShelfSession"]

ITEM_PREFIX = "memshelf-agents-item:"
"""How a `tool` turn that holds a whole SDK item as JSON begins (a person's text never does)."""
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
        newest_first: list[Message] = []
        cursor: str | None = None
        while limit is None or len(newest_first) < limit:
            size = PAGE if limit is None else min(PAGE, limit - len(newest_first))
            page, cursor = self.shelf.list_messages(self.owner, self.thread, limit=size, cursor=cursor)
            newest_first += page
            if cursor is None:
                break
        return [item_of(m.role, m.content) for m in reversed(newest_first)]

    def _add(self, items: list[Any]) -> None:
        ttl = {} if self.ttl is None else {"ttl": self.ttl}
        for item in items:
            role, content = turn_of(item)
            self.shelf.log_message(self.owner, self.thread, role, content, **ttl)

    def _pop(self) -> Any | None:
        newest, _ = self.shelf.list_messages(self.owner, self.thread, limit=1)
        if not newest:
            return None
        self.shelf.forget_message(self.owner, newest[0].id)
        return item_of(newest[0].role, newest[0].content)


def turn_of(item: Any) -> tuple[str, str]:
    """The (role, content) a session item is logged as: a message with text as its role and text, anything else
    as JSON in a `tool` turn."""
    if isinstance(item, dict) and item.get("role") in ROLES and item.get("type", "message") == "message":
        content = item.get("content")
        if isinstance(content, str) and content.strip() and not content.startswith(ITEM_PREFIX):
            return item["role"], content
        if isinstance(content, list) and content and all(
                isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)
                for part in content):
            text = "".join(part["text"] for part in content)
            if text.strip() and not text.startswith(ITEM_PREFIX):
                return item["role"], text
    return "tool", ITEM_PREFIX + json.dumps(item, ensure_ascii=False, separators=(",", ":"))


def item_of(role: str, content: str) -> Any:
    """The session item a logged turn holds."""
    if content.startswith(ITEM_PREFIX):
        return json.loads(content[len(ITEM_PREFIX):])
    return {"role": role, "content": content}
