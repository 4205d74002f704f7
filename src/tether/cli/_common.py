"""What every command shares: loading the app, connection flags, logging, running a coroutine
against an open app, and turning errors into one-line messages (``--debug`` shows the
traceback)."""

from __future__ import annotations

import asyncio
import functools
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

# Tables go to stdout. Without a terminal (a pipe, a file, a CI log) nothing is folded: each
# row is one line as wide as it needs, so ids can be copied whole.
console = Console(width=None if sys.stdout.isatty() else 100_000)


def load_app(spec: str) -> Tether:
    """Import ``module:attribute`` (or ``module``, looking for ``app``) and return the app."""
    from .._app import Tether
    from ..base._errors import TetherError

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
    except TetherError as exc:  # the module declares something invalid (a cron, a setting)
        if debugging():
            raise
        raise click.BadParameter(
            f"importing {module_name!r} failed: {exc}", param_hint="APP"
        ) from None
    if not hasattr(module, attr):
        raise click.BadParameter(
            f"module {module_name!r} has no attribute {attr!r} (APP is module:attribute, "
            "for example myapp.tasks:app)",
            param_hint="APP",
        )
    app = getattr(module, attr)
    if not isinstance(app, Tether):
        raise click.BadParameter(
            f"{module_name}:{attr} is a {kind_of(app)}, not a Tether app", param_hint="APP"
        )
    return app


def kind_of(value: object) -> str:
    """What a value is, in words a user knows: a task (sync or async) is "Task"."""
    from ..producer._task import Task

    return "Task" if isinstance(value, Task) else type(value).__name__


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def debugging() -> bool:
    """``--debug`` (or TETHER_DEBUG=1, or ``--log-level DEBUG``) was asked for."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.meta.get("tether.debug"):
            return True
        ctx = ctx.parent
    return False


def one_line_errors(fn: F) -> F:
    """Tether's, the server's and the network's errors end the command with one line naming
    the problem and exit status 1; with ``--debug`` the traceback is printed as well."""
    import redis

    from ..base._errors import TetherError

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        if kwargs.pop("debug", False) or str(kwargs.get("log_level", "")).upper() == "DEBUG":
            ctx.meta["tether.debug"] = True
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:  # the output went to `head` or a pager that quit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except (TetherError, redis.RedisError) as exc:
            if debugging():
                raise  # Python prints the traceback; the exit status is 1
            raise click.ClickException(_one_line(exc)) from None

    return wrapper  # type: ignore[return-value]


def _one_line(exc: BaseException) -> str:
    from ..base._errors import TetherError
    from ..base._faults import describe_error
    from ..protocol.scripts import refused_in_script

    if isinstance(exc, TetherError):
        return str(exc)
    where = click.get_current_context().meta.get("tether.where", "the server")
    # A command refused inside one of our scripts: Redis 7.0 names only the script's line.
    return describe_error(exc, where, refused_in_script(str(exc)))


log_level_option = click.option(
    "--log-level",
    default="info",
    show_default=True,
    # In the case click shows the list in, so the default reads as one of them; any case is
    # accepted (--log-level DEBUG too).
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
"""``--log-level`` of every command that runs until stopped."""


def connection_options(fn: F) -> F:
    """``--url``, ``--namespace`` and ``--debug``. Given on the command line, ``--url`` and
    ``--namespace`` win over the values in the app's code; from the environment they fill in
    what the code leaves unset."""
    fn = one_line_errors(fn)
    fn = click.option(
        "--debug",
        is_flag=True,
        envvar="TETHER_DEBUG",
        help="Print the traceback of an error, not just its one-line message (TETHER_DEBUG).",
    )(fn)
    fn = click.option(
        "--namespace",
        envvar="TETHER_NAMESPACE",
        help="Key namespace (TETHER_NAMESPACE); default: the app's, else 'tether'.",
    )(fn)
    fn = click.option(
        "--url",
        envvar="TETHER_URL",
        help="Redis URL (TETHER_URL); default: the app's, else redis://localhost:6379/0.",
    )(fn)
    return fn


def open_app(app_spec: str | None, url: str | None, namespace: str | None) -> Tether:
    """The app named by ``app_spec`` (or a bare one), pointed at the server the user named.

    A flag typed on the command line wins over the app's code; the environment fills in what
    the code leaves unset, and says so when the code's value wins over it; the default URL is
    named once, on stderr, so a forgotten variable does not silently read another server."""
    from .._app import Tether
    from ..base._errors import ConfigError

    ctx = click.get_current_context()
    typed_url = ctx.get_parameter_source("url") == ParameterSource.COMMANDLINE
    typed_ns = ctx.get_parameter_source("namespace") == ParameterSource.COMMANDLINE
    if url:  # a bad URL is the user's typo: name where it came from, before importing anything
        from ..base._redis import parse_url

        try:
            parse_url(url)
        except ConfigError as exc:
            if debugging():
                raise
            hint = "--url" if typed_url else "TETHER_URL"
            raise click.BadParameter(str(exc), param_hint=hint) from None
    try:
        env_url, env_ns = os.environ.get("TETHER_URL"), os.environ.get("TETHER_NAMESPACE")
        # Apps that leave the URL to the environment (Tether() without one) read these.
        if url:
            os.environ["TETHER_URL"] = url
        if namespace:
            os.environ["TETHER_NAMESPACE"] = namespace
        app = load_app(app_spec) if app_spec else Tether()
        app.configure(url=url if typed_url else None, namespace=namespace if typed_ns else None)
    except ConfigError as exc:
        if debugging():
            raise
        raise click.UsageError(str(exc)) from None
    ctx.meta["tether.where"] = app.target.redacted
    if not typed_url and env_url and app.url_source == "code" and env_url != app.settings.url:
        _note(
            f"TETHER_URL is not used: {app_spec} names its own server ({app.target.redacted}); "
            "--url overrides it"
        )
    if not typed_ns and env_ns and env_ns != app.namespace:
        _note(
            f"TETHER_NAMESPACE={env_ns!r} is not used: {app_spec} names its own namespace "
            f"({app.namespace!r}); --namespace overrides it"
        )
    if app.url_source == "default":
        _note(f"no --url, TETHER_URL or URL in the app: using the default {app.target.redacted}")
    return app


def _note(message: str) -> None:
    ctx = click.get_current_context()
    said = ctx.meta.setdefault("tether.notes", set())
    if message not in said:
        said.add(message)
        click.echo(f"tether: {message}", err=True)


def run(app: Tether, work: Callable[[Tether], Awaitable[T]]) -> T:
    """Open ``app``, run ``work`` on it, close it. Errors become one-line messages in
    :func:`one_line_errors`."""

    import redis

    async def main() -> T:
        async with app:
            return await work(app)

    try:
        return asyncio.run(main())
    except (redis.RedisError, OSError) as exc:  # the server or the network, not the output
        if debugging():
            raise
        from ..base._faults import describe_error

        raise click.ClickException(describe_error(exc, app.target.redacted)) from None
