"""The routes of the HTTP API, one module per resource. A new resource is a module here with a `router`, listed
in ROUTERS; create_app includes them in this order."""

from __future__ import annotations

from fastapi import APIRouter

from . import admin, facts, learning, memories, messages, pages, retrieval, users

__all__ = ["ROUTERS"]

ROUTERS: tuple[APIRouter, ...] = (pages.router, memories.router, retrieval.router, facts.router, messages.router,
                                  learning.router, users.router, admin.router)
