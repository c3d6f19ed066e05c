"""The prompt boundary (spec 000): facts always, knowledge only when the question matches something."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from .model import Fact, Hit

KNOWLEDGE_HEADER = "Relevant knowledge (confidence in brackets, 1.0 means the user said so):"
FACTS_HEADER = "Known facts about the user:"
MEMORY_HEADER = "Memory context:"

DEFAULT_BUDGET_CHARS = 4_000
"""Characters that memshelf may add to a prompt (facts and knowledge together, headers included)."""


def _within(header: str, lines: Sequence[str], budget: int) -> tuple[str, int]:
    """The header and as many whole lines as fit in `budget` characters, in order; "" when no line fits."""
    used = len(header)
    kept: list[str] = []
    for line in lines:
        cost = 1 + len(line)  # the newline before it
        if used + cost > budget:
            continue  # a line that does not fit is left out whole; a shorter later one may still fit
        kept.append(line)
        used += cost
    if not kept:
        return "", 0
    return "\n".join([header, *kept]), used


def fact_line(fact: Fact, confirmed: Collection[str] | None = None) -> str:
    """`  - key: value`, marked `(unconfirmed: <source>)` when its source is not in `confirmed` (None: all are), so a
    prompt never presents a guess as a known fact."""
    line = f"  - {fact.key}: {fact.value}"
    return line if confirmed is None or fact.source in confirmed else f"{line} (unconfirmed: {fact.source})"


def facts_block(facts: Sequence[Fact], budget: int = DEFAULT_BUDGET_CHARS,
                confirmed: Collection[str] | None = None) -> str:
    """`Known facts about the user:` and one line per fact (fact_line), most recent first."""
    return _within(FACTS_HEADER, [fact_line(f, confirmed) for f in facts], budget)[0]


def knowledge_block(hits: Sequence[Hit], budget: int = DEFAULT_BUDGET_CHARS) -> str:
    """The `Relevant knowledge (...)` block in the order given, or "" when there is nothing to say."""
    lines = [f"  - [{h.memory.confidence:.1f}] {h.memory.content}" for h in hits]
    return _within(KNOWLEDGE_HEADER, lines, budget)[0]


def assemble(base_prompt: str, facts: Sequence[Fact], hits: Sequence[Hit],
             budget: int = DEFAULT_BUDGET_CHARS, confirmed: Collection[str] | None = None) -> str:
    """base prompt, then `Memory context:` with the facts, then knowledge; blocks separated by a blank line.

    Facts come first in the budget (they travel with every call); knowledge gets what is left. Facts whose source
    is not in `confirmed` (the sources worth as much as `stated`) are marked unconfirmed.
    """
    parts = [base_prompt] if base_prompt.strip() else []  # no base prompt: the block starts the text
    memory = facts_block(facts, budget - len(MEMORY_HEADER) - 3, confirmed)
    spent = 0
    if memory:
        parts.append(f"{MEMORY_HEADER}\n{memory}")
        spent = len(parts[-1]) + 2
    knowledge = knowledge_block(hits, budget - spent - 2)
    if knowledge:
        parts.append(knowledge)
    return "\n\n".join(parts)
