"""Record ids: a kind prefix and 16 random hex digits, e.g. m_3f9c0a1b2d4e5f60."""

from __future__ import annotations

import re
import secrets

_SHAPE = re.compile(r"[a-z]+_[0-9a-f]{16}")


def new_id(kind: str) -> str:
    return f"{kind}_{secrets.token_hex(8)}"


def new_ids(kind: str, count: int) -> list[str]:
    """`count` ids as new_id makes them, from one read of the system's randomness instead of one per id."""
    digits = secrets.token_hex(8 * count)
    return [f"{kind}_{digits[at:at + 16]}" for at in range(0, 16 * count, 16)]


def is_id(kind: str, value: object) -> bool:
    """Whether `value` has the shape new_id(kind) makes (imports accept no other ids)."""
    return isinstance(value, str) and value.startswith(f"{kind}_") and _SHAPE.fullmatch(value) is not None
