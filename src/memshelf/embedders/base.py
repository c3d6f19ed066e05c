"""The embedder protocol and the registry every provider, built in or a user's, registers with."""

from __future__ import annotations

import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence, Sized
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, DimensionMismatch, EmbedderError
from ._pieces import split_by_chars
from .._plugins import Availability, PluginGroup, Requirements, accepting, availability, find_provider, provider_names


class Embedder(ABC):
    """Turns text into vectors. One required method, `embed_batch`; everything else is built on it.

    `model` is the name stamped on every stored vector (provider-qualified, e.g. "ollama:nomic-embed-text"):
    vectors with different stamps are never compared.
    """

    model: str
    _dimensions: int | None = None
    window_chars: int | None = None
    """Longest text, in characters, that the model reads whole; a longer one is embedded in overlapping pieces
    (None: every text whole). A provider with the model's tokenizer at hand overrides `pieces` instead."""

    @abstractmethod
    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Return a float32 array of shape (len(texts), dimensions), one row per text, in order.

        Raise EmbedderUnavailable when the service cannot be reached (refused, timeout, HTTP 5xx), so callers can
        fall back to keyword search; EmbedderError for anything a retry will not fix. An embedder that calls a
        service should give up by the caller's deadline (`embedding_time_left()`); one that ignores it still works,
        without that bound.
        """

    @property
    def dimensions(self) -> int:
        """Vector length. Providers that know it up front override this; the rest learn it from one call."""
        cached = self._dimensions
        if cached is None:
            cached = int(embedded(self, ["dimensions"]).shape[1])
            self._dimensions = cached
        return cached

    def embed(self, text: str) -> np.ndarray:
        return embedded(self, [text])[0]

    def pieces(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text as overlapping pieces the model reads whole, in order; [text] when it fits the window. The
        first piece is the start of the text, which is what a model that truncates would have read."""
        window = self.window_chars
        return [[text] if window is None else split_by_chars(text, window) for text in texts]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.model}>"


def embedded(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """The embedder's vectors for `texts` as a float32 matrix, one row per text. Other libraries' embedders return
    lists of lists of floats, or a list of arrays; any sequence of equal-length vectors is accepted, and anything
    else is refused with what to return instead."""
    rows = embedder.embed_batch(texts)
    who = f"{type(embedder).__name__}.embed_batch"
    if isinstance(rows, Sized) and len(rows) != len(texts):
        raise EmbedderError(f"{who} returned {len(rows)} vectors for {len(texts)} texts: return exactly one vector "
                            "per text, in order")
    try:
        return as_matrix(rows, getattr(embedder, "model", who))
    except EmbedderError as exc:
        raise EmbedderError(f"{who} returned {type(rows).__name__}, not one vector per text: return a numpy array of "
                            "shape (len(texts), dimensions) or a list of equal-length lists of floats") from exc


def pieces_of(embedder: Embedder, texts: Sequence[str]) -> list[list[str]]:
    """The embedder's pieces of each text; a duck-typed embedder without `pieces` reads every text whole."""
    split = getattr(embedder, "pieces", None)
    return [[text] for text in texts] if split is None else split(texts)


def known_dimensions(embedder: Embedder) -> int | None:
    """The embedder's vector length if it is known without embedding anything: declared up front by the provider
    (it overrides `dimensions`, as the local model does) or learned from an earlier reply. None for a service that
    has not answered yet, so asking never waits for one."""
    declared = getattr(type(embedder), "dimensions", None)
    if declared is Embedder.dimensions or declared is None:
        cached = getattr(embedder, "_dimensions", None)
        return cached if isinstance(cached, int) else None
    value = embedder.dimensions
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---------------------------------------------------------------- deadlines
_DEADLINE: ContextVar[float | None] = ContextVar("memshelf_embedding_deadline", default=None)
WRITE_TIMEOUT = 3.0
"""Seconds a write (remember, remember_many, import) gives the embedding service before storing without vectors."""
SEARCH_TIMEOUT = 10.0
"""Seconds a search gives the embedding service before answering from keywords alone (degraded)."""
MAX_TIMEOUT = 86_400.0


@contextmanager
def embedding_deadline(seconds: float | None) -> Iterator[None]:
    """Every embedding request made inside the block must be done within `seconds` (wall clock over connecting,
    sending and every read), else it fails with EmbedderUnavailable. A nested block never extends an outer one:
    the earlier deadline wins. None adds no deadline. Thread- and async-safe (a context variable)."""
    if seconds is None:
        yield
        return
    deadline = time.monotonic() + seconds
    outer = _DEADLINE.get()
    token = _DEADLINE.set(deadline if outer is None else min(outer, deadline))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def embedding_time_left() -> float | None:
    """Seconds left before the current embedding deadline (zero or less once it has passed); None when there is
    none. An embedder that calls a service reads this to give up in time."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()


def write_timeout() -> float:
    """The write path's deadline for embedding: MEMSHELF_EMBED_WRITE_TIMEOUT, else WRITE_TIMEOUT."""
    return seconds_setting("MEMSHELF_EMBED_WRITE_TIMEOUT", WRITE_TIMEOUT)


def search_timeout() -> float:
    """A search's deadline for embedding the question: MEMSHELF_EMBED_SEARCH_TIMEOUT, else SEARCH_TIMEOUT."""
    return seconds_setting("MEMSHELF_EMBED_SEARCH_TIMEOUT", SEARCH_TIMEOUT)


def seconds_setting(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT:
        raise ConfigError(f"{name} must be a number of seconds above 0 and at most {MAX_TIMEOUT:g}, such as "
                          f"{default:g}; got {raw!r}")
    return seconds


def as_matrix(rows: object, model: str, expected: int | None = None) -> np.ndarray:
    """Check a provider's reply and turn it into a contiguous float32 matrix."""
    try:
        matrix = np.asarray(rows, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbedderError(f"{model} returned something that is not a list of vectors: check the model name") from exc
    if matrix.ndim != 2 or matrix.shape[1] == 0:
        raise EmbedderError(f"{model} returned vectors of shape {matrix.shape}: check that the model embeds text")
    if expected is not None and matrix.shape[1] != expected:
        raise DimensionMismatch(
            f"{model} returned {matrix.shape[1]}-d vectors but {expected}-d were expected: "
            "the server may be serving another model under that name"
        )
    return np.ascontiguousarray(matrix)


Factory = Callable[[str | None], Embedder]
"""Builds an embedder from the part after the colon in "provider:model" (None when absent)."""


@dataclass(frozen=True, slots=True)
class EmbedderProvider(Requirements):
    """What an entry point of the `memshelf.embedders` group names, and what `register_embedder` keeps.

    create: the factory, called with the model name (the part after the colon, or None).
    requires: modules the provider needs, looked up without importing them, so asking whether the provider is
        available stays cheap (it never loads torch).
    install: what to run when one of them is missing, e.g. "pip install 'memshelf[local]'".
    default: a candidate for the embedder used when none is configured (the first available one by name).

    A plugin may also name a bare factory (an Embedder subclass taking the model name will do); it is then
    always available and never the default.
    """

    create: Factory
    requires: tuple[str, ...] = ()
    install: str | None = None
    default: bool = False


_REGISTRY: dict[str, EmbedderProvider] = {}
"""Providers registered in code; they win over an entry point of the same name."""
_PLUGINS = PluginGroup("memshelf.embedders", "embedder", EmbedderError,
                       accepting(EmbedderProvider, "a factory taking the model name"))


def register_embedder(provider: str, factory: Factory | EmbedderProvider) -> None:
    """Make `Shelf.open(..., embedder="provider:model")` build embedders with `factory(model)`. A distribution
    offers a provider to every program instead through an entry point in the `memshelf.embedders` group."""
    _REGISTRY[provider.lower()] = factory if isinstance(factory, EmbedderProvider) else EmbedderProvider(factory)


def registered_providers() -> list[str]:
    """Every provider name: registered in code or declared by an installed distribution (none is loaded)."""
    return provider_names(_REGISTRY, _PLUGINS)


def embedder_provider(name: str) -> EmbedderProvider | None:
    """The provider of that name, a registration in code first, then an entry point (loaded on first use)."""
    return find_provider(_REGISTRY, _PLUGINS, name)


def resolve_embedder(spec: object) -> Embedder | None:
    """Turn what the user passed (None, "none", "local", "ollama:nomic-embed-text", an Embedder) into an embedder."""
    if spec is None:
        return None
    if isinstance(spec, Embedder):
        return spec
    if hasattr(spec, "embed_batch") and hasattr(spec, "model"):
        return spec  # type: ignore[return-value]  # duck-typed embedders are welcome
    if not isinstance(spec, str):
        raise EmbedderError(f"embedder must be a name like 'local' or an Embedder, got {type(spec).__name__}")
    name = spec.strip()
    if name.lower() in ("", "none", "off", "keyword"):
        return None
    provider, _, model = name.partition(":")
    found = embedder_provider(provider)
    if found is None:
        known = ", ".join(registered_providers()) or "none"
        raise EmbedderError(
            f"unknown embedder provider {provider!r}; registered providers are {known}, or 'none'. "
            "Register your own with memshelf.register_embedder(name, factory), or install a distribution "
            f"that declares it in the 'memshelf.embedders' entry point group{_PLUGINS.missing_own_hint()}"
        )
    problem = _unavailable(provider.lower(), found)
    if problem is not None:
        raise EmbedderError(problem)
    return found.create(model or None)


def _unavailable(name: str, provider: EmbedderProvider) -> str | None:
    """Why the provider cannot be used here (what is missing and how to install it), or None when it can."""
    missing = provider.missing()
    if not missing:
        return None
    needs = " and ".join(missing)
    return (f"the {name} embedder needs {needs}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            f"{provider.install or 'install ' + needs}, or choose another embedder (or 'none' for keyword search only)")


def embedder_availability() -> list[Availability]:
    """Every embedder provider, where it comes from, and whether it can be used here (`memshelf providers`)."""
    return availability(registered_providers(), _REGISTRY, _PLUGINS, embedder_provider,
                        lambda name, found: _unavailable(name, found) or "")


def default_embedder_spec() -> str | None:
    """MEMSHELF_EMBEDDER if set; otherwise the first available provider (by name) that declares itself a default,
    which among the built-ins is the offline local model when it is installed; otherwise none."""
    configured = os.environ.get("MEMSHELF_EMBEDDER")
    if configured is not None:
        return configured
    for name in registered_providers():
        found = embedder_provider(name)
        if found is not None and found.default and found.available:
            return name
    return None
