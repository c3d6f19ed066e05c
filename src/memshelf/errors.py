"""memshelf's exceptions. Every message says what went wrong and what to do next.

What to do depends on where the reader is: a Python caller opens the shelf with other arguments, a CLI user passes
an option, an HTTP client calls another endpoint, a model calls another tool. So an error whose remedy is an action
of that kind carries a `fix` (one of FIXES) beside its message, and each face says it in its own terms with
`in_terms()`; `str(error)` is the whole message in the library's terms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

FIXES = ("memory_id", "message_id", "fact_key", "key_id", "source", "embedder", "backfill")
"""What an error's `fix` may name: the id to check (a memory's, a message's, a fact's key, an API key's), the
source to declare, the embedder to configure, the backfill to run."""


class MemshelfError(Exception):
    """Base class of every error memshelf raises on purpose.

    problem: what went wrong; advice: what to do, in the library's terms; fix: the kind of remedy (FIXES), for the
    faces that say it otherwise; subject: the name the remedy is about (the undeclared source); after: what follows
    the advice ("; nothing was imported")."""

    def __init__(self, problem: str = "", advice: str | None = None, *, fix: str | None = None,
                 subject: str | None = None, after: str = "") -> None:
        self.problem, self.advice, self.fix, self.subject, self.after = problem, advice, fix, subject, after
        super().__init__(self._told(advice))

    def _told(self, advice: str | None) -> str:
        return f"{self.problem}: {advice}{self.after}" if advice else f"{self.problem}{self.after}"

    def in_terms(self, advice: Mapping[str, str], **names: str) -> str:
        """The message with its advice said as a face says it: `advice` maps a fix to a template that may use
        {subject} and the `names` the face knows (an HTTP route's {user}); an error without one stays as it is."""
        template = advice.get(self.fix or "")
        if template is None:
            return str(self)
        return self._told(template.format(subject=self.subject, **names))

    def within(self, before: str, after: str = "") -> Self:
        """The same error as the step of a larger one ("import record 3: ..."), its fix kept for the faces."""
        return type(self)(before + self.problem, self.advice, fix=self.fix, subject=self.subject,
                          after=self.after + after)


class InvalidInput(MemshelfError, ValueError):
    """The caller passed something memshelf cannot store or search with."""


class UnknownSource(InvalidInput):
    """A memory named a source whose confidence was never declared."""


class Conflict(InvalidInput):
    """The record is in a state the call cannot apply to (confirming a superseded memory): nothing was changed."""


class NotFound(MemshelfError, LookupError):
    """No record with that id belongs to this owner (it may belong to nobody, or to someone else)."""


class EmbedderUnavailable(MemshelfError):
    """The embedding service could not be reached or answered with an error (refused, timeout, 5xx)."""


class EmbedderError(MemshelfError):
    """The embedder is misconfigured or answered with something unusable (unknown provider, bad reply)."""


class DimensionMismatch(MemshelfError):
    """A vector's length does not match the model it is stamped with or compared against."""


class StoreError(MemshelfError):
    """The storage backend failed; the original error is chained as __cause__."""


class StoreUnavailable(StoreError):
    """The store cannot serve this call now (the file is locked by another writer, the server is out of reach):
    nothing was written, and the same call can succeed when retried."""


class ConfigError(MemshelfError):
    """A setting (argument or MEMSHELF_* variable) cannot be used."""


class ExtractorError(MemshelfError):
    """The extractor is misconfigured or answered with something unusable (unknown name, bad reply)."""


class ExtractorUnavailable(ExtractorError):
    """The extractor's model service could not answer now (refused, timeout, HTTP 429 or 5xx): nothing was
    learned, the thread's watermark did not move, and the same call can succeed when retried."""
