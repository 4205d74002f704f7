"""The ``tether`` command: worker, demo, dead letters, schedules."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ._version import __version__

if TYPE_CHECKING:
    from ._app import Tether

F = TypeVar("F", bound=Callable[..., Any])


def load_app(spec: str) -> Tether:
    """Import ``module:attribute`` (or ``module``, looking for ``app``) and return the app."""
    from ._app import Tether

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


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def connection_options(fn: F) -> F:
    """--url and --namespace, applied through the environment before the app is imported."""
    fn = click.option(
        "--namespace", envvar="TETHER_NAMESPACE", help="Key namespace (TETHER_NAMESPACE)."
    )(fn)
    fn = click.option("--url", envvar="TETHER_URL", help="Redis URL (TETHER_URL).")(fn)
    return fn


def _apply_connection(url: str | None, namespace: str | None) -> None:
    if url:
        os.environ["TETHER_URL"] = url
    if namespace:
        os.environ["TETHER_NAMESPACE"] = namespace


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="tether")
def main() -> None:
    """Tether: a task queue on Redis Streams that loses no task and robs no live worker."""


@main.command()
@click.argument("app_spec", metavar="APP")
@click.option(
    "-q",
    "--queues",
    default="default",
    show_default=True,
    help="Comma-separated queues, read in this order.",
)
@click.option(
    "-c", "--concurrency", type=int, default=16, show_default=True, help="Tasks run at once."
)
@click.option(
    "--max-pending",
    type=int,
    default=None,
    help="Entries held unacknowledged (default: concurrency).",
)
@click.option("--name", default=None, help="Stable consumer name (for example the pod name).")
@click.option("--burst", is_flag=True, help="Exit once the queues hold nothing that is due.")
@click.option("--heartbeat-interval", type=float, default=2.0, show_default=True)
@click.option("--heartbeat-ttl", type=float, default=10.0, show_default=True)
@click.option("--reclaim-interval", type=float, default=1.0, show_default=True)
@click.option("--stall-timeout", type=float, default=120.0, show_default=True)
@click.option("--max-deliveries", type=int, default=3, show_default=True)
@click.option(
    "--reclaim-page-size",
    type=int,
    default=100,
    show_default=True,
    help="Pending entries examined per XPENDING page.",
)
@click.option(
    "--housekeeping-interval",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds between sweeps for dead consumers.",
)
@click.option(
    "--shutdown-grace",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds running tasks get after SIGTERM.",
)
@click.option(
    "--no-scheduler", is_flag=True, help="Do not run the periodic-task scheduler in this worker."
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@connection_options
def worker(
    app_spec: str,
    queues: str,
    concurrency: int,
    max_pending: int | None,
    name: str | None,
    burst: bool,
    heartbeat_interval: float,
    heartbeat_ttl: float,
    reclaim_interval: float,
    stall_timeout: float,
    max_deliveries: int,
    reclaim_page_size: int,
    housekeeping_interval: float,
    shutdown_grace: float,
    no_scheduler: bool,
    log_level: str,
    url: str | None,
    namespace: str | None,
) -> None:
    """Run a worker for APP (module:attribute) until SIGTERM or SIGINT."""
    from ._errors import ConfigError, ServerError
    from ._settings import WorkerSettings
    from .worker import Worker

    _setup_logging(log_level)
    _apply_connection(url, namespace)
    app = load_app(app_spec)
    try:
        settings = WorkerSettings(
            queues=tuple(q.strip() for q in queues.split(",") if q.strip()),
            concurrency=concurrency,
            max_pending=max_pending,
            name=name,
            burst=burst,
            heartbeat_interval=heartbeat_interval,
            heartbeat_ttl=heartbeat_ttl,
            reclaim_interval=reclaim_interval,
            stall_timeout=stall_timeout,
            max_deliveries=max_deliveries,
            reclaim_page_size=reclaim_page_size,
            housekeeping_interval=housekeeping_interval,
            shutdown_grace=shutdown_grace,
            scheduler=not no_scheduler,
        )
        runner = Worker(app, settings)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        asyncio.run(_run_until_signalled(runner))
    except ServerError as exc:
        raise click.ClickException(str(exc)) from None


async def _run_until_signalled(runner: Any) -> None:
    """The CLI owns the process: SIGTERM or SIGINT stops the worker gracefully; a second
    signal exits at once (the lease then expires and other workers take over)."""
    import signal

    loop = asyncio.get_running_loop()
    received: list[int] = []
    log = logging.getLogger("tether.worker")

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        if len(received) > 1:
            log.warning("second %s: exiting at once; leftovers return when the lease expires",
                        sig.name)  # fmt: skip
            logging.shutdown()
            os._exit(130)
        log.info("%s received: stopping gracefully (send it again to exit at once)", sig.name)
        runner.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await runner.run()


@main.command()
@click.option("--url", envvar="TETHER_URL", help="Use this server instead of an embedded one.")
@click.option(
    "--workers", type=int, default=2, show_default=True, help="Worker processes to start."
)
@click.option("--tasks", type=int, default=5000, show_default=True, help="Tasks to enqueue.")
@click.option(
    "--concurrency", type=int, default=32, show_default=True, help="Concurrency per worker."
)
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Give up after this many seconds.",
)
def demo(url: str | None, workers: int, tasks: int, concurrency: int, timeout: float) -> None:
    """Start a server (embedded unless --url), workers, and a batch of tasks; print the rate."""
    from .demo import run_demo

    if workers < 1 or tasks < 1 or concurrency < 1:
        raise click.UsageError("--workers, --tasks and --concurrency must be 1 or more")
    sys.exit(
        run_demo(url=url, workers=workers, tasks=tasks, concurrency=concurrency, timeout=timeout)
    )


def _register_optional_commands() -> None:
    from .cli_admin import dead, scheduler, schedules, task

    main.add_command(dead)
    main.add_command(schedules)
    main.add_command(scheduler)
    main.add_command(task)


_register_optional_commands()
