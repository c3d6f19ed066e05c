"""Learning from conversations: the extractor protocol, its registry, and the built-in `rules` extractor.

An extractor proposes; it never writes. `rules` is found like a user's plugin: through the `memshelf.extractors`
entry point group declared in memshelf's pyproject.toml, as are `ollama` and `openai`, the model-backed ones.
Nothing here imports a model, nor pydantic (the model extractors import it when they read an answer).
"""

from __future__ import annotations

from .base import (DEFAULT_EXTRACTOR, OPS, Extractor, ExtractorProvider, Known, Plan, Proposal, Turn, Usage,
                   default_extractor_spec,
                   extractor_provider, register_extractor, registered_extractors, resolve_extractor)
from .ollama import OllamaExtractor
from .openai import OpenAIExtractor
from .rules import RULES, Rule, RulesExtractor

__all__ = [
    "DEFAULT_EXTRACTOR",
    "OPS",
    "RULES",
    "Extractor",
    "ExtractorProvider",
    "Known",
    "OllamaExtractor",
    "OpenAIExtractor",
    "Plan",
    "Proposal",
    "Rule",
    "RulesExtractor",
    "Turn",
    "Usage",
    "default_extractor_spec",
    "extractor_provider",
    "register_extractor",
    "registered_extractors",
    "resolve_extractor",
]
