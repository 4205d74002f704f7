"""``tether.web.router(app)``: every route of the management API, for mounting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

from . import _static, api, pages
from ._context import Actor, WebContext

if TYPE_CHECKING:
    from ..producer._core import Core


def router(
    app: Core, *, read_only: bool = False, csrf: bool = True, actor: Actor | None = None
) -> APIRouter:
    """The dashboard and the management API of ``app`` as a router to include in your
    FastAPI app: the pages at the router's root, the JSON API under ``/api``.

    .. warning::
       **This router authenticates no one: authentication and authorization are your
       app's job.** Anyone who can reach it can read your queues and, unless
       ``read_only=True``, retry, purge, cancel and pause. Include it with your own
       dependencies, for example::

           api.include_router(tether.web.router(app), prefix="/tether",
                              dependencies=[Depends(admin_only)])

    ``read_only=True`` answers 403 to every state-changing call (and the dashboard shows no
    write button). ``csrf`` (on by default) requires the token of
    ``GET <prefix>/api/session`` in the ``X-CSRF-Token`` header (the dashboard's forms carry
    it) on every state-changing request a page on another site could make a browser send
    with your session cookie or the Basic credentials it remembers: all but those with an
    ``Authorization: Bearer`` header, or with an ``Authorization`` header and a body that
    is not a form (JSON; see ``_guard``). Turn it off only if your app guards against CSRF
    itself.
    ``actor(request)`` names the caller in the audit log (``tether.web.audit``); by default
    the router uses ``request.scope["user"]`` when your authentication sets one.

    Open the app in your lifespan (``async with app:``) so it closes cleanly; otherwise
    the router opens it at its first request, on that request's event loop, and closes it
    when that loop ends (a next loop opens it again).
    """
    return routes(WebContext(app, read_only=read_only, csrf=csrf, actor=actor))


def routes(ctx: WebContext) -> APIRouter:
    """Everything both ways of serving share: the JSON API under ``/api``, the dashboard's
    pages (:mod:`.pages`) and their assets (``/static/...``).

    ``create_app`` and a mounted ``router()`` both serve them: behind the standalone
    middleware (a page request without a session is redirected to ``/login``) or the
    host's dependencies. Pages render with ``_templates.templates``; their forms carry the
    token of ``_guard.csrf_token(request, response)`` (field ``csrf_token``); a
    state-changing route takes ``Depends(_params.writer(ctx))``, which refuses it in
    read-only mode or without the token, and names the caller for ``_guard.audit``. Data
    comes from ``await ctx.stats()`` (:class:`tether.admin.Stats`), as the API's does."""
    root = APIRouter()
    root.include_router(api.build(ctx), prefix="/api")
    root.include_router(pages.build(ctx))
    root.include_router(_static.routes())
    return root
