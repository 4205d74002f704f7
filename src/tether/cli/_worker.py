"""``tether worker``: its options are generated from the fields of :class:`WorkerSettings`
(name, type, default and ``metadata["help"]``), so each setting is described in one place,
and the process's signals are owned here."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import types
import typing
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from ..base._settings import OptionalSeconds, Seconds, WorkerSettings, default_of, help_of
from ._app_argument import app_argument
from ._common import F, connection_options, log_level_option, open_app, setup_logging

# Short forms kept from before the options were generated.
_SHORT = {"queues": "-q", "concurrency": "-c"}


def _click_type(hint: Any) -> Any:
    """The click type of a settings field: its annotation without ``None`` (a duration is
    seconds on the command line)."""
    if isinstance(hint, type) and issubclass(hint, (Seconds, OptionalSeconds)):
        return float
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0]
    if typing.get_origin(hint) is tuple:
        return str  # comma-separated on the command line
    return hint


def settings_options(fn: F) -> F:
    """One option per field of WorkerSettings, in the dataclass's order, with the field's
    default and its help (``metadata["help"]``)."""
    hints = typing.get_type_hints(WorkerSettings)
    for field in reversed(dataclasses.fields(WorkerSettings)):
        flag = "--" + field.name.replace("_", "-")
        names = [flag, _SHORT[field.name]] if field.name in _SHORT else [flag]
        default = default_of(field)
        kind = _click_type(hints[field.name])
        help_text = for_terminal(help_of(field))
        if kind is bool:
            names = [f"{flag}/--no-{flag[2:]}"]
            option = click.option(*names, field.name, default=default, help=help_text)
        else:
            shown = ",".join(default) if isinstance(default, tuple) else default
            option = click.option(
                *names,
                field.name,
                type=kind,
                default=shown,
                show_default=default is not None,
                help=help_text,
            )
        fn = option(fn)
    for old, (new, _) in WorkerSettings._renamed.items():
        fn = _renamed_option(old, new)(fn)
    return fn


def for_terminal(text: str) -> str:
    """A setting's help as a terminal shows it: click prints the text as written, so the
    reStructuredText the docs render (``concurrency``) becomes what a user types there: a
    setting's option (--concurrency), else the bare words."""
    options = {f.name for f in dataclasses.fields(WorkerSettings)}

    def plain(code: re.Match[str]) -> str:
        word = code[1]
        return "--" + word.replace("_", "-") if word in options else word

    return re.sub(r"``([^`]+)``", plain, text)


def _renamed_option(old: str, new: str) -> Callable[[F], F]:
    """A hidden option under an old name, which fails naming the new one."""
    flag, new_flag = "--" + old.replace("_", "-"), "--" + new.replace("_", "-")

    def refuse(ctx: click.Context, param: click.Parameter, value: object) -> None:
        if value is not None:
            raise click.UsageError(f"{flag} is called {new_flag} now")

    return click.option(flag, hidden=True, expose_value=False, callback=refuse)


def explicit_settings(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The settings the user gave; the rest keep the dataclass's defaults."""
    out = {}
    for field in dataclasses.fields(WorkerSettings):
        if ctx.get_parameter_source(field.name) != ParameterSource.DEFAULT:
            value = values[field.name]
            if field.name == "queues":
                value = tuple(q.strip() for q in value.split(",") if q.strip())
            out[field.name] = value
    return out


@click.command()
@app_argument(required=True)
@settings_options
@log_level_option
@connection_options
@click.pass_context
def worker(
    ctx: click.Context,
    /,
    app_spec: str,
    log_level: str,
    url: str | None,
    namespace: str | None,
    **values: Any,
) -> None:
    """Run a worker for APP (module:attribute, for example myapp.tasks:app) until SIGTERM or
    SIGINT. Its URL and namespace come from the app (TETHER_URL and TETHER_NAMESPACE where
    the app names none); --url and --namespace win over both.

    The first signal stops it gracefully (running tasks get --shutdown-grace seconds, the
    rest is handed back); a second one exits at once, and the lease hands what it held to
    other workers when it expires."""
    from ..base._errors import ConfigError
    from ..worker import Worker

    setup_logging(log_level)
    app = open_app(app_spec, url, namespace)
    try:
        runner = Worker(app, WorkerSettings(**explicit_settings(ctx, values)))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    # A wrong password, a missing permission or (in burst mode, or past --give-up-after)
    # an unreachable server ends here with one line and exit status 1.
    asyncio.run(run_until_signalled(runner))


async def run_until_signalled(runner: Any, on_second: Callable[[], None] | None = None) -> None:
    """The CLI owns the process: SIGTERM or SIGINT stops the worker gracefully; a second
    signal exits at once (the lease then expires and other workers take over). The handlers
    are removed when the worker returns."""
    import signal

    loop = asyncio.get_running_loop()
    received: list[int] = []
    log = logging.getLogger("tether.worker")

    def exit_now() -> None:
        logging.shutdown()
        os._exit(130)

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        if len(received) > 1:
            log.warning("second %s: exiting at once; leftovers return when the lease expires",
                        sig.name)  # fmt: skip
            (on_second or exit_now)()
            return
        log.info("%s received: stopping gracefully (send it again to exit at once)", sig.name)
        runner.stop()

    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await runner.run()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
