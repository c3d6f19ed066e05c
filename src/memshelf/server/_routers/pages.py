"""What needs no key: the liveness check and the web page at /."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

__all__ = ["router"]

router = APIRouter()

_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                                            "style-src 'unsafe-inline'; connect-src 'self'",
                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


@router.get("/health", tags=["health"])
def health() -> dict[str, str]:
    """Liveness; needs no key."""
    return {"status": "ok"}


@router.get("/", include_in_schema=False)
def web_page() -> HTMLResponse:
    html = resources.files("memshelf").joinpath("web/index.html").read_text(encoding="utf-8")
    return HTMLResponse(html, headers=_PAGE_HEADERS)
