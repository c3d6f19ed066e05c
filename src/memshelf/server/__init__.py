"""`memshelf serve`: the HTTP API, the MCP endpoint at /mcp, and a small web page at /.

Thin by design: a route parses the request, takes the tenant from the API key and the user from the path, calls
one Shelf verb and formats the answer. No rule of the memory lives here; memshelf's exceptions become HTTP
statuses only at this edge, and every error body has one shape:

    {"error": {"type": "invalid_input", "message": "what is wrong, and what to do"}}

Limits (documented in the OpenAPI description): request bodies up to MAX_BODY_BYTES (1 MiB; imports
MAX_IMPORT_BYTES), `limit` 1..100 on search and 1..1000 on lists, and opaque `cursor`s for paging.

The modules, by role: errors (the edge's error mapping, a leaf the MCP endpoint imports too), middleware (key
check, body limit), schemas (request and response bodies), deps (dependencies and paging), routers/ (one module
per resource), proxy (the memory proxy in front of a chat API, with --upstream), workers (several processes, a
listening socket each) and app (create_app, serve).
The names below are loaded when first used, so importing `memshelf.server._errors` does not build the rest of the
server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import app_from_env as app_from_env, create_app as create_app, serve as serve
    from ._deps import MAX_LIST_LIMIT as MAX_LIST_LIMIT
    from ._middleware import MAX_BODY_BYTES as MAX_BODY_BYTES, MAX_IMPORT_BYTES as MAX_IMPORT_BYTES
    from ._schemas import (MAX_BATCH as MAX_BATCH, MAX_SEARCH_LIMIT as MAX_SEARCH_LIMIT,
                          SCRUB_PENDING_HEADER as SCRUB_PENDING_HEADER)

__all__ = ["MAX_BATCH", "MAX_BODY_BYTES", "MAX_IMPORT_BYTES", "MAX_LIST_LIMIT", "MAX_SEARCH_LIMIT",
           "SCRUB_PENDING_HEADER", "app_from_env", "create_app", "serve"]

_HOME = {"app_from_env": "_app", "create_app": "_app", "serve": "_app", "MAX_LIST_LIMIT": "_deps",
         "MAX_BODY_BYTES": "_middleware", "MAX_IMPORT_BYTES": "_middleware", "MAX_BATCH": "_schemas",
         "MAX_SEARCH_LIMIT": "_schemas", "SCRUB_PENDING_HEADER": "_schemas"}
"""The module of each exported name."""


def __getattr__(name: str) -> Any:
    """An exported name, imported from its module on first use (PEP 562)."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
