"""A small HTTP server for ``/metrics``, in threads of its own, that stops cleanly.

It serves prometheus_client's WSGI app (content negotiation, OpenMetrics, gzip) at
``/metrics`` only, optionally behind a bearer token. Threads, not the event loop: a
worker whose loop is busy with CPU work still answers its scrapes. :meth:`stop` closes the
socket and joins the serving thread and every request thread, so nothing is left running
once it returns; a request thread waits at most :data:`REQUEST_TIMEOUT` for a slow client.
"""

from __future__ import annotations

import errno
import hmac
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.registry import Collector

from ..base._errors import ConfigError

REQUEST_TIMEOUT = 10.0
"""Seconds a client may take to send its request or read the answer."""

_Start = Callable[[str, list[tuple[str, str]]], Any]


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the log: say nothing."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = False
    block_on_close = True  # server_close() joins the request threads
    allow_reuse_address = True


def _guarded(app: Callable[..., Iterable[bytes]], token: str | None) -> Callable[..., Any]:
    """``/metrics`` (after the bearer token, when one is set); 404 elsewhere."""
    expected = f"Bearer {token}".encode() if token else None

    def serve(environ: dict[str, Any], start: _Start) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start("404 Not Found", [("Content-Type", "text/plain")])
            return [b"Tether serves its metrics at /metrics\n"]
        if expected is not None:
            given = environ.get("HTTP_AUTHORIZATION", "").encode()
            if not hmac.compare_digest(given, expected):
                start(
                    "401 Unauthorized",
                    [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Bearer realm="tether"')],
                )
                return [b"authentication required: send 'Authorization: Bearer <token>'\n"]
        return app(environ, start)

    return serve


class MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` until :meth:`stop`."""

    def __init__(
        self, registry: Collector, host: str, port: int, *, token: str | None = None
    ) -> None:
        self._app = _guarded(make_wsgi_app(registry), token)
        self.host = host
        self.port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens (the port chosen when 0 was asked for)."""
        if self._server is None:
            return self.host, self.port
        return self.host, int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def start(self) -> None:
        """Listen; a port in use or an address this host lacks is a :class:`ConfigError`."""
        server_class = type("_Bound", (_Server,), {"address_family": _family(self.host)})
        try:
            self._server = make_server(
                self.host, self.port, self._app, server_class, handler_class=_Handler
            )
        except OSError as exc:
            raise ConfigError(_why_not(self.host, self.port, exc)) from None
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"tether-metrics:{self.address[1]}",
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and join every thread it started (blocks up to a fraction of a
        second, longer only while a slow scrape finishes)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _family(host: str) -> socket.AddressFamily:
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
    except OSError:
        return socket.AF_INET  # make_server says what is wrong with the address


def _why_not(host: str, port: int, exc: OSError) -> str:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot serve metrics on {where}: the port is in use (another worker on this "
            "host? give each its own port)"
        )
    if exc.errno == errno.EACCES:
        return f"cannot serve metrics on {where}: permission denied (ports below 1024 need root)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot serve metrics on {where}: this host has no such address"
    return f"cannot serve metrics on {where}: {exc.strerror or exc}"
