"""The embedder protocol and the registry every provider, built in or a user's, registers with."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import DimensionMismatch, EmbedderError


class Embedder(ABC):
    """Turns text into vectors. One required method, `embed_batch`; everything else is built on it.

    `model` is the name stamped on every stored vector (provider-qualified, e.g. "ollama:nomic-embed-text"):
    vectors with different stamps are never compared.
    """

    model: str
    _dimensions: int | None = None

    @abstractmethod
    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Return a float32 array of shape (len(texts), dimensions), one row per text, in order.

        Raise EmbedderUnavailable when the service cannot be reached (refused, timeout, HTTP 5xx), so callers can
        fall back to keyword search; EmbedderError for anything a retry will not fix.
        """

    @property
    def dimensions(self) -> int:
        """Vector length. Providers that know it up front override this; the rest learn it from one call."""
        cached = self._dimensions
        if cached is None:
            cached = int(self.embed_batch(["dimensions"]).shape[1])
            self._dimensions = cached
        return cached

    def embed(self, text: str) -> np.ndarray:
        return self.embed_batch([text])[0]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.model}>"


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

_REGISTRY: dict[str, Factory] = {}


def register_embedder(provider: str, factory: Factory) -> None:
    """Make `Shelf.open(..., embedder="provider:model")` build embedders with `factory(model)`."""
    _REGISTRY[provider] = factory


def registered_providers() -> list[str]:
    return sorted(_REGISTRY)


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
    factory = _REGISTRY.get(provider.lower())
    if factory is None:
        known = ", ".join(registered_providers()) or "none"
        raise EmbedderError(
            f"unknown embedder provider {provider!r}; registered providers are {known}, or 'none'. "
            "Register your own with memshelf.register_embedder(name, factory)"
        )
    return factory(model or None)


def default_embedder_spec() -> str | None:
    """MEMSHELF_EMBEDDER if set; otherwise the offline local model when it is installed; otherwise none."""
    configured = os.environ.get("MEMSHELF_EMBEDDER")
    if configured is not None:
        return configured
    from .local import local_model_available

    return "local" if local_model_available() else None
