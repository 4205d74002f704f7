"""The login page of the standalone server: the token in, a session cookie out."""

import asyncio
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from . import _static
from ._auth import SESSION_COOKIE, FailureThrottle, TokenAuth, client_address, retry_after
from ._context import WebContext
from ._guard import audit
from ._templates import templates

FAILED_LOGIN_DELAY = 0.5
"""Seconds a wrong token waits before its answer, on top of the throttle of its address
(which is what bounds guessing: many logins at once each wait only this)."""


def safe_next(target: str | None) -> str:
    """A local path to go to after the login; anything else (another site) is refused."""
    if (
        not target
        or not target.startswith("/")
        or target.startswith("//")
        or "\\" in target
        or any(ord(c) < 32 for c in target)
    ):
        return "/"
    return target


def routes(
    ctx: WebContext,
    auth: TokenAuth,
    *,
    secure_cookies: bool | None = None,
    throttle: FailureThrottle | None = None,
) -> APIRouter:
    """The login page; ``throttle`` is the one of the app's middleware, so wrong tokens at
    the page and in ``Authorization`` headers count together."""
    pages = APIRouter(include_in_schema=False)
    failures = throttle if throttle is not None else FailureThrottle()

    def page(request: Request, next_path: str, error: str | None, status: int) -> Response:
        root = request.scope.get("root_path", "")
        response = templates.TemplateResponse(
            request,
            "login.html",
            {
                "root": root,
                "static": lambda name: _static.url(root, name),
                "namespace": ctx.app.namespace,
                "read_only": ctx.read_only,
                "next": next_path,
                "error": error,
            },
            status_code=status,
        )
        # The dashboard's pages send the same: no framing, no inline script or style.
        response.headers["Content-Security-Policy"] = (
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'"
        )
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Cache-Control"] = "no-store"
        return response

    @pages.get("/login", response_class=HTMLResponse)
    async def login_page(request: Request, next: str | None = None) -> Response:
        return page(request, safe_next(next), None, 200)

    @pages.post("/login")
    async def login(
        request: Request,
        token: Annotated[str, Form(max_length=1000)],
        next: Annotated[str, Form(max_length=2000)] = "/",
    ) -> Response:
        root = request.scope.get("root_path", "")
        where = client_address(request.scope)
        wait = failures.wait(where)
        if wait:
            # Not checked at all: a right token would otherwise stand out among the 429s.
            refused = page(
                request,
                safe_next(next),
                f"Too many wrong tokens from your address: try again in {retry_after(wait)} s.",
                429,
            )
            refused.headers["Retry-After"] = retry_after(wait)
            return refused
        if not auth.check_token(token):
            failures.refusal(where, "at the login page")
            await asyncio.sleep(FAILED_LOGIN_DELAY)
            return page(request, safe_next(next), "That token is not right.", 401)
        response = RedirectResponse(root + safe_next(next), status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            auth.new_session(),
            max_age=int(auth.session_ttl),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https" if secure_cookies is None else secure_cookies,
            path=root or "/",
        )
        audit(f"browser from {where}", "login")
        return response

    @pages.post("/logout")
    async def logout(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        response = RedirectResponse(root + "/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=root or "/")
        return response

    return pages
