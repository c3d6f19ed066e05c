"""Long texts in overlapping pieces: an embedding model reads a window of tokens and ignores the rest, so a memory
longer than the window is embedded piece by piece, and search by meaning sees all of it (README, "Long memories").

The pieces are windows over units (the local model's word pieces, or characters where no tokenizer is at hand),
cut at word boundaries where one is near, each sharing OVERLAP of its window with the next, so a sentence cut by
one piece's end is read whole by the next piece.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..errors import ConfigError

OVERLAP = 0.25
"""The share of a window that a piece repeats of the piece before it."""
CHARS_PER_TOKEN = 2
"""Characters per token assumed where the model's tokenizer is not at hand: half of English prose's usual four, so
that text dense in digits, code or accents still fits the model's window (a conservative proxy)."""
DEFAULT_WINDOW_TOKENS = 512
"""The window assumed for a model not in its provider's table: the smallest of the common embedding models'."""
WINDOW_ENV = "MEMSHELF_EMBED_WINDOW_TOKENS"


def windows(size: int, window: int, boundary: Callable[[int], bool]) -> list[tuple[int, int]]:
    """[start, end) spans of at most `window` units covering units 0..size, each repeating about OVERLAP of the one
    before. A cut goes to the nearest place `boundary(p)` allows (a word starts at unit p) within half a window,
    else where the window ends."""
    overlap = int(window * OVERLAP)
    spans: list[tuple[int, int]] = []
    start = 0
    while True:
        end = min(start + window, size)
        if end < size:
            end = next((p for p in range(end, start + window // 2, -1) if boundary(p)), end)
        spans.append((start, end))
        if end >= size:
            return spans
        ahead = end - overlap
        start = max(next((p for p in range(ahead, end) if boundary(p)), ahead), start + 1)


def split_by_chars(text: str, window_chars: int) -> list[str]:
    """The text in overlapping pieces of at most `window_chars` characters, cut after whitespace where possible."""
    if len(text) <= window_chars:
        return [text]
    spans = windows(len(text), window_chars, lambda p: text[p - 1].isspace() and not text[p].isspace())
    return [text[start:end] for start, end in spans]


def window_tokens(model: str, known: dict[str, int], given: int | None) -> int:
    """A provider model's window in tokens: `given` (the embedder's argument), else MEMSHELF_EMBED_WINDOW_TOKENS,
    else the provider's table by model name (any ":tag" ignored), else DEFAULT_WINDOW_TOKENS."""
    where, value = "window_tokens", given
    if value is None and os.environ.get(WINDOW_ENV, "").strip():
        where, raw = WINDOW_ENV, os.environ[WINDOW_ENV].strip()
        value = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 9 else 0
    if value is None:
        return known.get(model.split(":")[0].lower(), DEFAULT_WINDOW_TOKENS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 16:
        raise ConfigError(f"{where} must be the model's input window in tokens, a whole number of at least 16 "
                          f"(e.g. 512), got {given if where == 'window_tokens' else os.environ[WINDOW_ENV]!r}")
    return value
