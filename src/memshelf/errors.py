"""memshelf's exceptions. Every message says what went wrong and what to do next."""

from __future__ import annotations


class MemshelfError(Exception):
    """Base class of every error memshelf raises on purpose."""


class InvalidInput(MemshelfError, ValueError):
    """The caller passed something memshelf cannot store or search with."""


class UnknownSource(InvalidInput):
    """A memory named a source whose confidence was never declared."""


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
