"""``create_app``: the standalone server (what ``tether web`` serves).

Layout of the app it builds::

    AuthMiddleware            every path but /login, /logout and the login page's assets
                              needs the token or a session; read-only mode refuses
                              state-changing requests here first
    /login, /logout           the login page (``_login.py``)
    /, /queues/..., ...       the dashboard's pages (``pages/``) and /static assets
    /api/...                  the JSON API (``router()``), its schema at /api/openapi.json
    /metrics                  the deployment's Prometheus metrics (``_metrics.py``)

Routes added to the app later sit behind the same middleware, so they are authenticated
without doing anything: pages shared with the mounted router go in ``_router.routes``; a
route of the standalone server only (``/metrics``: Prometheus sends the token with its
``authorization`` setting) is included here, after ``routes(ctx)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from ..base._version import __version__
from . import _login, _metrics
from ._auth import AuthMiddleware, FailureThrottle, TokenAuth
from ._context import WebContext
from ._router import routes

if TYPE_CHECKING:
    from ..producer._core import Core


def create_app(
    app: Core,
    *,
    token: str,
    read_only: bool = False,
    session_ttl: float = 12 * 3600.0,
    secure_cookies: bool | None = None,
) -> FastAPI:
    """A FastAPI app serving ``app``'s management API, guarded by ``token`` (at least 16
    characters; compared in constant time).

    ``read_only`` answers 403 to every state-changing call. Wrong tokens are throttled per
    client address (see ``_auth.FailureThrottle``). Browser sessions last
    ``session_ttl`` seconds; their cookie is ``Secure`` when the request came over HTTPS,
    or as ``secure_cookies`` says. The app opens the Tether app at start-up unless it is
    open already, and closes it at shut-down if it opened it.
    """
    auth = TokenAuth(token, session_ttl=session_ttl)
    throttle = FailureThrottle()  # shared: the login page and the header count together
    ctx = WebContext(app, read_only=read_only, csrf=True)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        opened = not app.is_open
        if opened:
            await app.open()
        try:
            yield
        finally:
            if opened:
                await app.close()

    web = FastAPI(
        title="Tether",
        version=__version__,
        description=f"The management API of the Tether namespace {app.namespace!r}.",
        docs_url=None,  # Swagger UI loads its assets from a CDN: the schema is enough
        redoc_url=None,
        openapi_url="/api/openapi.json",
        lifespan=lifespan,
    )
    web.add_middleware(AuthMiddleware, auth=auth, read_only=read_only, throttle=throttle)
    web.state.tether = ctx
    web.include_router(_login.routes(ctx, auth, secure_cookies=secure_cookies, throttle=throttle))
    web.include_router(routes(ctx))
    web.include_router(_metrics.routes(app))
    return web
