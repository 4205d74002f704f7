"""What every command shares: loading the app, connection flags, logging, running a coroutine
against an open app, and turning Tether's errors into one-line messages."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console

if TYPE_CHECKING:
    from .._app import Tether

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# Tables go to stdout; without a terminal rich would fold them to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)


def load_app(spec: str) -> Tether:
    """Import ``module:attribute`` (or ``module``, looking for ``app``) and return the app."""
    from .._app import Tether

    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="APP"
        ) from None
    app = getattr(module, attr, None)
    if not isinstance(app, Tether):
        raise click.BadParameter(
            f"{module_name}:{attr} is {type(app).__name__}, not a Tether app", param_hint="APP"
        )
    return app


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def connection_options(fn: F) -> F:
    """``--url`` and ``--namespace``. Given on the command line they win over the values in
    the app's code; from the environment they fill in what the code leaves unset."""
    fn = click.option(
        "--namespace", envvar="TETHER_NAMESPACE", help="Key namespace (TETHER_NAMESPACE)."
    )(fn)
    fn = click.option("--url", envvar="TETHER_URL", help="Redis URL (TETHER_URL).")(fn)
    return fn


def open_app(app_spec: str | None, url: str | None, namespace: str | None) -> Tether:
    """The app named by ``app_spec`` (or a bare one), pointed at the server the user named."""
    from .._app import Tether
    from .._errors import ConfigError

    # The environment is read by apps that leave the URL to it (Tether() without a URL).
    if url:
        os.environ["TETHER_URL"] = url
    if namespace:
        os.environ["TETHER_NAMESPACE"] = namespace
    app = load_app(app_spec) if app_spec else Tether()
    ctx = click.get_current_context()
    explicit_url = url if ctx.get_parameter_source("url") == ParameterSource.COMMANDLINE else None
    explicit_ns = (
        namespace if ctx.get_parameter_source("namespace") == ParameterSource.COMMANDLINE else None
    )
    try:
        app.configure(url=explicit_url, namespace=explicit_ns)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    return app


def run(app: Tether, work: Callable[[Tether], Awaitable[T]]) -> T:
    """Open ``app``, run ``work`` on it, close it; Tether's errors become one-line messages."""
    import redis

    from .._errors import TetherError
    from .._redis import describe_error

    async def main() -> T:
        async with app:
            return await work(app)

    try:
        return asyncio.run(main())
    except TetherError as exc:
        raise click.ClickException(str(exc)) from None
    except (redis.RedisError, OSError) as exc:
        raise click.ClickException(describe_error(exc, app.target.redacted)) from None
