"""A question becomes a handful of search terms (spec 000)."""

from __future__ import annotations

import re

STOPWORDS = frozenset({
    "the", "and", "but", "for", "with", "you", "your", "was", "were", "are",
    "did", "does", "what", "when", "where", "who", "why", "how", "that",
    "this", "about", "have", "has", "had", "say", "said", "tell", "know",
    "can", "could", "would", "there", "then", "from", "into", "not", "get",
    "got", "please", "again", "any", "all", "its", "her", "his", "our",
})

# Letters and digits of any script: the spec's [a-z0-9]+ for ASCII text, without dropping "zürich" or "café".
_WORD = re.compile(r"[^\W_]+")

DEFAULT_LIMIT = 4


def keywords(line: str, limit: int | None = DEFAULT_LIMIT) -> list[str]:
    """Return the first `limit` distinct informative words of `line`, lower-cased, in order.

    Words shorter than three characters and stopwords are dropped. `limit=None` keeps them all.
    """
    out: list[str] = []
    for word in _WORD.findall(line.lower()):
        if len(word) < 3 or word in STOPWORDS or word in out:
            continue
        out.append(word)
    return out if limit is None else out[:limit]
