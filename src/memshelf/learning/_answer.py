"""Reading a model's answer: its JSON is validated with pydantic, item by item, and turned into proposals.

Imported only when a model-backed extractor reads an answer, so `import memshelf` never needs pydantic. Two kinds
of failure, treated differently:
- the answer as a whole is unusable (not JSON, not an object with a "proposals" list): `BadAnswer`, and the
  extractor asks once more with what was wrong;
- one item is unusable (a missing field, an op that needs what it lacks, evidence that names turns not given or
  no turn of the user's): that item becomes a "skip" proposal saying why, and the valid items stand.
Every proposal's source is "inferred", whatever the model says.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .base import Proposal

SOURCE = "inferred"
MAX_REASON_CHARS = 300
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL | re.IGNORECASE)

NEEDS: dict[str, tuple[str, ...]] = {
    "remember": ("topic", "content"),
    "set_fact": ("key", "value"),
    "supersede": ("topic", "content", "replaces"),
    "skip": (),
}
"""The fields each op must fill."""


class BadAnswer(Exception):
    """The answer as a whole cannot be used; the message says why, in words the model can act on."""


class Item(BaseModel):
    """One proposal as the model writes it. Unknown fields (a "source", say) are ignored."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    op: Literal["remember", "set_fact", "supersede", "skip"]
    topic: str | None = None
    content: str | None = None
    key: str | None = None
    value: str | None = None
    replaces: str | None = None
    evidence: list[str] = Field(default_factory=list)
    reason: str | None = None

    @field_validator("key")
    @classmethod
    def _snake_case(cls, key: str | None) -> str | None:
        return None if key is None else re.sub(r"[\s-]+", "_", key.lower())

    @model_validator(mode="after")
    def _has_what_its_op_needs(self) -> Item:
        missing = [name for name in NEEDS[self.op] if not getattr(self, name)]
        if missing:
            raise ValueError(f"op {self.op!r} needs {' and '.join(missing)}")
        if self.op != "skip" and not self.evidence:
            raise ValueError("evidence is empty: list the ids of the user's turns it comes from")
        return self


class Transcript:
    """The turns as the model sees them: each has a label (its message id, or "turn-N" for a turn given without
    one), and the label leads back to the id that becomes evidence and to the role that may be evidence."""

    def __init__(self, turns: Sequence[Any]) -> None:
        self.turns = list(turns)
        self.labels = [turn.id or f"turn-{index}" for index, turn in enumerate(self.turns, 1)]
        self.id_of: dict[str, str | None] = {label: turn.id for label, turn in zip(self.labels, self.turns)}
        self.role_of: dict[str, str] = {label: turn.role for label, turn in zip(self.labels, self.turns)}

    def as_data(self) -> list[dict[str, str | None]]:
        return [{"id": label, "role": turn.role, "at": turn.at.isoformat() if turn.at else None,
                 "content": turn.content} for label, turn in zip(self.labels, self.turns)]


def items_of(text: str) -> list[Any]:
    """The "proposals" list of an answer, or BadAnswer saying what is wrong with it."""
    fenced = _FENCE.match(text or "")
    try:
        body = json.loads(fenced.group(1) if fenced else text)
    except ValueError as exc:
        raise BadAnswer(f"the answer is not valid JSON ({exc})") from None
    if not isinstance(body, Mapping):
        raise BadAnswer(f'the answer must be a JSON object {{"proposals": [...]}}, not a {type(body).__name__}')
    items = body.get("proposals")
    if not isinstance(items, list):
        raise BadAnswer('the answer has no "proposals" list: answer {"proposals": [...]}, an empty list when '
                        "there is nothing to learn")
    return items


def proposals_from(text: str, transcript: Transcript) -> list[Proposal]:
    """Every item of the answer as a proposal: valid ones as proposed, the rest as skips that say why."""
    return [_proposal(number, item, transcript) for number, item in enumerate(items_of(text), 1)]


def _proposal(number: int, raw: Any, transcript: Transcript) -> Proposal:
    try:
        item = Item.model_validate(raw)
    except ValidationError as exc:
        return _rejected(number, raw, problems(exc))
    unknown = [label for label in item.evidence if label not in transcript.id_of]
    if unknown:
        return _rejected(number, raw, f"its evidence names turns that were not given: {', '.join(unknown)}")
    if item.op != "skip" and not any(transcript.role_of[label] == "user" for label in item.evidence):
        return _rejected(number, raw, "its evidence holds none of the user's own turns (assistant, tool and system "
                                      "turns are context, never evidence about the user)")
    evidence = tuple(dict.fromkeys(i for i in (transcript.id_of[label] for label in item.evidence) if i))
    return Proposal(item.op, SOURCE, evidence, topic=item.topic, content=item.content, key=item.key,
                    value=item.value, replaces=item.replaces, reason=_short(item.reason or "proposed by the model"))


def _rejected(number: int, raw: Any, why: str) -> Proposal:
    """An invalid item, kept as a skip so the plan lists it with what was wrong."""
    fields = raw if isinstance(raw, Mapping) else {}
    text = {name: fields.get(name) if isinstance(fields.get(name), str) else None
            for name in ("topic", "content", "key", "value", "replaces")}
    return Proposal("skip", SOURCE, (), **text, reason=_short(f"the model's proposal {number} was rejected: {why}"))


def problems(exc: ValidationError) -> str:
    """pydantic's errors in one line: where, and what is wrong."""
    return "; ".join(f"{'.'.join(str(part) for part in error['loc']) or 'item'}: {error['msg']}"
                     for error in exc.errors())


def _short(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."
