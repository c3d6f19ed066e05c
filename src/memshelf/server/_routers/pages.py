"""What needs no key: the liveness check, the web page at /, and the API's documentation at /docs and /redoc.

The documentation pages load Swagger UI and ReDoc from the `fastapi-offline` package's files, served here, so they
work without internet (FastAPI's defaults fetch them from a CDN)."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from .._deps import WorkerRoute

__all__ = ["router"]

router = APIRouter(route_class=WorkerRoute)

_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                                            "style-src 'unsafe-inline'; connect-src 'self'",
                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
_DOCS_HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline' blob:; "
                                            "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                                            "worker-src 'self' blob:; connect-src 'self'",
                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
"""Nothing from elsewhere: ReDoc shows a logo from its CDN, which the browser now does not even ask for."""
_ASSETS = "/docs/assets/"
_ASSET_TYPES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
                "redoc.standalone.js": "text/javascript", "favicon.png": "image/png"}


@router.get("/health", tags=["health"])
def health() -> dict[str, str]:
    """Liveness; needs no key."""
    return {"status": "ok"}


@router.get("/", include_in_schema=False)
def web_page() -> HTMLResponse:
    html = resources.files("memshelf").joinpath("web/index.html").read_text(encoding="utf-8")
    return HTMLResponse(html, headers=_PAGE_HEADERS)


def _root(request: Request) -> str:
    """The prefix the app is served under (behind a proxy that strips it), so asset links resolve."""
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get("/docs", include_in_schema=False)
def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    page = get_swagger_ui_html(openapi_url=root + str(request.app.openapi_url), title="memshelf API",
                               swagger_js_url=f"{root}{_ASSETS}swagger-ui-bundle.js",
                               swagger_css_url=f"{root}{_ASSETS}swagger-ui.css",
                               swagger_favicon_url=f"{root}{_ASSETS}favicon.png")
    page.headers.update(_DOCS_HEADERS)
    return page


@router.get("/redoc", include_in_schema=False)
def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    page = get_redoc_html(openapi_url=root + str(request.app.openapi_url), title="memshelf API",
                          redoc_js_url=f"{root}{_ASSETS}redoc.standalone.js",
                          redoc_favicon_url=f"{root}{_ASSETS}favicon.png", with_google_fonts=False)
    page.headers.update(_DOCS_HEADERS)
    return page


@router.get(_ASSETS + "{name}", include_in_schema=False)
def docs_asset(name: str) -> Response:
    if name not in _ASSET_TYPES:
        raise HTTPException(404, f"no documentation asset {name!r}")
    body = resources.files("fastapi_offline").joinpath("static", name).read_bytes()
    return Response(body, media_type=_ASSET_TYPES[name], headers={"Cache-Control": "public, max-age=86400"})
