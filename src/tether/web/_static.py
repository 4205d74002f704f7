"""The dashboard's stylesheet, script and icon, served from the package (``web/static``)
by routes of the router itself, so they load under any prefix, in mounted mode too, and
with no network beyond the dashboard's own server.

Each asset has a fixed path (``/static/<name>``): the standalone server lets exactly these
paths through without a session (the login page needs its stylesheet; the files are the
same in every installation and hold nothing secret). Pages link them with ``?v=<digest>``,
so a browser may cache them for good and still gets a new file after an upgrade.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources

from fastapi import APIRouter, Request, Response

ASSETS: dict[str, str] = {
    "tether.css": "text/css; charset=utf-8",
    "tether.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
PUBLIC_PATHS = frozenset(f"/static/{name}" for name in ASSETS)
"""Paths (relative to the app's root) that need no session in the standalone server."""


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    digest: str


@functools.cache
def load(name: str) -> Asset:
    body = resources.files("tether.web").joinpath("static").joinpath(name).read_bytes()
    return Asset(body, ASSETS[name], hashlib.sha256(body).hexdigest()[:12])


def url(base: str, name: str) -> str:
    """Where a page links the asset: under the dashboard's ``base``, with its digest."""
    return f"{base}/static/{name}?v={load(name).digest}"


def routes() -> APIRouter:
    """One GET route per asset (no path parameter: nothing else of the package is served)."""
    static = APIRouter(include_in_schema=False)

    def add(name: str) -> None:
        async def serve(request: Request) -> Response:
            asset = load(name)
            etag = f'"{asset.digest}"'
            versioned = request.query_params.get("v") == asset.digest
            headers = {
                "ETag": etag,
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "public, max-age=31536000, immutable" if versioned else "no-cache",
            }
            if request.headers.get("if-none-match") == etag:
                return Response(status_code=304, headers=headers)
            return Response(asset.body, media_type=asset.media_type, headers=headers)

        static.add_api_route(f"/static/{name}", serve, methods=["GET"], name=f"tether-{name}")

    for name in ASSETS:
        add(name)
    return static
