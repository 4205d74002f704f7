"""What every state-changing route checks before it acts: the read-only flag, the CSRF
token, and who is asking (for the audit log).

A page on another site can make a browser send a request with whatever the browser
attaches by itself: cookies, and the HTTP Basic (or Digest, NTLM, Negotiate) credentials
it remembers for the server. It can only send a *simple* request, though: a form post
(``application/x-www-form-urlencoded``, ``multipart/form-data``, ``text/plain``) or a body
without a content type, and no header of its own. Anything else makes the browser ask the
server first (a CORS preflight), which the router never grants. So:

- a request that authenticates with a token a browser never sends by itself
  (``Authorization: Bearer``, any scheme but those four) needs no CSRF token;
- standalone, a browser session's requests need the session's token (see ``_auth.py``);
- mounted, the router cannot know how the host authenticates, so every state-changing
  request needs the token of a double-submit cookie, whatever authenticates it, unless it
  carries an ``Authorization`` header and is not simple (a script sending JSON with the
  host's Basic credentials). ``GET /api/session`` (and the dashboard's pages) set
  ``tether_csrf``, and a state-changing request echoes its value in the ``X-CSRF-Token``
  header or a ``csrf_token`` form field. ``router(app, csrf=False)`` turns this off for
  hosts that protect themselves.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException, Request, Response

from ._auth import Principal, client_address

if TYPE_CHECKING:
    from ._context import WebContext

CSRF_COOKIE = "tether_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
AMBIENT_SCHEMES = frozenset({"basic", "digest", "negotiate", "ntlm"})
"""HTTP authentication schemes browsers answer a server's challenge with, and then attach
by themselves to every request to it, a cross-site form post included."""
SIMPLE_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})
"""The content types a page on another site can post without a CORS preflight."""

audit_log = logging.getLogger("tether.web.audit")


class Refused(HTTPException):
    """A state-changing request refused by the router's own checks (read-only mode, CSRF):
    the dashboard shows it as a page, the API as JSON. An ``HTTPException`` of a host's own
    dependencies (its 401 in a mounted router) is left to the host."""


def principal(request: Request) -> Principal | None:
    """The caller as the standalone middleware saw it (None in a mounted router)."""
    found = getattr(request.state, "tether_principal", None)
    return found if isinstance(found, Principal) else None


def csrf_token(request: Request, response: Response | None = None) -> str | None:
    """The CSRF token a page or client should send back with state-changing requests
    (None when the caller authenticates by header and needs none). In a mounted router,
    sets the double-submit cookie on ``response`` when the request has none yet."""
    found = principal(request)
    if found is not None:
        return found.csrf_token
    token = request.cookies.get(CSRF_COOKIE)
    if not token or len(token) > 100:
        token = secrets.token_urlsafe(32)
        if response is not None:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path="/",
            )
    return token


def actor(ctx: WebContext, request: Request) -> str:
    """Who is asking, for the audit log."""
    found = principal(request)
    if found is not None:
        return found.who
    named = ctx.actor(request) if ctx.actor is not None else None
    if named is None:
        user: Any = request.scope.get("user")
        name = getattr(user, "display_name", None) or getattr(user, "username", None)
        named = str(name) if name else None
    return f"{named or 'caller'} from {client_address(request.scope)}"


def _scheme(request: Request) -> str | None:
    """The scheme of the Authorization header, lowercased (None without one)."""
    header = request.headers.get("authorization")
    return header.strip().partition(" ")[0].lower() if header else None


def needs_csrf(ctx: WebContext, request: Request) -> bool:
    """Whether this caller's state-changing requests must carry a CSRF token (and so
    whether its pages and ``GET /api/session`` give one): all but those that authenticate
    with a token a browser never attaches by itself."""
    found = principal(request)
    if found is not None:
        return found.method != "bearer"
    scheme = _scheme(request)
    return ctx.csrf and (scheme is None or scheme in AMBIENT_SCHEMES)


def cross_site_sendable(request: Request) -> bool:
    """Whether a page on another site could have made a browser send this request as it
    is, without a preflight: no content type or a form's, and no Authorization header but
    one a browser attaches by itself."""
    content_type = request.headers.get("content-type")
    if content_type is not None:
        # The MIME type's essence, as browsers compare it: parameters dropped, no case.
        essence = content_type.partition(";")[0].strip().lower()
        if essence and essence not in SIMPLE_TYPES:
            return False
    scheme = _scheme(request)
    return scheme is None or scheme in AMBIENT_SCHEMES


async def require_write(ctx: WebContext, request: Request) -> str:
    """403 unless the call may change state; returns the caller's name for the audit."""
    if ctx.read_only:
        raise Refused(403, "read-only mode: state-changing calls are refused")
    if not needs_csrf(ctx, request):
        return actor(ctx, request)
    found = principal(request)
    if found is None and request.headers.get("authorization") and not cross_site_sendable(request):
        # A script with the host's Basic credentials, sending JSON: a page on another site
        # cannot send that without a preflight. The same call as a form post, or without a
        # body, is what such a page sends with the credentials the browser remembers.
        return actor(ctx, request)
    expected = found.csrf_token if found is not None else request.cookies.get(CSRF_COOKIE)
    given = request.headers.get(CSRF_HEADER)
    if given is None and request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        field = (await request.form()).get(CSRF_FIELD)
        given = field if isinstance(field, str) else None
    if not expected or not given or not hmac.compare_digest(given.encode(), expected.encode()):
        raise Refused(
            403,
            "missing or wrong CSRF token: send the token of GET /api/session in the "
            "X-CSRF-Token header (or the csrf_token form field)",
        )
    return actor(ctx, request)


def audit(who: str, action: str, **details: Any) -> None:
    """One line per state-changing call: who, what, which ids, what came of it."""
    audit_log.info("%s: %s %s", who, action, " ".join(f"{k}={v!r}" for k, v in details.items()))
