"""What every page shares: where the dashboard lives (its base URL under any prefix), the
rendering of a template with the context every page needs, the flash message of a
post-redirect-get, error pages, and the headers of every answer.

**Base URL.** The router may be served at the root of ``tether web``, under a prefix of a
host's FastAPI app, behind a proxy's root path. A page knows its own path relative to the
dashboard (registered with :func:`page`), so the base is the request's path with that
relative path taken off its end; links are built from it, never from a fixed root.

**Errors.** A page never answers a 500 for bad input: :func:`route_class` renders Tether's
and Redis's errors as an HTML page with the status the JSON API would give (404 unknown
queue or task, 422 malformed id or cursor, 409, 503), and so for FastAPI's validation
errors and the 403 of the router's own write checks. A mounting host's own refusals (the
401 of its authentication) go to the host's handlers, as they would for any of its routes.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime, timezone
from typing import Any, TypeVar
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute

from ...base._version import __version__
from .. import _static
from .._context import WebContext
from .._errors import error_response, log
from .._guard import Refused, csrf_token, needs_csrf, principal
from .._login import safe_next
from .._templates import templates

Endpoint = TypeVar("Endpoint", bound=Callable[..., Coroutine[Any, Any, Response]])

PAGE_PATH = "tether_page_path"
"""The attribute of a page's endpoint holding its path relative to the dashboard."""
FLASH_COOKIE = "tether_flash"
FLASH_MAX = 500
"""Characters of a flash message kept (the cookie must stay small)."""

SECURITY_HEADERS = {
    # Nothing inline and nothing from elsewhere: a value shown on a page (a task's
    # arguments, an error message) can never run as script, even if escaping failed.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def page(
    router: APIRouter, path: str, *, methods: tuple[str, ...] = ("GET",)
) -> Callable[[Endpoint], Endpoint]:
    """Register a page (or a form's target) at ``path`` relative to the dashboard."""

    def register(endpoint: Endpoint) -> Endpoint:
        setattr(endpoint, PAGE_PATH, path)
        router.add_api_route(
            path, endpoint, methods=list(methods), response_class=HTMLResponse,
            name=f"tether-page:{','.join(methods)}:{path}",
        )  # fmt: skip
        return endpoint

    return register


def base_of(request: Request) -> str:
    """The URL path of the dashboard's root (no trailing slash; ``""`` at the very root)."""
    root = str(request.scope.get("root_path", ""))
    path = str(request.scope.get("path", ""))
    route = request.scope.get("route")
    relative = getattr(getattr(route, "endpoint", None), PAGE_PATH, None)
    if relative is None:
        return root
    try:
        concrete = relative.format(**request.path_params)
    except (KeyError, IndexError, ValueError):
        return root
    if root and not path.startswith(root):  # servers that keep the root path out of it
        path = root + path
    prefix = path[: len(path) - len(concrete)] if path.endswith(concrete) else root
    return prefix.rstrip("/")


def here(request: Request, base: str) -> str:
    """The request's path and query relative to the dashboard: where a form comes back."""
    root = str(request.scope.get("root_path", ""))
    path = str(request.scope.get("path", ""))
    if root and not path.startswith(root):  # servers that keep the root path out of it
        path = root + path
    relative = path[len(base) :] if path.startswith(base) else "/"
    query = request.url.query
    return (relative or "/") + (f"?{query}" if query else "")


def link(base: str, path: str, **query: str | int | None) -> str:
    """``base + path`` with the query parameters that are not None."""
    kept = {k: v for k, v in query.items() if v is not None and v != ""}
    return base + path + (f"?{urlencode(kept)}" if kept else "")


async def form_value(request: Request, name: str) -> str | None:
    """A text field of the posted form (None when absent, or a file)."""
    found = (await request.form()).get(name)
    return found if isinstance(found, str) else None


async def form_values(request: Request, name: str) -> list[str]:
    """Every value of a repeated text field (checkboxes)."""
    return [v for v in (await request.form()).getlist(name) if isinstance(v, str)]


# -- flash messages -------------------------------------------------------------------------


def _flash_value(kind: str, message: str) -> str:
    raw = json.dumps({"k": kind, "m": message[:FLASH_MAX]}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read_flash(request: Request) -> dict[str, str] | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw or len(raw) > 4 * FLASH_MAX:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, binascii.Error):
        return None
    if not isinstance(data, dict) or data.get("k") not in ("ok", "error"):
        return None
    return {"kind": str(data["k"]), "message": str(data.get("m", ""))[:FLASH_MAX]}


def back(request: Request, target: str | None, message: str, *, ok: bool = True) -> Response:
    """After a write: a 303 to the page the form came from (``target``, relative to the
    dashboard; a path elsewhere is refused), carrying ``message`` for that page."""
    base = base_of(request)
    response = RedirectResponse(base + safe_next(target), status_code=303)
    response.set_cookie(
        FLASH_COOKIE, _flash_value("ok" if ok else "error", message), max_age=60,
        httponly=True, samesite="strict", secure=request.url.scheme == "https",
        path=base or "/",
    )  # fmt: skip
    return response


# -- rendering ----------------------------------------------------------------------------


def render(
    ctx: WebContext,
    request: Request,
    template: str,
    context: Mapping[str, Any],
    *,
    status: int = 200,
    fragment: bool = False,
) -> Response:
    """A page (or a fragment of one, for the live refresh) with what every page needs:
    the base URL, the CSRF token of its forms, the flash message, whether writes show."""
    base = base_of(request)
    holder = Response()  # a mounted router sets its double-submit cookie here first
    found = principal(request)
    token = csrf_token(request, holder) if needs_csrf(ctx, request) else None
    flash = None if fragment else read_flash(request)
    values = {
        "base": base,
        "here": here(request, base),
        "static": lambda name: _static.url(base, name),
        "link": lambda path, **query: link(base, path, **query),
        "namespace": ctx.app.namespace,
        "read_only": ctx.read_only,
        "can_write": not ctx.read_only,
        "csrf_token": token or "",
        "signed_in": found is not None and found.method == "session",
        "flash": flash,
        "now": datetime.now(timezone.utc),
        "version": __version__,
        "active": "",
        **context,
    }
    response = templates.TemplateResponse(request, template, values, status_code=status)
    for key, value in holder.raw_headers:
        if key == b"set-cookie":
            response.raw_headers.append((key, value))
    if flash is not None:
        response.delete_cookie(FLASH_COOKIE, path=base or "/")
    if fragment:
        response.headers["X-Tether-Fragment"] = "1"
    return response


def _problem(exc: Exception) -> tuple[int, str] | None:
    """The status and words of an error a page shows; None for what the page leaves to
    others: a bug (a real 500), or an ``HTTPException`` of a mounting host's dependencies
    (its 401 goes to its own handlers, and tells an anonymous visitor nothing of ours)."""
    if isinstance(exc, HTTPException):
        return (exc.status_code, str(exc.detail)) if isinstance(exc, Refused) else None
    if isinstance(exc, RequestValidationError):
        words = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return 422, words or "malformed request"
    answer = error_response(exc)
    if answer is None:
        return None
    return answer.status_code, str(exc)


TITLES = {
    403: "Not allowed",
    404: "Not found",
    405: "Not allowed",
    409: "Does not apply",
    422: "Malformed request",
    502: "The server refused",
    503: "The server cannot be reached",
}


def route_class(ctx: WebContext) -> type[APIRoute]:
    """The route class of the pages: errors as HTML pages, the security headers, and the
    server time of each page (``Server-Timing``, which the bench reads)."""

    class PageRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                started = time.perf_counter()
                try:
                    response = await handler(request)
                except Exception as exc:
                    problem = _problem(exc)
                    if problem is None:
                        raise
                    status, detail = problem
                    if status >= 500:
                        log.warning("%s %s: %s", request.method, request.url.path, exc)
                    response = render(
                        ctx, request, "error.html",
                        {"status": status, "title": TITLES.get(status, "Error"),
                         "detail": detail},
                        status=status,
                    )  # fmt: skip
                elapsed = (time.perf_counter() - started) * 1000
                response.headers["Server-Timing"] = f"app;dur={elapsed:.1f}"
                for key, value in SECURITY_HEADERS.items():
                    response.headers.setdefault(key, value)
                return response

            return handle

    return PageRoute
