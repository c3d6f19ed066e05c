"""The app: `create_app` puts the routers, the error handlers, the middleware and the MCP endpoint together;
`serve` runs it with uvicorn, in one process or several (`app_from_env` is what each worker builds)."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any
from collections.abc import AsyncIterator, Callable, Iterator, Mapping

from fastapi import FastAPI
from starlette.routing import Match, Route
from starlette.types import Scope

from ..errors import ConfigError
from ..shelf import Shelf
from ._deps import MAX_LIST_LIMIT
from ._errors import ERROR_RESPONSES, install_error_handlers
from ._middleware import MAX_BODY_BYTES, MAX_IMPORT_BYTES, ApiKeyAuth, BodyLimit, EncodedSlashes, body_limit_for
from ._proxy import UPSTREAM_ENV, Upstream, proxy_router
from ._routers import ROUTERS
from ._schemas import DECLARED_SOURCES, MAX_BATCH, MAX_SEARCH_LIMIT
from ._workers import reuse_port_spreads, serve_workers

if TYPE_CHECKING:
    from ..mcp import McpEndpoint

__all__ = ["DESCRIPTION", "USER_HEADER", "app_from_env", "create_app", "serve"]

USER_HEADER = "X-Memshelf-User"
_UNSET: Any = object()

DESCRIPTION = f"""
memshelf's HTTP API. Every `/v1` request carries an API key (`Authorization: Bearer <key>` or `X-API-Key`);
the tenant always comes from the key, the user from the path. Admin keys (no tenant) only reach `/v1/admin`.

Errors are `{{"error": {{"type": ..., "message": ...}}}}`. Limits: bodies up to {MAX_BODY_BYTES >> 20} MiB
(imports {MAX_IMPORT_BYTES >> 20} MiB), search `limit` 1..{MAX_SEARCH_LIMIT}, list `limit` 1..{MAX_LIST_LIMIT},
batches up to {MAX_BATCH} memories. Lists are paged: pass `next_cursor` back as `cursor`.

MCP (streamable HTTP) is at `/mcp`, one POST per message: the same key, and the user in the `{USER_HEADER}` header
(or `?user=`; the header wins when both are sent).
"""


def create_app(shelf: Shelf | Callable[[], Shelf] | None = None, *, target: str | None = None,
               embedder: Any = _UNSET, sources: Mapping[str, float] | None = None, mcp: bool = True,
               upstream: str | None = None) -> FastAPI:
    """The FastAPI app. `shelf` is a Shelf (the caller closes it) or a factory; without one, the app opens
    `Shelf.open(target, embedder=embedder, sources=sources)` with Shelf.open's defaults for what is not given
    (MEMSHELF_DATABASE_URL or MEMSHELF_DB, MEMSHELF_EMBEDDER, MEMSHELF_SOURCES) and closes it at shutdown.
    upstream (else MEMSHELF_UPSTREAM): an OpenAI-compatible chat API's base URL, which turns on the memory proxy
    (`POST /v1/chat/completions`, `GET /v1/models`; server/_proxy.py)."""
    proxied = Upstream.from_env(upstream)  # checked before anything is opened
    owned = not isinstance(shelf, Shelf)
    opened = shelf if isinstance(shelf, Shelf) else (shelf or _opener(target, embedder, sources))()
    mcp_endpoint = _mcp_endpoint(opened) if mcp else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if mcp_endpoint is not None:
                await stack.enter_async_context(mcp_endpoint.running())
            try:
                yield
            finally:
                if proxied is not None:
                    await proxied.close()
                if owned:
                    opened.close()

    app = FastAPI(title="memshelf", version=_version(), description=DESCRIPTION, lifespan=lifespan,
                  responses=ERROR_RESPONSES, docs_url=None, redoc_url=None)  # served offline by the pages router
    app.state.shelf = opened
    app.openapi = _openapi_naming_sources(app, list(opened.sources))  # type: ignore[method-assign]
    install_error_handlers(app, lambda scope: _methods_at(app, scope))
    if proxied is not None:  # first: a chat request then skips matching every other route (0.1 ms)
        app.include_router(proxy_router(proxied, opened))
    for router in ROUTERS:
        app.include_router(router)
    if mcp_endpoint is not None:
        app.router.routes.append(Route("/mcp", mcp_endpoint, include_in_schema=False))  # an ASGI app: any method
    app.add_middleware(BodyLimit, limit_for=body_limit_for)
    app.add_middleware(ApiKeyAuth, shelf=opened)
    app.add_middleware(EncodedSlashes)  # outermost: the key check and the body limit see the path routed
    return app


def _openapi_naming_sources(app: FastAPI, sources: list[str]) -> Callable[[], dict[str, Any]]:
    """app.openapi, with the sources this server declares as the enum of every `source` a request names (a Python
    model cannot list them: they are declared when the Shelf opens)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            for model in generate().get("components", {}).get("schemas", {}).values():
                field = model.get("properties", {}).get("source", {})
                if field.pop(DECLARED_SOURCES, False):
                    field["enum"] = sources
        return app.openapi_schema  # type: ignore[return-value]

    return openapi


def _methods_at(app: FastAPI, scope: Scope) -> set[str]:
    """The methods the routes at this request's path take (the app's own and those of ROUTERS)."""
    routes = [*app.router.routes, *(route for router in ROUTERS for route in router.routes)]
    return {method for route in routes if isinstance(route, Route) and route.methods
            and route.matches(scope)[0] is not Match.NONE for method in route.methods}


def _opener(target: str | None, embedder: Any, sources: Mapping[str, float] | None) -> Callable[[], Shelf]:
    if embedder is _UNSET:
        return lambda: Shelf.open(target, sources=sources)
    return lambda: Shelf.open(target, embedder=embedder, sources=sources)


def _version() -> str:
    from .. import __version__

    return __version__


def _mcp_endpoint(shelf: Shelf) -> McpEndpoint:
    from ..mcp import McpEndpoint

    return McpEndpoint(shelf)


def app_from_env() -> FastAPI:
    """The app each `memshelf serve` worker process builds for itself, configured by MEMSHELF_* variables
    (MEMSHELF_DATABASE_URL or MEMSHELF_DB; MEMSHELF_EMBEDDER; MEMSHELF_SOURCES), which Shelf.open reads."""
    return create_app()


def serve(host: str = "127.0.0.1", port: int = 8000, workers: int = 1, db: str | None = None,
          embedder: str | None = None, log_level: str | None = None, access_log: bool | None = None,
          sources: Mapping[str, float] | None = None, upstream: str | None = None) -> None:
    """Run the HTTP server (blocks). With several workers each process opens its own Shelf on the same database
    (SQLite in WAL mode, or PostgreSQL) and, on Linux, listens on a socket of its own (server/_workers.py).
    log_level and access_log default to MEMSHELF_LOG_LEVEL (info) and MEMSHELF_ACCESS_LOG (1; 0 turns the
    per-request log lines off). The caller's os.environ is left as it was."""
    import uvicorn

    if workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    level = log_level or os.environ.get("MEMSHELF_LOG_LEVEL", "info")
    if access_log is None:
        access_log = os.environ.get("MEMSHELF_ACCESS_LOG", "1").strip().lower() not in ("0", "false", "no", "off")
    options: dict[str, Any] = {"host": host, "port": port, "log_level": level.lower(), "access_log": access_log,
                               "proxy_headers": False}
    if workers == 1:  # one process: the app is built here and given its settings directly
        uvicorn.run(create_app(target=db, embedder=_UNSET if embedder is None else embedder, sources=sources,
                               upstream=upstream), **options)
        return
    # other processes learn the settings from the environment
    with _environ(_worker_settings(db, embedder, sources, upstream)):
        if reuse_port_spreads():  # each worker gets a socket of its own, so the load is spread (server/_workers.py)
            serve_workers(options, workers)
        else:
            uvicorn.run("memshelf.server:app_from_env", factory=True, workers=workers, **options)


def _worker_settings(db: str | None, embedder: str | None, sources: Mapping[str, float] | None = None,
                     upstream: str | None = None) -> dict[str, str | None]:
    """The MEMSHELF_* variables that tell each worker process what serve() was told (None: unset it)."""
    settings: dict[str, str | None] = {}
    if db is not None:
        url = "://" in db
        settings |= {"MEMSHELF_DATABASE_URL": db if url else None, "MEMSHELF_DB": None if url else db}
    if embedder is not None:
        settings["MEMSHELF_EMBEDDER"] = embedder
    if sources is not None:
        settings["MEMSHELF_SOURCES"] = ",".join(f"{name}={worth}" for name, worth in sources.items())
    if upstream is not None:
        settings[UPSTREAM_ENV] = upstream
    return settings


@contextlib.contextmanager
def _environ(settings: dict[str, str | None]) -> Iterator[None]:
    """os.environ with `settings` applied while the block runs, then exactly as it was before."""
    saved = {name: os.environ.get(name) for name in settings}
    try:
        for name, value in settings.items():
            _set_env(name, value)
        yield
    finally:
        for name, value in saved.items():
            _set_env(name, value)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
