"""Record ids: a kind prefix and 16 random hex digits, e.g. m_3f9c0a1b2d4e5f60."""

from __future__ import annotations

import secrets


def new_id(kind: str) -> str:
    return f"{kind}_{secrets.token_hex(8)}"
