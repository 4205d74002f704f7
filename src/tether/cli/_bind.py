"""Where a server command listens and with which token, and the refusal to listen beyond
the loopback interface without one. No web dependency here: a refused address is said at
once, before anything heavy is imported (``tether web``; a metrics exporter can share it)."""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

from ..base._errors import ConfigError

TOKEN_ENV = "TETHER_WEB_TOKEN"
DEFAULT_BIND = "127.0.0.1:8080"


def parse_bind(bind: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8080`` for IPv6) as (host, port)."""
    host, sep, port_text = bind.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"--bind {bind!r}: expected host:port, for example 127.0.0.1:8080")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def read_token(token_file: str | None) -> str | None:
    """The token from ``--token-file`` (first line), else ``TETHER_WEB_TOKEN``, else None."""
    if token_file:
        try:
            text = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {token_file}: {exc}") from None
        if not text:
            raise ConfigError(f"the token file {token_file} is empty")
        return text.splitlines()[0].strip()
    return os.environ.get(TOKEN_ENV) or None


def resolve_token(host: str, token: str | None) -> tuple[str, bool]:
    """The token to use and whether it was generated for this run. Beyond the loopback
    interface a token must be given; on it, one is generated (and printed) if not."""
    if token:
        return token, False
    if not is_loopback(host):
        raise ConfigError(
            f"refusing to listen on {host} without a token: set {TOKEN_ENV} or give "
            "--token-file (only a loopback address may go without, and then a token is "
            "generated for the run)"
        )
    return secrets.token_urlsafe(24), True
