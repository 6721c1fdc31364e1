"""The browser page at ``/`` (``index.html``) and its static files under ``/web`` (plain JS, no build step)."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

WEB_DIR = Path(__file__).resolve().parent


async def index(request: Request) -> Response:
    # no-cache: a page left open across a server upgrade must not keep stale JS
    return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def routes() -> list[BaseRoute]:
    """``Route`` matches only HTTP scopes, so a WebSocket upgrade at ``/`` still reaches the OpenPI socket."""
    return [
        Route("/", index, methods=["GET", "HEAD"]),
        Mount("/web", StaticFiles(directory=WEB_DIR), name="web"),
    ]
