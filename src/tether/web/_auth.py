"""Standalone authentication: one token, two ways to present it.

- Scripts send ``Authorization: Bearer <token>``.
- Browsers log in at ``/login`` with the token and get a session cookie (HttpOnly,
  SameSite=Strict, Secure over HTTPS) holding a random session id, its expiry and an HMAC
  of both under a key derived from the token, so nothing is stored on the server and
  changing the token ends every session. A session's CSRF token is an HMAC of its id: pages
  put it in their forms (field ``csrf_token``) or requests (header ``X-CSRF-Token``).

Tokens and MACs are compared in constant time (:func:`hmac.compare_digest`). Wrong tokens
are throttled per client address (:class:`FailureThrottle`): after a few, the address waits
longer and longer before a token of its is checked again, and meanwhile gets 429.

:class:`AuthMiddleware` guards every path of the standalone app but the login page, so
pages and endpoints added later (the dashboard, ``/metrics``) are authenticated by default;
it puts the caller's :class:`Principal` in ``request.state.tether_principal``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.types import ASGIApp, Receive, Scope, Send

from ..base._errors import ConfigError
from ._static import PUBLIC_PATHS as STATIC_PATHS

log = logging.getLogger("tether.web")

SESSION_COOKIE = "tether_session"
MIN_TOKEN_LENGTH = 16
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PUBLIC_PATHS = frozenset({"/login", "/logout"}) | STATIC_PATHS
"""Paths the middleware lets through without a token (relative to the root path): the
login page, and the dashboard's stylesheet, script and icon (which the login page uses)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class Principal:
    """Who made a request, as far as the server knows."""

    method: str
    """'bearer' (the Authorization header), 'session' (the login cookie), or 'host' (a
    mounted router, authenticated by its host)."""
    who: str
    """For the audit log: how the caller authenticated, and from where."""
    csrf_token: str | None = None
    """The session's CSRF token (a session only)."""


class TokenAuth:
    """The token of a standalone server, and the sessions it signs."""

    def __init__(self, token: str, *, session_ttl: float = 12 * 3600.0) -> None:
        if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(
                f"the web token must be at least {MIN_TOKEN_LENGTH} characters "
                "(for example: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if session_ttl <= 0:
            raise ConfigError(f"session_ttl={session_ttl!r} must be more than zero seconds")
        self._token = token.encode()
        self._key = hmac.new(self._token, b"tether-session-v1", hashlib.sha256).digest()
        self.session_ttl = session_ttl

    def check_token(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def bearer(self, header: str | None) -> bool:
        """A valid ``Authorization: Bearer <token>`` header."""
        if not header:
            return False
        scheme, _, credentials = header.partition(" ")
        return scheme.lower() == "bearer" and self.check_token(credentials.strip())

    def _mac(self, message: str) -> str:
        return _b64(hmac.new(self._key, message.encode(), hashlib.sha256).digest())

    def new_session(self) -> str:
        """A cookie value for a new session."""
        session = _b64(secrets.token_bytes(16))
        expires = int(time.time() + self.session_ttl)
        return f"{session}.{expires}.{self._mac(f'{session}.{expires}')}"

    def session(self, cookie: str | None) -> str | None:
        """The session id of a valid, unexpired cookie value."""
        if not cookie or len(cookie) > 200:
            return None
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        session, expires, mac = parts
        if not hmac.compare_digest(mac, self._mac(f"{session}.{expires}")):
            return None
        return session if int(expires) > time.time() else None

    def csrf_token(self, session: str) -> str:
        return self._mac(f"csrf.{session}")


@dataclass
class _Failures:
    count: int
    last: float
    until: float


class FailureThrottle:
    """Wrong tokens per client, to keep guessing slow whatever the client's concurrency.

    After ``free`` wrong tokens, a client (an address; an IPv6 address by its /64, which
    one host usually holds whole) waits ``base_delay`` seconds before its next token is
    checked at all, and twice as long after each further wrong one, up to ``max_delay``.
    Waiting, its tokens, right or wrong, are not checked (checking them would tell a
    guesser which one was right, throttled or not): the caller answers 429 with
    ``Retry-After``. A client's record is forgotten ``forget_after`` seconds after its last
    wrong token, and at most ``max_clients`` are kept (the oldest go first), so the table
    stays bounded however many addresses guess. The table is the server process's own:
    each process of a server with several counts apart."""

    def __init__(
        self,
        *,
        free: int = 5,
        base_delay: float = 1.0,
        max_delay: float = 60.0,
        forget_after: float = 900.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = free
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.forget_after = forget_after
        self.max_clients = max_clients
        self._clock = clock
        self._clients: OrderedDict[str, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    @staticmethod
    def client(address: str) -> str:
        """The key of an address: itself, or its /64 for IPv6."""
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            return address
        if isinstance(parsed, ipaddress.IPv6Address):
            if parsed.ipv4_mapped is not None:
                return str(parsed.ipv4_mapped)
            return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
        return str(parsed)

    def wait(self, address: str) -> float:
        """Seconds before a token of this address is checked again (0: now)."""
        key = self.client(address)
        found = self._clients.get(key)
        if found is None:
            return 0.0
        now = self._clock()
        if now - found.last > self.forget_after:
            del self._clients[key]
            return 0.0
        return max(0.0, found.until - now)

    def failed(self, address: str) -> _Failures:
        """Count a wrong token of this address; its record after it."""
        key = self.client(address)
        now = self._clock()
        found = self._clients.pop(key, None)
        if found is None or now - found.last > self.forget_after:
            found = _Failures(0, now, now)
        found.count += 1
        found.last = now
        if found.count >= self.free:
            delay = self.base_delay * 2 ** min(found.count - self.free, 32)
            found.until = now + min(delay, self.max_delay)
        self._clients[key] = found  # the most recent last: the oldest are evicted first
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
        return found

    def refusal(self, address: str, where: str) -> float:
        """Record a wrong token of ``address`` given ``where`` (for the log) and log it,
        never the token: the seconds the address now waits."""
        found = self.failed(address)
        wait = max(0.0, found.until - found.last)
        log.warning(
            "wrong token %s from %s (%d so far)%s", where, address, found.count,
            f": its tokens are not checked for {wait:.0f} s" if wait else "",
        )  # fmt: skip
        return wait


def retry_after(wait: float) -> str:
    """A ``Retry-After`` value: whole seconds, at least one."""
    return str(max(1, math.ceil(wait)))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _cookie(scope: Scope, name: str) -> str | None:
    raw = _header(scope, b"cookie")
    if not raw:
        return None
    for part in raw.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class AuthMiddleware:
    """Every request but the login page needs the token (header) or a session (cookie).

    Without one, a browser's page request (``GET`` accepting ``text/html``) is redirected to
    the login page; anything else gets 401 JSON. In read-only mode every state-changing
    request but login and logout gets 403 here, before its body is read."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        auth: TokenAuth,
        read_only: bool = False,
        throttle: FailureThrottle | None = None,
    ) -> None:
        self.app = app
        self.auth = auth
        self.read_only = read_only
        self.throttle = throttle if throttle is not None else FailureThrottle()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        root = scope.get("root_path", "")
        path = scope["path"]
        if root and path.startswith(root):
            path = path[len(root) :]
        if path in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        address = client_address(scope)
        header = _header(scope, b"authorization")
        bearer = header is not None and _is_bearer(header)
        if bearer and (wait := self.throttle.wait(address)):
            await _send(send, 429, {"detail": "too many wrong tokens from this address: "
                        f"try again in {retry_after(wait)} s"},
                        [(b"retry-after", retry_after(wait).encode())])  # fmt: skip
            return
        principal = self.principal(scope)
        if bearer and (principal is None or principal.method != "bearer"):
            # Only a Bearer header is a guess: a proxy's Basic credentials are not ours.
            self.throttle.refusal(address, "in an Authorization header")
        method = scope["method"]
        if bearer and principal is None:
            # A token was sent and is wrong: say so (RFC 6750's invalid_token), so a script
            # with a stale or mistyped token is not told to send the token it did send.
            await _send(send, 401, {"detail": "the bearer token is wrong: check the token "
                        "the server was started with", "error": "invalid_token"},
                        [(b"www-authenticate", b'Bearer realm="tether", error="invalid_token", '
                          b'error_description="the token is wrong"')])  # fmt: skip
            return
        if principal is None:
            accept = _header(scope, b"accept") or ""
            if method in ("GET", "HEAD") and "text/html" in accept:
                target = path + (("?" + scope["query_string"].decode()) if scope.get(
                    "query_string") else "")  # fmt: skip
                await _send(send, 303, None, [(b"location", (
                    f"{root}/login?next={quote(target, safe='')}").encode())])  # fmt: skip
                return
            await _send(send, 401, {"detail": "authentication required: send the token as "
                        "'Authorization: Bearer <token>' or log in at /login"},
                        [(b"www-authenticate", b'Bearer realm="tether"')])  # fmt: skip
            return
        if self.read_only and method not in SAFE_METHODS:
            await _send(send, 403, {"detail": "read-only mode: state-changing calls are refused"})
            return
        scope.setdefault("state", {})["tether_principal"] = principal
        await self.app(scope, receive, send)

    def principal(self, scope: Scope) -> Principal | None:
        address = client_address(scope)
        if self.auth.bearer(_header(scope, b"authorization")):
            return Principal("bearer", f"bearer token from {address}")
        session = self.auth.session(_cookie(scope, SESSION_COOKIE))
        if session is not None:
            return Principal(
                "session",
                f"browser session {session[:8]} from {address}",
                self.auth.csrf_token(session),
            )
        return None


def _is_bearer(header: str) -> bool:
    return header.strip().partition(" ")[0].lower() == "bearer"


async def _send(
    send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    payload = b"" if body is None else json.dumps(body).encode()
    all_headers = [(b"content-length", str(len(payload)).encode()), *(headers or [])]
    if body is not None:
        all_headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": payload})
